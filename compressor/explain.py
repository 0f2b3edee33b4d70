"""What a compression kept and why: ``compress(..., explain=True)`` fills :attr:`CompressedContext.explanation`.

Per input passage, in input order: every sentence (its ``[start, end)`` span in the passage, its tokens in the
decoder's tokenizer, the method's score or ``None`` for a method without one, kept or not, and the reason), the
passage's tokens in and out, and for a soft method the slots made and the passage's ratio. Sentence filters
report their own ranking (:meth:`~compressor.filters.base.SentenceFilter._compress` traces it); every other
method is explained from what it returned: a sentence counts as kept when the kept spans cover it
(``coverage``: the share of its characters kept, less than 1 only for a token-level method such as
``longllmlingua``).

Reasons, kept: ``score`` (ranked in within the budget), ``link`` (link completion: another kept sentence names
this passage), ``back_reference`` (a kept sentence refers back to it, or it refers back to one), ``granularity``
(the one sentence kept although over the target), ``input`` (the budget held the whole input),
``passed_through`` (a method that does not compress, or a passage no longer than its slots), ``evidence``
(``oracle``), ``tokens`` (a token-level method kept some of it), ``slots`` (a soft method compressed it into the
passage's memory slots). Dropped: ``budget`` (it did not fit), ``min_score`` (the early stop), ``threshold``
(the budget's threshold), ``duplicate`` (a repeat of an earlier passage or sentence, kept there), ``filtered``
(a method without a per-sentence reason left it out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from .text import split_sentences

if TYPE_CHECKING:
    from .base import CompressedContext, Passage, TokenCounter

__all__ = ["Reason", "SentenceExplanation", "PassageExplanation", "Explanation", "explain_from_output",
           "with_slots"]

Reason = Literal["score", "link", "back_reference", "granularity", "input", "passed_through", "evidence",
                 "tokens", "slots", "budget", "min_score", "threshold", "duplicate", "filtered"]


class SentenceExplanation(BaseModel):
    """One sentence of an input passage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sentence: int = Field(description="Index of the sentence in its passage.")
    span: tuple[int, int] = Field(description="[start, end) characters of the sentence in the passage text.")
    tokens: int = Field(description="Tokens of the sentence in the decoder's tokenizer.")
    score: float | None = Field(description="The method's score; null: the method scores no sentences (or it "
                                "did not need to: the budget held the whole input).")
    kept: bool
    reason: Reason
    coverage: float = Field(default=1.0, ge=0.0, le=1.0, description="Share of the sentence's characters kept "
                            "(0 when dropped; below 1 only for token-level methods).")


class PassageExplanation(BaseModel):
    """One input passage: its sentences, and what it became."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="Position of the passage in the input list.")
    id: str | None = Field(default=None, description="The caller's passage id, if given.")
    title: str | None = None
    tokens_in: int = Field(description="Tokens of the passage text.")
    tokens_out: int = Field(description="Kept text tokens, or soft slots.")
    slots: int | None = Field(default=None, description="Soft methods: memory slots made for this passage.")
    ratio: float | None = Field(default=None, description="tokens_in / tokens_out for this passage; null when "
                                "nothing of it is kept.")
    duplicate_of: int | None = Field(default=None, description="The earlier identical passage it was merged into.")
    sentences: list[SentenceExplanation]


class Explanation(BaseModel):
    """Per passage and sentence, what ``method`` kept and why (see the module docstring for the reasons)."""

    model_config = ConfigDict(extra="forbid")

    method: str
    kind: Literal["text", "soft"]
    scored: bool = Field(description="Whether the method scored the sentences (sentence filters).")
    passages: list[PassageExplanation]

    def kept_spans(self) -> dict[int, list[tuple[int, int]]]:
        """Per passage index, the spans of its kept sentences (what an inspector highlights)."""
        return {p.index: [s.span for s in p.sentences if s.kept] for p in self.passages}


_KEPT_REASON: dict[str, Reason] = {"none": "passed_through", "oracle": "evidence", "longllmlingua": "tokens"}


def _covered(span: tuple[int, int], kept: list[tuple[int, int]]) -> float:
    s, e = span
    inside = sum(max(0, min(e, b) - max(s, a)) for a, b in kept)
    return min(1.0, inside / (e - s)) if e > s else 0.0


def explain_from_output(ctx: CompressedContext, passages: list[Passage], counter: TokenCounter) -> Explanation:
    """The explanation of a method that traces no ranking, read off its output: per passage, each sentence is
    kept as far as the kept spans cover it; a soft passage's sentences all went into its slots."""
    by_index = {cp.index: cp for cp in ctx.passages}
    out = []
    for i, p in enumerate(passages):
        cp = by_index.get(i)
        spans = split_sentences(p.text)
        soft = cp is not None and cp.embeds is not None
        if soft:
            kept_spans = [(0, len(p.text))]
        elif cp is not None and cp.spans:
            kept_spans = list(cp.spans)
        else:
            kept_spans = []
        sents = []
        for k, span in enumerate(spans):
            cov = _covered(span, kept_spans)
            if soft:
                reason: Reason = "slots"
            elif cov > 0:
                reason = "input" if ctx.method == "none" and ctx.stopped_by == "input" else \
                    _KEPT_REASON.get(ctx.method, "passed_through" if ctx.kind == "soft" else "score")
            else:
                reason = "filtered"
            sents.append(SentenceExplanation(sentence=k, span=span, tokens=counter.count(p.text[span[0]:span[1]]),
                                             score=None, kept=cov > 0, reason=reason, coverage=round(cov, 4)))
        tokens_in = cp.tokens_in if cp is not None and cp.tokens_in else counter.count(p.text)
        tokens_out = cp.tokens_out if cp is not None else 0
        out.append(PassageExplanation(
            index=i, id=p.id, title=p.title, tokens_in=tokens_in, tokens_out=tokens_out,
            slots=int(cp.embeds.shape[0]) if soft else None,
            ratio=tokens_in / tokens_out if tokens_out else None, sentences=sents))
    return Explanation(method=ctx.method, kind=ctx.kind, scored=False, passages=out)


def with_slots(explanation: Explanation, ctx: CompressedContext) -> Explanation:
    """A filter's explanation carried through a soft compressor (compositions): each passage's tokens out become
    the slots its kept sentences were compressed into."""
    by_index = {cp.index: cp for cp in ctx.passages}
    out = []
    for pe in explanation.passages:
        cp = by_index.get(pe.index)
        slots = int(cp.embeds.shape[0]) if cp is not None and cp.embeds is not None else None
        n = slots if slots is not None else (cp.tokens_out if cp is not None else 0)
        out.append(pe.model_copy(update={"slots": slots, "tokens_out": n,
                                         "ratio": pe.tokens_in / n if n else None}))
    return Explanation(method=ctx.method, kind=ctx.kind, scored=explanation.scored, passages=out)
