"""Configuration of the ``sentinel`` family (no torch import here)."""

from __future__ import annotations

from pydantic import Field

from ..filters.base import SentenceFilterConfig

__all__ = ["SentinelConfig", "FORMAT_VERSION"]

FORMAT_VERSION = 1


class SentinelConfig(SentenceFilterConfig):
    """Attention-probe options. ``layers`` is the early exit: only the first ``layers`` decoder layers of
    the proxy run (None = all); the shipped probe records the value chosen by measurement."""

    proxy: str = Field(default="smollm2-135m-instruct", description="Proxy causal LM: named model or HF folder.")
    layers: int | None = Field(default=None, ge=1, le=256, description="Early exit: proxy layers to run.")
    query_positions: int = Field(default=4, ge=1, le=64, description="Final prompt positions whose attention is read.")
    max_context_tokens: int = Field(default=8192, ge=16, description="Longest proxy prompt accepted.")
    dtype: str = Field(default="bfloat16", pattern="^(bfloat16|float32|float16)$", description="Proxy dtype.")
