"""Shared machinery of every sentence filter (``bm25``, ``minilm``, ``sentinel``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..base import Budget, CompressedContext, CompressedPassage, Compressor, Kept, Passage, TokenCounter
from ..errors import InputError
from ..explain import Explanation, PassageExplanation, SentenceExplanation
from ..text import refers_back, split_sentences, title_core, title_mentions

__all__ = ["SentenceFilterConfig", "SentenceFilter", "Sentence", "select_sentences", "select_within_budget",
           "passage_links", "merge_repeats"]


class SentenceFilterConfig(BaseModel):
    """Options common to sentence filters."""

    model_config = ConfigDict(extra="forbid")

    default_ratio: float = Field(default=5.0, ge=1.0, le=1000.0, description="Ratio used when no budget is given.")
    title_in_score: bool = Field(default=True, description="Prefix the passage title when scoring a sentence.")
    min_score: float | None = Field(
        default=None, description="The early stop's score: with early_stop on, sentences scoring below it are "
        "dropped even if the budget has room (the best sentence is always kept); a budget's own threshold replaces "
        "it. None: no early stop.")
    back_references: bool = Field(
        default=False, description="A kept sentence that opens with a back-reference (He, It, The company, ...) "
        "brings the sentence before it, and a kept sentence brings the next one when that one refers back to it "
        "and scores within back_reference_margin of it.")
    back_reference_margin: float = Field(
        default=0.25, ge=0.0, le=1.0, description="How close a back-referring sentence must score to the kept "
        "sentence before it to come along, as a share of the question's score range (0: only ties).")
    early_stop: bool | None = Field(
        default=None, description="Stop at min_score unless the Budget says otherwise. None: on when min_score was "
        "given here, off for a min_score a trained artifact carries (the shipped sentinel's 1.5 is a mode to "
        "ask for): the requested budget is filled, which is what a decoder that reads more evidence well wants.")

    complete_links: bool = Field(
        default=False, description="Multi-hop completion: when a kept sentence names another passage by its title "
        "(whole words, case-insensitive, a trailing '(qualifier)' dropped; passages with the sentence's own title "
        "excepted) and nothing of that passage is kept yet, that passage's best sentence that fits is kept next, "
        "whatever its score: a bridge question's second hop rarely shares words with the question.")

    def stops_early(self, budget: Budget) -> bool:
        """Whether this compression stops at ``min_score`` before the budget is full."""
        if self.min_score is None or budget.threshold is not None:
            return False
        if budget.early_stop is not None:
            return budget.early_stop
        return self.early_stop if self.early_stop is not None else "min_score" in self.model_fields_set


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
    """Indices (ascending) of the sentences to keep; see :func:`select_sentences`."""
    return select_sentences(scores, costs, max_tokens, threshold, min_keep, owner, links)[0]


def select_sentences(scores: np.ndarray, costs: list[int], max_tokens: int | None,
                     threshold: float | None = None, min_keep: int = 0, owner: list[int] | None = None,
                     links: list[list[int]] | None = None, follows: list[int] | None = None,
                     close: float | None = None, reasons: dict[int, str] | None = None
                     ) -> tuple[list[int], Literal["budget", "threshold", "input"]]:
    """Indices (ascending) of the sentences to keep: best score first while the summed cost fits
    ``max_tokens``; with ``threshold`` only sentences scoring at least that, except that the best ``min_keep``
    sentences that fit are kept whatever their score. Ties keep the earlier one.

    ``links[i]`` (with ``owner[i]``, the passage of sentence i): the passages sentence i names. Right after
    sentence i is kept in rank order, each named passage with nothing kept yet gets its best sentence that fits,
    whatever its score (see ``SentenceFilterConfig.complete_links``). Completion is one hop: the links of a
    sentence kept by completion are not followed, even when its own rank comes up later, so one strong sentence
    cannot pull in a chain of passages.

    ``follows[j]``: the sentence ``j`` refers back to (the one before it, when it opens with "He", "The
    company", ...; -1 for none). When ``j`` is kept, that sentence comes with it (a pronoun needs its referent);
    when a sentence is kept, a sentence referring back to it comes too if it scores within ``close`` of it (its
    answer may be there, named only by the pronoun). Both if they fit; one hop.

    Also returns why it stopped: ``"threshold"`` (the next sentence scored below ``threshold``), ``"input"``
    (every sentence was kept) or ``"budget"`` (some did not fit). ``reasons``, when given, is filled with why
    each sentence was kept (``score``, ``link``, ``back_reference``) or not (``budget``, ``threshold``)."""
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

    why: dict[int, str] = {} if reasons is None else reasons

    def take(i: int, reason: str = "score") -> bool:
        nonlocal used
        if i in kept or (max_tokens is not None and used + costs[i] > max_tokens):
            why.setdefault(i, "budget")
            return False
        kept.add(i)
        why[i] = reason
        used += costs[i]
        if owner is not None:
            passages_kept.add(owner[i])
        return True

    dependents: dict[int, list[int]] = {}
    for j, a in enumerate(follows or ()):
        if a >= 0:
            dependents.setdefault(a, []).append(j)
    by_passage: dict[int, list[int]] = {}
    if links is not None:
        for i in order:
            by_passage.setdefault(owner[i], []).append(i)  # type: ignore[index]
    stopped: Literal["budget", "threshold", "input"] | None = None
    for i in order:
        if threshold is not None and scores[i] < threshold and len(kept) >= min_keep:
            stopped = "threshold"
            break
        if not take(i):
            continue  # a shorter, lower-ranked sentence may still fit
        if follows is not None:
            if follows[i] >= 0:
                take(follows[i], "back_reference")
            for j in dependents.get(i, ()):
                if close is not None and scores[j] >= scores[i] - close:
                    take(j, "back_reference")
        for b in (links[i] if links is not None else ()):
            if b not in passages_kept:
                for j in by_passage.get(b, ()):  # best first: the first that fits
                    if take(j, "link"):
                        break
    for i in range(n):
        if i not in kept:
            why[i] = "threshold" if stopped and why.get(i) != "budget" else "budget"
    return sorted(kept), stopped or ("input" if len(kept) == n else "budget")


def passage_links(passages: list[Passage], sentences: list[Sentence]) -> list[list[int]]:
    """Per sentence, the other passages it names by title (:func:`~compressor.text.title_mentions`), leaving out
    passages whose title is the sentence's own passage's (SQuAD-style contexts share one article title)."""
    if not sentences:
        return []
    names = title_mentions([p.title for p in passages], [s.text for s in sentences])
    core = [(title_core(p.title) or "").casefold() for p in passages]
    return [[int(b) for b in np.nonzero(row)[0] if core[b] != core[s.passage]]
            for s, row in zip(sentences, names)]


_KEPT = frozenset({"score", "link", "back_reference", "granularity", "input"})


@dataclass
class _Plan:
    """One question between :meth:`SentenceFilter._plan` and :meth:`SentenceFilter._select`."""

    passages: list[Passage]
    budget: Budget
    tokens_in: int
    max_tokens: int | None
    unique: list[Passage]
    where: list[int]
    sents: list[Sentence]
    first: list[int]
    idx: list[int]
    merged: dict[str, int]


class SentenceFilter(Compressor):
    """Base of the sentence filters: subclasses implement :meth:`score_sentences`."""

    kind = "text"
    config: SentenceFilterConfig

    def __init__(self, counter: TokenCounter, config: SentenceFilterConfig | None = None) -> None:
        super().__init__(counter)
        self.config = config or SentenceFilterConfig()

    def sentences(self, passages: list[Passage]) -> list[Sentence]:
        spans = [(pi, si, s, e, p.text[s:e]) for pi, p in enumerate(passages)
                 for si, (s, e) in enumerate(split_sentences(p.text))]
        counts = self.counter.count_many([t for *_, t in spans])
        return [Sentence(pi, si, s, e, t, n) for (pi, si, s, e, t), n in zip(spans, counts, strict=True)]

    @abstractmethod
    def score_sentences(self, query: str, passages: list[Passage], sentences: list[Sentence]) -> np.ndarray:
        """One relevance score per sentence (higher keeps first)."""

    def score_batch(self, items: list[tuple[str, list[Passage], list[Sentence]]]) -> list[np.ndarray]:
        """Scores of several questions' sentences (``(query, passages, sentences)`` each), as
        :meth:`score_sentences` gives them; filters that gain by batching (one embedding batch) override it."""
        return [self.score_sentences(q, p, s) for q, p, s in items]

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> Kept:
        plan = self._plan(query, passages, budget)
        if isinstance(plan, Kept):
            return plan
        return self._select(plan, self.score_sentences(query, plan.unique, plan.sents))

    def _compress_batch(self, items: list[tuple[str, list[Passage], Budget]]) -> list[Kept]:
        """Every question planned, the sentences of all that need scores scored in one :meth:`score_batch`, then
        each selected as :meth:`_compress` selects."""
        plans = [self._plan(*it) for it in items]
        todo = [k for k, p in enumerate(plans) if isinstance(p, _Plan)]
        scores = self.score_batch([(items[k][0], plans[k].unique, plans[k].sents) for k in todo]) if todo else []
        out: list[Any] = list(plans)
        for k, sc in zip(todo, scores, strict=True):
            out[k] = self._select(plans[k], sc)
        return out

    def _plan(self, query: str, passages: list[Passage], budget: Budget) -> _Plan | Kept:
        """Everything before scoring: repeats merged, sentences split and counted, the budget in tokens; a
        :class:`Kept` already when the budget holds the whole input (nothing to score)."""
        tokens_in = sum(self.counter.count(p.text) for p in passages)  # repeats count: the user sent them
        if budget.ratio is None and budget.target_tokens is None and budget.threshold is None:
            budget = budget.model_copy(update={"ratio": self.config.default_ratio, "strict": False})  # not asked
        max_tokens = budget.max_tokens(tokens_in)
        unique, where = merge_repeats(passages)
        sents = self.sentences(unique)
        first = _first_copies(sents)  # per sentence, the index of its first copy (itself unless a repeat)
        idx = [i for i, f in enumerate(first) if f == i]
        merged = dict(duplicates=len(passages) - len(unique), duplicate_sentences=len(sents) - len(idx))
        # the repeat-free input's size: exact for whole passages; with repeated sentences, the input's (at least)
        whole = sum(self.counter.count(p.text) for p in unique) if merged["duplicates"] and len(idx) == len(sents) \
            else tokens_in
        if (max_tokens is None or max_tokens >= whole) and budget.threshold is None:
            # documented no-op: the budget holds the whole (repeat-free) input
            kept = self._verbatim(unique, where, sents) if len(idx) == len(sents) else \
                self._assemble(unique, where, sents, idx, np.zeros(len(sents)), max_tokens)
            return Kept(kept, stopped_by="input", **merged,
                        explain=self._explainer(passages, where, sents, first, None, dict.fromkeys(idx, "input")))
        return _Plan(passages, budget, tokens_in, max_tokens, unique, where, sents, first, idx, merged)

    def _select(self, plan: _Plan, raw_scores: np.ndarray) -> Kept:
        """The kept sentences of a planned question, given its sentences' scores."""
        passages, budget, tokens_in, max_tokens = plan.passages, plan.budget, plan.tokens_in, plan.max_tokens
        unique, where, sents, first, idx, merged = plan.unique, plan.where, plan.sents, plan.first, plan.idx, plan.merged
        scores = np.asarray(raw_scores, dtype=np.float64).copy()
        for i, f in enumerate(first):  # a repeated sentence is kept once, at its first copy, with its best score
            scores[f] = max(scores[f], scores[i])
        # Reserve one token per kept sentence for the joining space so the joined text fits too.
        costs = [sents[i].tokens + 1 for i in idx]
        links: dict[str, Any] = {}
        if self.config.complete_links:
            named = passage_links(unique, sents)
            links = dict(owner=[sents[i].passage for i in idx], links=[named[i] for i in idx])
        if self.config.back_references:
            links.update(self._back_references(sents, idx, first, scores))
        reasons: dict[int, str] = {}
        if not self.config.stops_early(budget):
            keep, why = select_sentences(scores[idx], costs, max_tokens, budget.threshold, **links, reasons=reasons)
        else:
            keep, why = select_sentences(scores[idx], costs, max_tokens, self.config.min_score, min_keep=1, **links,
                                         reasons=reasons)
            why = "min_score" if why == "threshold" else why
            reasons = {k: "min_score" if r == "threshold" else r for k, r in reasons.items()}
        reasons = {idx[k]: r for k, r in reasons.items()}
        kept = self._assemble(unique, where, sents, [idx[k] for k in keep], scores, max_tokens)
        if sum(len(p.sentence_ids) for p in kept) < len(keep):  # the joined text ran over: the weakest went
            why = "budget"
        if not kept and idx and why == "budget":  # no sentence fits: the target rounds up to one sentence
            kept, why = self._one_sentence(unique, where, sents, idx, scores, max_tokens, tokens_in, budget)
            if why == "granularity":  # the one sentence kept although over the target
                best = (kept[0].index, kept[0].sentence_ids[0])
                reasons.update({i: "granularity" for i in idx if (where[sents[i].passage], sents[i].index) == best})
        return Kept(kept, stopped_by=why, **merged,
                    explain=self._explainer(passages, where, sents, first, scores, reasons))

    def _explainer(self, passages: list[Passage], where: list[int], sents: list[Sentence], first: list[int],
                   scores: np.ndarray | None, reasons: dict[int, str]) -> Callable[[CompressedContext], Explanation]:
        """The lazy explanation of one compression (:mod:`compressor.explain`): ``sents`` are the repeat-free
        passages' sentences (unique passage ``p`` is input passage ``where[p]``), ``reasons`` why the selection
        kept or left each one. A sentence the result does not hold after all was dropped when the joined text ran
        over the budget."""

        def explain(ctx: CompressedContext) -> Explanation:
            held = {(cp.index, k) for cp in ctx.passages for k in cp.sentence_ids}
            out_tokens = {cp.index: cp.tokens_out for cp in ctx.passages}
            per: dict[int, list[SentenceExplanation]] = {}
            for i, s in enumerate(sents):
                at, kept = where[s.passage], (where[s.passage], s.index) in held
                if first[i] != i:
                    reason = "duplicate"
                elif kept:
                    reason = reasons[i] if reasons.get(i) in _KEPT else "score"
                else:
                    reason = "budget" if reasons.get(i, "budget") in _KEPT else reasons[i]
                per.setdefault(at, []).append(SentenceExplanation(
                    sentence=s.index, span=(s.start, s.end), tokens=s.tokens, kept=kept, reason=reason,
                    coverage=1.0 if kept else 0.0, score=None if scores is None else round(float(scores[i]), 6)))
            firsts = {_repeat_key(passages[w]): w for w in where}
            out = []
            for i, p in enumerate(passages):
                dup = firsts[_repeat_key(p)]
                n_in, n_out = self.counter.count(p.text), out_tokens.get(i, 0)
                rows = per.get(i, []) if dup == i else [
                    e.model_copy(update={"kept": False, "reason": "duplicate", "coverage": 0.0})
                    for e in per.get(dup, [])]
                out.append(PassageExplanation(index=i, id=p.id, title=p.title, tokens_in=n_in, tokens_out=n_out,
                                              ratio=n_in / n_out if n_out else None,
                                              duplicate_of=None if dup == i else dup, sentences=rows))
            return Explanation(method=ctx.method, kind=ctx.kind, scored=scores is not None, passages=out)

        return explain

    def _one_sentence(self, passages, where, sents, idx, scores, max_tokens, tokens_in, budget) -> tuple[list, str]:
        """A sentence filter's granularity: the best sentence that fits alone (the join reservation aside), or
        else the best one, over the target (``granularity``; a strict budget refuses)."""
        fits = [i for i in idx if max_tokens is None or sents[i].tokens <= max_tokens]
        if fits:
            best, why = max(fits, key=lambda i: (float(scores[i]), -i)), "budget"
        else:
            self.check_strict(budget, tokens_in, min(sents[i].tokens for i in idx), "granularity")
            best, why = max(idx, key=lambda i: (float(scores[i]), -i)), "granularity"
        return self._assemble(passages, where, sents, [best], scores, None), why

    def _back_references(self, sents: list[Sentence], idx: list[int], first: list[int],
                         scores: np.ndarray) -> dict[str, Any]:
        """``follows`` and ``close`` of :func:`select_sentences`, in the positions ``idx`` it selects among (a
        referent that repeats an earlier passage's sentence is that first copy)."""
        pos = {i: k for k, i in enumerate(idx)}
        follows = [pos.get(first[i - 1], -1) if i > 0 and sents[i - 1].passage == sents[i].passage
                   and refers_back(sents[i].text) else -1 for i in idx]
        span = float(scores[idx].max() - scores[idx].min()) if idx else 0.0
        return {"follows": follows, "close": self.config.back_reference_margin * span}

    def _verbatim(self, passages: list[Passage], where: list[int], sents: list[Sentence]) -> list[CompressedPassage]:
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
                index=where[pi], title=p.title, text=text, spans=[(ss[0].start, ss[-1].end)],
                sentence_ids=[s.index for s in ss], scores=[0.0] * len(ss),
                tokens_in=self.counter.count(p.text), tokens_out=self.counter.count(text),
            ))
        return out

    def _assemble(self, passages, where, sents, keep, scores, max_tokens) -> list[CompressedPassage]:
        """The kept sentences ``keep`` of the repeat-free ``passages`` (input positions ``where``), per passage."""
        by_p: dict[int, list[int]] = {}
        for i in keep:
            by_p.setdefault(sents[i].passage, []).append(i)
        out = []
        for pi in sorted(by_p):
            idx = by_p[pi]
            text = " ".join(sents[i].text for i in idx)
            out.append(CompressedPassage(
                index=where[pi], title=passages[pi].title, text=text,
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
                return self._assemble(passages, where, sents, [i for i in keep if i != weakest], scores, max_tokens)
        return out


def _first_copies(sents: list[Sentence]) -> list[int]:
    """Per sentence, the index of its first copy (the same text up to whitespace) in an earlier passage, or its
    own index: overlapping retriever chunks share whole sentences. A passage's own repeats stay its text."""
    first: dict[str, int] = {}
    out = []
    for i, s in enumerate(sents):
        j = first.setdefault(" ".join(s.text.split()), i)
        out.append(j if sents[j].passage != s.passage else i)
    return out


def merge_repeats(passages: list[Passage]) -> tuple[list[Passage], list[int]]:
    """``passages`` without repeats (same title and the same text up to whitespace; the first copy stays), and
    the input position of each one kept."""
    seen: set[tuple[str | None, str]] = set()
    unique, where = [], []
    for i, p in enumerate(passages):
        key = _repeat_key(p)
        if key not in seen:
            seen.add(key)
            unique.append(p)
            where.append(i)
    return unique, where


def _repeat_key(p: Passage) -> tuple[str | None, str]:
    """Passages with the same key are repeats: the same title and the same text up to whitespace."""
    return p.title, " ".join(p.text.split())
