"""The proxy's settings (``ragpress serve``'s options), importable without the ``serve`` extra."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from compressor.base import Budget

from .limits import InputLimits

__all__ = ["ProxySettings"]


class ProxySettings(BaseModel):
    """Everything ``ragpress serve`` takes. API keys are never logged or echoed."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="Interface to bind; 0.0.0.0 exposes it to the network.")
    port: int = Field(default=8000, ge=0, le=65535)
    method: str = Field(default="bm25", description="Default compression method: a text method, or a soft one "
                        "(icae) with the embedded decoder or --upstream-prompt-embeds.")
    ratio: float | None = Field(default=None, ge=1.0, le=1000.0, description="Default ratio; None: the method's.")
    target_tokens: int | None = Field(default=None, ge=1, description="Default document-token budget.")
    early_stop: bool | None = Field(default=None, description="Default early stop of sentence filters at their "
                                    "min_score (a request's compression.early_stop overrides it); unset: fill.")
    model: str = Field(default="smollm2-135m-instruct", description="In-process decoder (named or HF folder).")
    served_model_name: str | None = Field(default=None, description="Name clients use; default: model.")
    upstream: str | None = Field(default=None, description="Remote OpenAI base URL (…/v1); None: in-process.")
    upstream_api_key: str | None = Field(default=None, repr=False, description="Bearer key for the upstream.")
    upstream_prompt_embeds: bool = Field(default=False, description="The upstream is a vLLM server started with "
                                         "--enable-prompt-embeds serving --model: soft methods (icae) are served, "
                                         "their prompts sent as prompt_embeds on /v1/completions.")
    upstream_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="With upstream_prompt_embeds: the dtype the vLLM upstream runs (its "
        "--dtype); prompt embeddings are sent in it.")
    tokenizer: str | None = Field(default=None, description="Token-counting tokenizer; default: model's.")
    api_keys: list[str] = Field(default_factory=list, repr=False, description="Accepted bearer keys; empty: open.")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="Larger bodies get 413.")
    timeout_s: float = Field(default=120.0, gt=0, description="Upstream / generation timeout (504 after).")
    default_max_tokens: int = Field(default=256, ge=1, le=4096, description="In-process max_tokens default.")
    max_documents: int = Field(default=256, ge=1, le=100_000, description="Documents per request (400 over).")
    max_document_tokens: int = Field(default=32_768, ge=1, description="Document tokens per request (400 over).")
    batch_max_size: int = Field(default=8, ge=1, le=256, description="Concurrent requests compressed together in "
                                "one batch at most, and decoded together by the in-process decoder (1: no batching).")
    batch_max_wait_ms: float = Field(default=5.0, ge=0.0, le=1000.0, description="How long a request waits for "
                                     "others to batch with, at most (ms).")
    inspector: bool = Field(default=True, description="Serve the inspector page at /inspect (behind the same API "
                            "keys; --no-inspector turns it off).")
    cache_dir: str | None = Field(default=None, description="Per-passage cache of the cacheable methods "
                                  "(sentinel sentence embeddings, icae slots): a folder or an fsspec URL, filled "
                                  "ahead of time by `ragpress index` and by requests; proxy replicas may share it.")
    max_sentence_tokens: int = Field(default=4_096, ge=16, description="Longest sentence compressed (400 over).")

    @field_validator("upstream")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"upstream {v!r} must be an http:// or https:// URL such as http://127.0.0.1:8001/v1")
        return v

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        if any(not k.strip() for k in v):
            raise ValueError("an API key is blank; give non-empty keys")
        return v

    @model_validator(mode="after")
    def _one_budget(self) -> ProxySettings:
        if self.ratio is not None and self.target_tokens is not None:
            raise ValueError("give either ratio or target_tokens as the default budget, not both")
        if self.upstream_prompt_embeds and self.upstream is None:
            raise ValueError("upstream_prompt_embeds applies to a remote --upstream (a vLLM server); the embedded "
                             "decoder takes soft prompts already")
        return self

    def budget(self) -> Budget:
        return Budget(ratio=self.ratio, target_tokens=self.target_tokens, early_stop=self.early_stop)

    def limits(self) -> InputLimits:
        return InputLimits(max_documents=self.max_documents, max_document_tokens=self.max_document_tokens,
                           max_sentence_tokens=self.max_sentence_tokens)
