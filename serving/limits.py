"""What the proxy accepts: checks that run before any document reaches a compressor.

Two layers, both answering 400s that name the field and the fix:

* :func:`check_json` on every request body, before the wire models see it: nesting deeper than
  :data:`MAX_JSON_DEPTH` and unpaired UTF-16 surrogates (``"\\ud800"`` is valid JSON, but no UTF-8 text, so
  no tokenizer and no upstream can take it).
* :func:`check_documents` on the documents of a request (body and ``<document>`` blocks): at most
  ``max_documents`` of them and ``max_document_tokens`` tokens together, whether or not they are compressed
  (these bound the work one request can cause); when they are compressed, no control characters other than
  whitespace and no sentence over ``max_sentence_tokens`` (a sentence filter keeps or drops whole sentences).

A budget at or above the documents' size is not an error: everything is kept (documented pass-through).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from compressor.base import TokenCounter
from compressor.text import split_sentences

from .documents import ExtractedDocs
from .protocol import ProxyError

__all__ = ["MAX_JSON_DEPTH", "InputLimits", "check_json", "check_documents"]

MAX_JSON_DEPTH = 64
# C0 and C1 control characters except the whitespace ones (\t \n \v \f \r and NEL, U+0085).
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class InputLimits(BaseModel):
    """Per-request limits on documents (``ragpress serve --max-documents/--max-document-tokens/...``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_documents: int = Field(default=256, ge=1, le=100_000, description="Documents per request, body and marked.")
    max_document_tokens: int = Field(default=32_768, ge=1, description="Document tokens per request, all together.")
    max_sentence_tokens: int = Field(default=4_096, ge=16, description="Longest sentence a filter scores.")


def _path(parts: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in parts) or "body"


def check_json(data: Any) -> None:
    """Refuse bodies nested deeper than :data:`MAX_JSON_DEPTH` or holding unpaired surrogates (keys too)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        value, where = stack.pop()
        if len(where) > MAX_JSON_DEPTH:
            raise ProxyError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels (at "
                             f"{_path(where[:8])}...); flatten it", code="invalid_json")
        if isinstance(value, str):
            _no_surrogate(value, where)
        elif isinstance(value, dict):
            for k, v in value.items():
                _no_surrogate(k, where + ("<key>",))
                stack.append((v, where + (k,)))
        elif isinstance(value, list):
            stack.extend((v, where + (i,)) for i, v in enumerate(value))


def _no_surrogate(text: str, where: tuple[Any, ...]) -> None:
    m = _SURROGATE.search(text)
    if m:
        raise ProxyError(400, f"{_path(where)} holds an unpaired UTF-16 surrogate (\\u{ord(m.group()):04x}) at "
                         f"character {m.start()}, which is not text; send valid Unicode (escape pairs "
                         "together, or plain UTF-8)", param=_path(where), code="invalid_encoding")


def check_documents(docs: ExtractedDocs, counter: TokenCounter, limits: InputLimits, compressing: bool) -> list[int]:
    """Check the documents of one request; return their token counts (in ``docs.passages`` order)."""
    n = len(docs)
    if n > limits.max_documents:
        raise ProxyError(400, f"the request has {n} documents; this proxy takes at most {limits.max_documents} "
                         "per request (--max-documents): send fewer, or merge short ones", param="documents",
                         code="too_many_documents")
    labels = docs.labels()
    passages = docs.passages
    if compressing:
        for label, p in zip(labels, passages):
            for field, text in (("text", p.text), ("title", p.title or "")):
                m = _CONTROL.search(text)
                if m:
                    raise ProxyError(400, f"{label} {field} holds the control character U+{ord(m.group()):04X} at "
                                     f"character {m.start()}; remove it (binary data or a broken decode?). "
                                     "Tabs and line breaks are fine.", param="documents", code="invalid_text")
    counts, total = [], 0
    for label, p in zip(labels, passages):
        c = counter.count(p.text)
        counts.append(c)
        total += c
        if total > limits.max_document_tokens:
            raise ProxyError(400, f"the documents hold more than {limits.max_document_tokens} tokens (reached at "
                             f"{label}); this proxy compresses at most that many per request "
                             "(--max-document-tokens): send fewer or shorter documents", param="documents",
                             code="documents_too_long")
    if compressing:
        for label, p, c in zip(labels, passages, counts):
            if c > limits.max_sentence_tokens:
                _check_sentences(label, p.text, counter, limits.max_sentence_tokens)
    return counts


def _check_sentences(label: str, text: str, counter: TokenCounter, limit: int) -> None:
    for s, e in split_sentences(text):
        if len(text[s:e].encode()) + 1 <= limit:  # never more tokens than UTF-8 bytes (+ one for a prefix)
            continue
        c = counter.count(text[s:e])
        if c > limit:
            raise ProxyError(400, f"{label} has a sentence of {c} tokens (characters {s}-{e}), over the "
                             f"{limit} a sentence filter scores at once (--max-sentence-tokens); break it up "
                             "with sentence punctuation or line breaks, or send it with "
                             "compression.enabled false", param="documents", code="sentence_too_long")
