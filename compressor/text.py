"""Sentence splitting with exact character spans (pysbd), shared by every text method."""

from __future__ import annotations

import functools
import re

__all__ = ["split_sentences"]

_WS = re.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=True)


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Split ``text`` into sentences; return ``[start, end)`` spans that cover every non-space character
    exactly once, in order, with surrounding whitespace excluded. ``text[s:e]`` is the sentence."""
    if not text.strip():
        return []
    spans: list[tuple[int, int]] = []
    pos = 0
    for seg in _segmenter().segment(text):
        sent = seg.sent if hasattr(seg, "sent") else str(seg)
        core = sent.strip()
        if not core:
            continue
        start = text.find(core, pos)
        if start < 0:  # pysbd altered the text; fall back to the remaining text as one sentence
            break
        spans.append((start, start + len(core)))
        pos = start + len(core)
    rest = text[pos:]
    if rest.strip():
        lead = len(rest) - len(rest.lstrip())
        spans.append((pos + lead, pos + len(rest.rstrip())))
    return spans
