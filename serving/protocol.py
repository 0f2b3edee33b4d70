"""Wire models of the OpenAI-compatible proxy.

OpenAI's own fields are lenient (``extra="allow"``): fields this proxy does not know pass through to a remote
upstream unchanged. Our extension fields, ``documents`` and ``compression``, are strict (``extra="forbid"``):
a typo there is a 400, not a silently ignored option. Every error leaves as :class:`ErrorResponse`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from compressor.explain import Explanation

__all__ = [
    "Document",
    "CompressionOptions",
    "ChatMessage",
    "StreamOptions",
    "ChatCompletionRequest",
    "CompletionRequest",
    "CompressionInfo",
    "InspectRequest",
    "Usage",
    "ErrorInfo",
    "ErrorResponse",
    "ProxyError",
    "EXTENSION_FIELDS",
    "new_id",
]

EXTENSION_FIELDS = ("documents", "compression")


class Document(BaseModel):
    """One retrieved document given in the request body (``extra_body={"documents": [...]}``)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, description="Caller-side id, carried through.")
    title: str | None = Field(default=None, description="Shown before the text as 'title: text'.")
    text: str = Field(description="The document body; must not be blank.")


class CompressionOptions(BaseModel):
    """Per-request compression settings; unset fields take the server's defaults."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="false: documents pass through uncompressed.")
    method: str | None = Field(default=None, description="A registered method: a text method, or a soft one "
                               "(icae) where the upstream takes embeddings (the embedded decoder, or a vLLM "
                               "upstream with prompt embeddings).")
    ratio: float | None = Field(default=None, ge=1.0, le=1000.0, description="tokens in / tokens out, 1..1000.")
    target_tokens: int | None = Field(default=None, ge=1, description="Keep at most this many document tokens.")
    early_stop: bool | None = Field(default=None, description="Sentence filters with a min_score (sentinel's 1.5, "
                                    "tuned for 135M-270M decoders): stop below it, keeping less than the budget. "
                                    "Unset: the server's default, which fills the budget.")
    strict: bool | None = Field(default=None, description="true: ratio / target_tokens is a hard cap, and a method "
                                "that cannot get under it is a 400 naming the ratio it reaches; unset or false: a "
                                "target, rounded to the method's granularity and reported (stopped_by).")
    explain: bool = Field(default=False, description="true: the response's compression block carries "
                          "'explanation', per document and sentence what was kept and why (span, score, kept, "
                          "reason, tokens; soft methods: slots and ratio).")

    @model_validator(mode="after")
    def _one_budget(self) -> CompressionOptions:
        if self.ratio is not None and self.target_tokens is not None:
            raise ValueError("give compression.ratio or compression.target_tokens, not both")
        return self


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessage(_Lenient):
    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(_Lenient):
    include_usage: bool = False


class _Sampling(_Lenient):
    """Fields both endpoints share. Unknown OpenAI fields are kept (``model_extra``) and passed on."""

    model: str = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1, description="A 64-bit signed integer.")
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    documents: list[str | Document] | None = Field(default=None, description="ragpress extension.")
    compression: CompressionOptions | None = Field(default=None, description="ragpress extension.")

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def upstream_body(self, **replace: Any) -> dict[str, Any]:
        """The body to forward: every field the client sent, minus our extensions, with ``replace`` applied."""
        body = self.model_dump(exclude_unset=True, exclude=set(EXTENSION_FIELDS))
        body.update(replace)
        return body


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for /v1/completions

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens


class CompressionInfo(BaseModel):
    """The ``compression`` block added beside ``usage`` in every response (and to the first stream chunk)."""

    method: str
    enabled: bool
    documents: int = Field(description="Documents found: in the body and marked in messages.")
    tokens_before: int = Field(description="Document tokens before compression, in the counting tokenizer.")
    tokens_after: int
    ratio: float | None = Field(description="tokens_before / tokens_after, reached; null when nothing is left.")
    asked_ratio: float | None = Field(default=None, description="The ratio the budget asked for (target_tokens as "
                                      "tokens_before / target_tokens); null: the method's default.")
    kind: Literal["text", "soft"] = Field(default="text", description="soft: tokens_after counts memory slots, "
                                          "sent to the decoder as embeddings, not text.")
    compression_ms: float
    stopped_by: str | None = Field(default=None, description="Why the reached ratio is what it is: 'budget', "
                                   "'min_score' (early stop), 'threshold', 'input' (everything fit), 'granularity' "
                                   "(the least the method keeps is over the target) or 'passed_through' (passages "
                                   "went as text); comma-separated when a completion request has several prompts; "
                                   "null when nothing was compressed.")
    duplicates: int = Field(default=0, description="Documents merged into an earlier identical one (kept once).")
    duplicate_sentences: int = Field(default=0, description="Sentences dropped as repeats of an earlier "
                                     "document's (overlapping chunks).")
    explanation: list[Explanation | None] | None = Field(
        default=None, description="Only when the request asked compression.explain: per prompt (one for chat; null "
        "for a prompt without documents), per document in the order found (body documents first, then marked ones) and per sentence, what was kept and "
        "why (compressor.explain).")


class InspectRequest(BaseModel):
    """What the inspector page posts to ``/inspect/compress``: compress only, no decoding; the answer comes back
    with its ``explanation``."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, description="The question the documents are compressed against.")
    documents: list[str | Document] = Field(min_length=1, description="The passages, as in the body extension.")
    compression: CompressionOptions | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class ProxyError(Exception):
    """An error with its HTTP status, leaving the proxy as an :class:`ErrorResponse`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", *,
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)

    def body(self) -> dict[str, Any]:
        return ErrorResponse(error=self.info).model_dump()


def new_id(kind: Literal["chat", "completion"]) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def now() -> int:
    return int(time.time())
