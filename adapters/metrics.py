"""SQuAD-style answer normalisation, EM, F1, answer-contained accuracy, and evidence recall."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

from compressor.base import CompressedContext, Passage

__all__ = ["normalize_answer", "exact_match", "f1_score", "accuracy", "abstained", "abstention_rate", "evidence_recall"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze whitespace (the SQuAD script's normalisation)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(pred: str, golds: Sequence[str]) -> float:
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in golds)) if golds else float(not p)


def _f1(pred: str, gold: str) -> float:
    pt, gt = normalize_answer(pred).split(), normalize_answer(gold).split()
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(pt), same / len(gt)
    return 2 * prec * rec / (prec + rec)


def f1_score(pred: str, golds: Sequence[str]) -> float:
    return max((_f1(pred, g) for g in golds), default=float(not normalize_answer(pred)))


def accuracy(pred: str, golds: Sequence[str]) -> float:
    """1 if any normalised gold answer is contained in the normalised prediction."""
    p = f" {normalize_answer(pred)} "
    return float(any(f" {normalize_answer(g)} " in p for g in golds if normalize_answer(g)))


_ABSTAIN = re.compile(
    r"\b(unanswerable|no answer|not (?:be )?answerable|cannot be (?:answered|determined)|can ?not (?:answer|determine|"
    r"find|tell)|(?:do|does|did) not (?:say|mention|specify|state|contain|provide|include|know)|not (?:mentioned|"
    r"provided|specified|stated|given|available|enough information)|no (?:information|mention)|unknown|"
    r"i don'?t know|insufficient information)\b")


def abstained(pred: str) -> bool:
    """The prediction declines to answer (an empty reply, or a refusal phrase such as "unanswerable", "not
    mentioned", "the context does not say"). Used for SQuAD v2's unanswerable questions."""
    return not pred.strip() or bool(_ABSTAIN.search(pred.lower().replace("\u2019", "'")))


def abstention_rate(records: Sequence[dict]) -> float | None:
    """Share of the unanswerable questions (no gold answer) whose prediction abstained; None without any."""
    flags = [float(r["abstained"]) for r in records if not r["answers"] and "abstained" in r]
    return sum(flags) / len(flags) if flags else None


def evidence_recall(ctx: CompressedContext, passages: Sequence[Passage], min_cover: float = 0.9) -> float | None:
    """Share of labelled evidence spans still present: a span counts when at least ``min_cover`` of its
    non-space characters lie inside kept spans. None when the data labels no evidence. Soft contexts keep
    every passage they encode; dropped passages lose their evidence."""
    total, kept = 0, 0
    by_index = {p.index: p for p in ctx.passages}
    # A repeat the compressor merged into its first copy counts as kept where that copy's text was kept.
    merged = " ".join(" ".join((cp.text or "").split()) for cp in ctx.passages) \
        if ctx.duplicates or ctx.duplicate_sentences else None
    for i, p in enumerate(passages):
        for s, e in p.evidence or ():
            total += 1
            cp = by_index.get(i)
            if cp is None:
                kept += merged is not None and " ".join(p.text[s:e].split()) in merged
                continue
            if ctx.kind == "soft" and not cp.spans:  # slots of a whole passage (a composition keeps its spans)
                kept += 1
                continue
            chars = [k for k in range(s, e) if not p.text[k].isspace()]
            inside = sum(1 for k in chars if any(a <= k < b for a, b in cp.spans))
            if chars and inside / len(chars) >= min_cover:
                kept += 1
            elif merged is not None and " ".join(p.text[s:e].split()) in merged:
                kept += 1
    return kept / total if total else None
