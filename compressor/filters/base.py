"""Shared machinery of every sentence filter (``bm25``, ``minilm``, ``sentinel``)."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..base import Budget, CompressedPassage, Compressor, Passage, TokenCounter
from ..text import split_sentences

__all__ = ["SentenceFilterConfig", "SentenceFilter", "Sentence", "select_within_budget"]


class SentenceFilterConfig(BaseModel):
    """Options common to sentence filters."""

    model_config = ConfigDict(extra="forbid")

    default_ratio: float = Field(default=5.0, ge=1.0, le=1000.0, description="Ratio used when no budget is given.")
    title_in_score: bool = Field(default=True, description="Prefix the passage title when scoring a sentence.")
    min_score: float | None = Field(
        default=None, description="When compressing, drop sentences scoring below this even if the budget has room "
        "(the best sentence is always kept); a budget's own threshold replaces it; None fills the budget.")


@dataclass(frozen=True)
class Sentence:
    passage: int
    index: int  # sentence index within its passage
    start: int
    end: int
    text: str
    tokens: int


def select_within_budget(scores: np.ndarray, costs: list[int], max_tokens: int | None,
                         threshold: float | None = None, min_keep: int = 0) -> list[int]:
    """Indices (ascending) of the sentences to keep: best score first while the summed cost fits
    ``max_tokens``; with ``threshold`` only sentences scoring at least that, except that the best ``min_keep``
    sentences that fit are kept whatever their score. Ties keep the earlier one."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    kept, used = [], 0
    for i in order:
        if threshold is not None and scores[i] < threshold and len(kept) >= min_keep:
            break
        if max_tokens is not None and used + costs[i] > max_tokens:
            continue  # a shorter, lower-ranked sentence may still fit
        kept.append(i)
        used += costs[i]
    return sorted(kept)


class SentenceFilter(Compressor):
    """Base of the sentence filters: subclasses implement :meth:`score_sentences`."""

    kind = "text"
    config: SentenceFilterConfig

    def __init__(self, counter: TokenCounter, config: SentenceFilterConfig | None = None) -> None:
        super().__init__(counter)
        self.config = config or SentenceFilterConfig()

    def sentences(self, passages: list[Passage]) -> list[Sentence]:
        out = []
        for pi, p in enumerate(passages):
            for si, (s, e) in enumerate(split_sentences(p.text)):
                t = p.text[s:e]
                out.append(Sentence(pi, si, s, e, t, self.counter.count(t)))
        return out

    @abstractmethod
    def score_sentences(self, query: str, passages: list[Passage], sentences: list[Sentence]) -> np.ndarray:
        """One relevance score per sentence (higher keeps first)."""

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> list[CompressedPassage]:
        sents = self.sentences(passages)
        tokens_in = sum(self.counter.count(p.text) for p in passages)
        if budget.ratio is None and budget.target_tokens is None and budget.threshold is None:
            budget = Budget(ratio=self.config.default_ratio)
        max_tokens = budget.max_tokens(tokens_in)
        if max_tokens is not None and max_tokens >= tokens_in and budget.threshold is None:
            return self._verbatim(passages, sents)  # documented no-op: the budget holds the whole input
        scores = np.asarray(self.score_sentences(query, passages, sents), dtype=np.float64)
        # Reserve one token per kept sentence for the joining space so the joined text fits too.
        costs = [s.tokens + 1 for s in sents]
        if budget.threshold is not None or self.config.min_score is None:
            keep = select_within_budget(scores, costs, max_tokens, budget.threshold)
        else:
            keep = select_within_budget(scores, costs, max_tokens, self.config.min_score, min_keep=1)
        return self._assemble(passages, sents, keep, scores, max_tokens)

    def _verbatim(self, passages: list[Passage], sents: list[Sentence]) -> list[CompressedPassage]:
        """Every sentence kept, as the passage has them: one span from the first sentence to the last. Joining
        the sentences with spaces instead could take more tokens than the input (a newline and a space
        tokenize differently), over a budget that holds the whole input."""
        by_p: dict[int, list[Sentence]] = {}
        for s in sents:
            by_p.setdefault(s.passage, []).append(s)
        out = []
        for pi in sorted(by_p):
            ss, p = by_p[pi], passages[pi]
            text = p.text[ss[0].start: ss[-1].end]
            out.append(CompressedPassage(
                index=pi, title=p.title, text=text, spans=[(ss[0].start, ss[-1].end)],
                sentence_ids=[s.index for s in ss], scores=[0.0] * len(ss),
                tokens_in=self.counter.count(p.text), tokens_out=self.counter.count(text),
            ))
        return out

    def _assemble(self, passages, sents, keep, scores, max_tokens) -> list[CompressedPassage]:
        by_p: dict[int, list[int]] = {}
        for i in keep:
            by_p.setdefault(sents[i].passage, []).append(i)
        out = []
        for pi in sorted(by_p):
            idx = by_p[pi]
            text = " ".join(sents[i].text for i in idx)
            out.append(CompressedPassage(
                index=pi, title=passages[pi].title, text=text,
                spans=[(sents[i].start, sents[i].end) for i in idx],
                sentence_ids=[sents[i].index for i in idx], scores=[float(scores[i]) for i in idx],
                tokens_in=self.counter.count(passages[pi].text), tokens_out=self.counter.count(text),
            ))
        if max_tokens is not None and keep:
            total = sum(p.tokens_out for p in out)
            if total > max_tokens:  # tokenizer merges across the joining space: drop the weakest until it fits
                weakest = min(keep, key=lambda i: (float(scores[i]), -i))
                return self._assemble(passages, sents, [i for i in keep if i != weakest], scores, max_tokens)
        return out
