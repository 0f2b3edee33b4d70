"""What both integrations share: building a text compressor and its budget from plain options."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from compressor.base import Budget, CompressedContext, Compressor, Passage, TokenCounter
from compressor.errors import InputError
from compressor.registry import get_compressor, get_spec

__all__ = ["RagpressFields", "text_compressor", "budget_of", "to_passage"]


def text_compressor(method: str, tokenizer: str, counter: TokenCounter | None,
                    options: dict[str, Any] | None) -> Compressor:
    """The registered text method ``method``, counting tokens with ``counter`` or ``tokenizer``'s."""
    if get_spec(method).kind != "text":  # unknown names raise first, listing the registered ones
        raise InputError(f"method {method!r} produces soft prompts; the LangChain and LlamaIndex integrations "
                         "pass text on, so use a text method")
    if counter is None:
        from compressor.models import load_tokenizer

        counter = TokenCounter.from_tokenizer(load_tokenizer(tokenizer))
    return get_compressor(method, counter=counter, **(options or {}))


def budget_of(ratio: float | None, target_tokens: int | None) -> Budget:
    try:
        return Budget(ratio=ratio, target_tokens=target_tokens)
    except ValueError as e:
        raise InputError(f"budget is invalid: {e}") from None


def to_passage(text: str, metadata: dict[str, Any], title_key: str | None, index: int) -> Passage:
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"document {index} has no text; drop empty documents before compressing")
    title = metadata.get(title_key) if title_key else None
    return Passage(text=text, title=str(title) if title is not None else None)


class RagpressFields(BaseModel):
    """The options both integrations take, and the compressor they build from them after validation (so
    ragpress' own errors, unknown method or bad budget, come out as they are)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    method: str = Field(default="bm25", description="A registered text method.")
    ratio: float | None = Field(default=None, description="tokens in / tokens out; None: the method's default.")
    target_tokens: int | None = Field(default=None, description="Keep at most this many tokens in all.")
    tokenizer: str = Field(default="smollm2-135m-instruct", description="Whose tokens the budget counts.")
    title_key: str | None = Field(default="title", description="Metadata key shown as the document title.")
    options: dict[str, Any] = Field(default_factory=dict, description="Method options (e.g. artifact=...).")
    counter: TokenCounter | None = Field(default=None, exclude=True, description="Overrides tokenizer.")
    compressor: Compressor | None = Field(default=None, exclude=True, description="A built compressor to use.")
    _last: CompressedContext | None = PrivateAttr(default=None)
    _budget: Budget = PrivateAttr(default_factory=Budget)

    def _build(self) -> None:
        self._budget = budget_of(self.ratio, self.target_tokens)
        if self.compressor is None:
            self.compressor = text_compressor(self.method, self.tokenizer, self.counter, self.options)
        elif self.compressor.kind != "text":
            raise InputError(f"compressor {self.compressor.name!r} produces soft prompts; give a text method")

    @property
    def last_context(self) -> CompressedContext | None:
        return self._last
