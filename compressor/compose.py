"""Compositions: a text filter feeding a soft compressor, one method under one name (``sentinel+icae``).

The filter keeps its best sentences of each passage (in order, grouped by passage); what is left of each
passage is what the soft encoder compresses, each passage on its own, titles kept as text. The budget is the
product: a ``ratio`` R asks the filter for ``R / r`` (``r``: the encoder's own ratio, 4 for the shipped
``icae``) and the encoder does the rest, so the reached ratio counts slots against the original context in
decoder tokens, and a ``target_tokens`` T asks the filter for ``T * r`` tokens. Without a budget the filter
keeps its default and the encoder compresses that.

Shapes: as the soft compressor's, per kept passage (``embeds [rows, hidden]``), with the filter's kept
``spans`` and ``sentence_ids`` on each, so evidence recall and an inspector read what was kept; ``index`` is the
input passage's. Index time fills the filter's per-passage cache (sentence embeddings); the slots depend on
what the question keeps, so they are computed at query time and stored in the encoder's slot cache by text.
"""

from __future__ import annotations

from typing import Any

from . import icae as _icae  # noqa: F401  (the families composed here register first)
from . import registry
from . import sentinel as _sentinel  # noqa: F401
from .base import (
    Budget,
    CompressedContext,
    CompressedPassage,
    Compressor,
    DecoderAdapter,
    Kept,
    Passage,
    TokenCounter,
)
from .errors import ConfigError
from .explain import with_slots
from .registry import CompressorSpec, get_spec, register_compressor

__all__ = ["ComposedCompressor", "register_composition"]


class ComposedCompressor(Compressor):
    """``first`` (a text method) then ``second`` (a soft method) on what ``first`` kept."""

    kind = "soft"

    def __init__(self, counter: TokenCounter, first: Compressor, second: Compressor, name: str) -> None:
        super().__init__(counter)
        if first.kind != "text" or second.kind != "soft":
            raise ConfigError(f"a composition is a text method then a soft one, not {first.kind} then {second.kind}")
        self.first, self.second, self.name = first, second, name

    @property
    def soft_ratio(self) -> float:
        """The second method's own ratio (its tokens per slot)."""
        return float(getattr(getattr(self.second, "config", None), "ratio", 1.0))

    def filter_budget(self, budget: Budget) -> Budget:
        """What the filter is asked for: the composed target divided by the encoder's ratio."""
        r = self.soft_ratio
        update: dict[str, Any] = {"strict": False}
        if budget.ratio is not None:
            update["ratio"] = max(1.0, budget.ratio / r)
        elif budget.target_tokens is not None:
            update["target_tokens"] = max(1, int(budget.target_tokens * r))
        return budget.model_copy(update=update)

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> Kept:
        kept = self.first.compress(query, passages, self.filter_budget(budget))
        srcs = _sources(kept)
        soft = self.second.compress(query, _as_passages(srcs), Budget()) if srcs else None
        return _joined(kept, srcs, soft)

    def _compress_batch(self, items: list[tuple[str, list[Passage], Budget]]) -> list[Kept]:
        """The filter over the whole batch in one call, then the encoder over every kept text in one call."""
        kept = self.first.compress_batch([(q, ps, self.filter_budget(b)) for q, ps, b in items])
        srcs = [_sources(k) for k in kept]
        todo = [i for i, s in enumerate(srcs) if s]
        softs = dict(zip(todo, self.second.compress_batch([(items[i][0], _as_passages(srcs[i]), Budget())
                                                           for i in todo]), strict=True))
        return [_joined(k, s, softs.get(i)) for i, (k, s) in enumerate(zip(kept, srcs, strict=True))]

    def _index(self, passages: list[Passage]) -> tuple[int, int]:
        """The filter's per-passage cache (the slots depend on the question: query time, by text)."""
        rep = self.first.index(passages)
        return rep.computed, rep.cached

    def run_stats(self) -> dict[str, Any]:
        return {**self.first.run_stats(), **self.second.run_stats()}

    def caches(self) -> list[Any]:
        return [*self.first.caches(), *self.second.caches()]

    def decoder_adapter(self) -> DecoderAdapter | None:
        return self.second.decoder_adapter()


def _sources(kept: CompressedContext) -> list[CompressedPassage]:
    """The filter's kept passages with text: what the encoder compresses."""
    return [cp for cp in kept.passages if cp.text and cp.text.strip()]


def _as_passages(srcs: list[CompressedPassage]) -> list[Passage]:
    return [Passage(text=cp.text, title=cp.title) for cp in srcs]  # type: ignore[arg-type]


def _joined(kept: CompressedContext, srcs: list[CompressedPassage], soft: CompressedContext | None) -> Kept:
    """The filter's kept passages (spans, sentence ids, input positions) carrying the encoder's slots."""
    merged = {"duplicates": kept.duplicates, "duplicate_sentences": kept.duplicate_sentences,
              "explain": lambda ctx: with_slots(kept.explain(), ctx)}
    if soft is None:
        return Kept([], stopped_by=kept.stopped_by, **merged)
    out = [src.model_copy(update={"text": cp.text, "embeds": cp.embeds, "tokens_out": cp.tokens_out})
           for src, cp in zip((srcs[p.index] for p in soft.passages), soft.passages, strict=True)]
    why = soft.stopped_by if soft.stopped_by in ("granularity", "passed_through") else kept.stopped_by
    return Kept(out, stopped_by=why, **merged)


def register_composition(first: str, second: str, description: str | None = None) -> CompressorSpec:
    """Register ``FIRST+SECOND``: options ``cache_dir`` go to both, ``artifact`` and ``decoder`` to the soft
    method, ``filter_artifact`` to the filter, the rest to the filter's config."""
    name = f"{first}+{second}"

    def make(counter: TokenCounter, artifact: str | None = None, decoder: str | None = None,
             cache_dir: str | None = None, filter_artifact: str | None = None, **options: Any) -> Compressor:
        shared = {"cache_dir": cache_dir} if cache_dir else {}
        soft_opts = {**shared, **({"artifact": artifact} if artifact else {}), **({"decoder": decoder} if decoder else {})}
        text_opts = {**shared, **options, **({"artifact": filter_artifact} if filter_artifact else {})}
        return ComposedCompressor(counter, get_spec(first).factory(counter=counter, **text_opts),
                                  get_spec(second).factory(counter=counter, **soft_opts), name)

    a, b = registry._REGISTRY[first], registry._REGISTRY[second]  # built-ins, registered before (no plugin load)
    return register_compressor(
        name, make, kind="soft", description=description or f"{first} keeps sentences, {second} compresses them",
        cacheable=a.cacheable, artifact=b.artifact)


register_composition("sentinel", "icae", "sentinel keeps sentences, icae compresses them to memory slots (the ratio "
                     "is the product)")
