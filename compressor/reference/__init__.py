"""Reference points every method is judged between.

* ``none``: the full context, unchanged (text RAG).
* ``no_context``: no passages at all (closed-book).
* ``oracle``: only the labelled evidence (HotpotQA supporting-fact sentences, or the gold passage under
  distractors): the ceiling a filter can reach. Reads :attr:`Passage.evidence`; fails on unlabelled data.
"""

from __future__ import annotations

from ..base import Budget, CompressedPassage, Compressor, Kept, Passage, TokenCounter
from ..errors import InputError
from ..registry import register_compressor

__all__ = ["FullContext", "NoContext", "Oracle"]


class FullContext(Compressor):
    name = "none"
    kind = "text"

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> Kept:
        """Every passage as it is, whatever the budget (``passed_through`` when the budget asked for less; a
        strict budget under the input refuses)."""
        out = []
        for i, p in enumerate(passages):
            n = self.counter.count(p.text)
            out.append(CompressedPassage(index=i, title=p.title, text=p.text, spans=[(0, len(p.text))],
                                         tokens_in=n, tokens_out=n))
        cap = budget.max_tokens(sum(p.tokens_out for p in out))
        return Kept(out, stopped_by="passed_through" if cap is not None and cap < sum(p.tokens_out for p in out)
                    else "input")


class NoContext(Compressor):
    name = "no_context"
    kind = "text"

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> list[CompressedPassage]:
        return []


class Oracle(Compressor):
    name = "oracle"
    kind = "text"

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> list[CompressedPassage]:
        if all(p.evidence is None for p in passages):
            raise InputError("method 'oracle' needs passages with labelled evidence spans; this data has none")
        out = []
        for i, p in enumerate(passages):
            if not p.evidence:
                continue
            spans = sorted(p.evidence)
            text = " ".join(p.text[s:e].strip() for s, e in spans)
            out.append(CompressedPassage(index=i, title=p.title, text=text, spans=list(spans),
                                         tokens_in=self.counter.count(p.text), tokens_out=self.counter.count(text)))
        return out


def _factory(cls):
    def make(counter: TokenCounter, **options) -> Compressor:
        if options:
            raise InputError(f"compressor {cls.name!r} takes no options, got {sorted(options)}")
        return cls(counter)

    return make


register_compressor("none", _factory(FullContext), kind="text", description="full context, uncompressed")
register_compressor("no_context", _factory(NoContext), kind="text", description="no passages (closed book)")
register_compressor("oracle", _factory(Oracle), kind="text", description="labelled evidence only (ceiling)")
