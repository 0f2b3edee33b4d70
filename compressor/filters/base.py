"""Shared machinery of every sentence filter (``bm25``, ``minilm``, ``sentinel``)."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..base import Budget, CompressedPassage, Compressor, Passage, TokenCounter
from ..errors import InputError
from ..text import split_sentences, title_core, title_mentions

__all__ = ["SentenceFilterConfig", "SentenceFilter", "Sentence", "select_within_budget", "passage_links"]


class SentenceFilterConfig(BaseModel):
    """Options common to sentence filters."""

    model_config = ConfigDict(extra="forbid")

    default_ratio: float = Field(default=5.0, ge=1.0, le=1000.0, description="Ratio used when no budget is given.")
    title_in_score: bool = Field(default=True, description="Prefix the passage title when scoring a sentence.")
    min_score: float | None = Field(
        default=None, description="When compressing, drop sentences scoring below this even if the budget has room "
        "(the best sentence is always kept); a budget's own threshold replaces it; None fills the budget.")
    complete_links: bool = Field(
        default=False, description="Multi-hop completion: when a kept sentence names another passage by its title "
        "(whole words, case-insensitive, a trailing '(qualifier)' dropped; passages with the sentence's own title "
        "excepted) and nothing of that passage is kept yet, that passage's best sentence that fits is kept next, "
        "whatever its score: a bridge question's second hop rarely shares words with the question.")


@dataclass(frozen=True)
class Sentence:
    passage: int
    index: int  # sentence index within its passage
    start: int
    end: int
    text: str
    tokens: int


def select_within_budget(scores: np.ndarray, costs: list[int], max_tokens: int | None,
                         threshold: float | None = None, min_keep: int = 0, owner: list[int] | None = None,
                         links: list[list[int]] | None = None) -> list[int]:
    """Indices (ascending) of the sentences to keep: best score first while the summed cost fits
    ``max_tokens``; with ``threshold`` only sentences scoring at least that, except that the best ``min_keep``
    sentences that fit are kept whatever their score. Ties keep the earlier one.

    ``links[i]`` (with ``owner[i]``, the passage of sentence i): the passages sentence i names. Right after
    sentence i is kept in rank order, each named passage with nothing kept yet gets its best sentence that fits,
    whatever its score (see ``SentenceFilterConfig.complete_links``). Completion is one hop: the links of a
    sentence kept by completion are not followed, even when its own rank comes up later, so one strong sentence
    cannot pull in a chain of passages."""
    n = len(scores)
    if len(costs) != n or (owner is not None and len(owner) != n) or \
            (links is not None and (owner is None or len(links) != n)):
        raise InputError(f"select_within_budget: {n} scores, {len(costs)} costs, owner "
                         f"{None if owner is None else len(owner)}, links {None if links is None else len(links)}; "
                         "give one of each per sentence (owner is required with links)")
    order = sorted(range(n), key=lambda i: (-float(scores[i]), i))
    kept: set[int] = set()
    passages_kept: set[int] = set()
    used = 0

    def take(i: int) -> bool:
        nonlocal used
        if i in kept or (max_tokens is not None and used + costs[i] > max_tokens):
            return False
        kept.add(i)
        used += costs[i]
        if owner is not None:
            passages_kept.add(owner[i])
        return True

    by_passage: dict[int, list[int]] = {}
    if links is not None:
        for i in order:
            by_passage.setdefault(owner[i], []).append(i)  # type: ignore[index]
    for i in order:
        if threshold is not None and scores[i] < threshold and len(kept) >= min_keep:
            break
        if not take(i):
            continue  # a shorter, lower-ranked sentence may still fit
        for b in (links[i] if links is not None else ()):
            if b not in passages_kept:
                for j in by_passage.get(b, ()):  # best first: the first that fits
                    if take(j):
                        break
    return sorted(kept)


def passage_links(passages: list[Passage], sentences: list[Sentence]) -> list[list[int]]:
    """Per sentence, the other passages it names by title (:func:`~compressor.text.title_mentions`), leaving out
    passages whose title is the sentence's own passage's (SQuAD-style contexts share one article title)."""
    if not sentences:
        return []
    names = title_mentions([p.title for p in passages], [s.text for s in sentences])
    core = [(title_core(p.title) or "").casefold() for p in passages]
    return [[int(b) for b in np.nonzero(row)[0] if core[b] != core[s.passage]]
            for s, row in zip(sentences, names)]


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
        links = dict(owner=[s.passage for s in sents], links=passage_links(passages, sents)) \
            if self.config.complete_links else {}
        if budget.threshold is not None or self.config.min_score is None:
            keep = select_within_budget(scores, costs, max_tokens, budget.threshold, **links)
        else:
            keep = select_within_budget(scores, costs, max_tokens, self.config.min_score, min_keep=1, **links)
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
            # Tokenizer merges across the joining space: drop the weakest until it fits (a sentence kept by link
            # completion is usually the weakest, and is not replaced by a shorter one of its passage).
            if total > max_tokens:
                weakest = min(keep, key=lambda i: (float(scores[i]), -i))
                return self._assemble(passages, sents, [i for i in keep if i != weakest], scores, max_tokens)
        return out
