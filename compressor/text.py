"""Sentence splitting with exact character spans (pysbd), and passage-title mentions, shared by every text
method."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["split_sentences", "title_core", "title_pattern", "title_mentions", "refers_back"]

_WS = re.compile(r"\s+")
_TRAILING_WS = re.compile(r"\s*")


@functools.lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=True)


def _pysbd_sentences(text: str) -> list[str]:
    """What ``pysbd.Segmenter(clean=False).segment(text)`` returns (each sentence with its trailing
    whitespace, as it stands in ``text``), in linear time. pysbd finds every sentence again with a regex scan
    from the start of the text, quadratic in the number of sentences (40,000 characters of "Ab. " took 13 s);
    this searches from where the previous sentence ended instead. A match starting earlier than
    ``prior - len(sent) + 1`` ends at or before ``prior`` (its whitespace run stops at the non-space character
    there), and pysbd skips those, so the first match from that point is the one pysbd takes."""
    out, prior = [], 0
    for sent in _segmenter().processor(text).process():
        if not sent:
            continue
        start = text.find(sent, max(0, prior - len(sent) + 1))
        if start < 0:  # pysbd altered this sentence; pysbd's own scan finds no span for it either
            continue
        prior = _TRAILING_WS.match(text, start + len(sent)).end()
        out.append(text[start:prior])
    return out


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Split ``text`` into sentences; return ``[start, end)`` spans that cover every non-space character
    exactly once, in order, with surrounding whitespace excluded. ``text[s:e]`` is the sentence. A pure function
    of the text, memoised (the same passages come back with every question that retrieves them)."""
    if not text.strip():
        return []
    return list(_split_memo(text))


@functools.lru_cache(maxsize=32768)
def _split_memo(text: str) -> tuple[tuple[int, int], ...]:
    return tuple(_spans_of(text, _pysbd_sentences(text)))


def _spans_of(text: str, sentences: list[str]) -> list[tuple[int, int]]:
    """Map sentence strings back to stripped ``[start, end)`` spans of ``text``, in order; whatever follows the
    last sentence found (or a sentence the splitter altered) becomes one last span."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for sent in sentences:
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


def title_core(title: str | None) -> str | None:
    """The title without a trailing parenthesised qualifier ("Coco (film)" -> "Coco"); None when under 3
    characters (too short to name anything reliably). A comma qualifier stays: "New Durham, New Hampshire" is
    named only in full."""
    t = re.sub(r"\s*\([^()]*\)\s*$", "", title or "").strip()
    return t if len(t) >= 3 else None


def title_pattern(title: str | None) -> re.Pattern[str] | None:
    """A whole-word, case-insensitive pattern of :func:`title_core` ("Coco (film)" matches "coco", not
    "cocoa"); None for a title too short to name anything reliably."""
    t = title_core(title)
    return re.compile(r"(?<!\w)" + re.escape(t) + r"(?!\w)", re.IGNORECASE) if t else None


_FOLDS_TO_ASCII = "\u0131\u017f\u212a\u0130"  # ı ſ K İ: case-insensitive regexes match them to i s k i


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"  # what re's \w matches in a str pattern


def title_mentions(titles: list[str | None], texts: list[str], owner: Sequence[int] | None = None) -> np.ndarray:
    """``[len(texts), len(titles)]`` bool: does text i name title b, as :func:`title_pattern` matches it. With
    ``owner`` (the passage each text belongs to) a text never names its own passage: ``[i, owner[i]]`` is False.

    A case-folded substring search with the word-boundary check done by hand, over the joined texts (a NUL
    between them, which \\w does not match): a regex with a look-behind tried at every position of the
    text was 0.7 ms per title at 100 passages. The regex is used instead where ``lower()`` and the regex's case
    folding could disagree: a non-ASCII title, text that lower-casing lengthens, or text holding a character
    the regex folds onto an ASCII letter (dotless i, long s, Kelvin sign)."""
    out = np.zeros((len(texts), len(titles)), dtype=bool)
    if not texts:
        return out
    joined = "\0".join(texts)
    low = joined.lower()
    plain = len(low) == len(joined) and not any(c in joined for c in _FOLDS_TO_ASCII)
    starts = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
    for b, title in enumerate(titles):
        core = title_core(title)
        if core is None:
            continue
        needle = core.lower()
        if plain and core.isascii():
            hits, i = [], low.find(needle)
            while i >= 0:
                j = i + len(needle)
                if (i == 0 or not _is_word(low[i - 1])) and (j == len(low) or not _is_word(low[j])):
                    hits.append(i)
                i = low.find(needle, i + 1)
        else:
            hits = [m.start() for m in title_pattern(title).finditer(joined)]  # type: ignore[union-attr]
        if hits:
            out[np.searchsorted(starts, hits, side="right") - 1, b] = True
    if owner is not None:
        out[np.arange(len(texts)), np.asarray(owner, dtype=np.int64)] = False
    return out


# A sentence that opens with a pronoun or a definite description ("The company", "the film") usually names its
# subject only through the sentence before it: "Ana lives in Lisbon. She has a cat named Tux."
_BACK_REFERENCE = re.compile(
    r"^[\"'“‘(\[]*(?:(?:he|she|it|they|his|her|its|their|them|this|these|those|such|both)\b"
    r"|the\s+(?:latter|former|same|[a-z][a-z-]*\b))", re.IGNORECASE)
_LOWER_AFTER_THE = re.compile(r"^[\"'“‘(\[]*the\s+(?!latter|former|same)(\S)", re.IGNORECASE)


def refers_back(sentence: str) -> bool:
    """Whether ``sentence`` opens with a back-reference to the one before it: a personal or demonstrative
    pronoun (He, It, They, Their, This, ...) or a definite description with a common noun ("The company", not
    "The Beatles")."""
    s = sentence.lstrip()
    if not _BACK_REFERENCE.match(s):
        return False
    m = _LOWER_AFTER_THE.match(s)
    return m is None or m.group(1).islower()

