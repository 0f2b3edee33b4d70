"""What both integrations share: building a text compressor and its budget from plain options."""

from __future__ import annotations

from typing import Any

from compressor.base import Budget, Compressor, Passage, TokenCounter
from compressor.errors import InputError
from compressor.registry import get_compressor, get_spec

__all__ = ["text_compressor", "budget_of", "to_passage"]


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
