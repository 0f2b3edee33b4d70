"""``sentinel+icae``: the filter's kept sentences, grouped by passage and in order, are what the encoder
compresses; the ratio is the product, counted against the original context in decoder tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import HOTPOT

from adapters.datasets import load_dataset
from adapters.metrics import evidence_recall
from compressor import Budget, Passage, available_compressors, get_compressor
from compressor.compose import ComposedCompressor
from compressor.errors import ConfigError


@pytest.fixture(scope="module")
def composed(counter) -> ComposedCompressor:
    return get_compressor("sentinel+icae", counter=counter)


@pytest.fixture(scope="module")
def example():
    return load_dataset("hotpotqa", HOTPOT, limit=1)[0]


def test_registered_as_one_soft_method():
    spec = available_compressors()["sentinel+icae"]
    assert spec.kind == "soft" and spec.cacheable and spec.shipped and not spec.fixed_ratio


@pytest.mark.parametrize("budget", [Budget(ratio=40), Budget(ratio=12), Budget(target_tokens=30), Budget()])
def test_the_encoder_compresses_what_the_filter_kept(composed, example, budget):
    ctx = composed.compress(example.question, example.passages, budget)
    text = composed.first.compress(example.question, example.passages, composed.filter_budget(budget))
    assert [p.index for p in ctx.passages] == [p.index for p in text.passages]  # order and grouping: the filter's
    assert [p.title for p in ctx.passages] == [example.passages[p.index].title for p in ctx.passages]
    assert [p.spans for p in ctx.passages] == [p.spans for p in text.passages]  # what the slots stand for
    slots = composed.second.compress(example.question, [Passage(text=p.text, title=p.title) for p in text.passages])
    assert all(torch.equal(a.embeds, b.embeds) for a, b in zip(ctx.passages, slots.passages, strict=True))
    assert ctx.kind == "soft" and ctx.tokens_in == sum(composed.counter.count(p.text) for p in example.passages)
    assert ctx.tokens_out == sum(p.embeds.shape[0] for p in ctx.passages)  # slots, against the original context
    assert ctx.ratio == pytest.approx(ctx.tokens_in / ctx.tokens_out)
    assert ctx.ratio == pytest.approx(text.ratio * text.tokens_out / ctx.tokens_out)  # the product of the two
    if budget.ratio is not None:
        assert composed.filter_budget(budget).ratio == pytest.approx(budget.ratio / 4)
        assert ctx.asked_ratio == budget.ratio and (ctx.ratio >= budget.ratio or ctx.stopped_by == "granularity")
    assert 0 <= evidence_recall(ctx, example.passages) <= evidence_recall(text, example.passages) + 1e-9


def test_a_composition_needs_a_text_method_then_a_soft_one(composed, counter):
    with pytest.raises(ConfigError, match="text method then a soft one"):
        ComposedCompressor(counter, composed.second, composed.first, "icae+sentinel")


def test_index_fills_the_filters_cache(counter, example, tmp_path):
    comp = get_compressor("sentinel+icae", counter=counter, cache_dir=str(tmp_path))
    rep = comp.index(example.passages)
    assert rep.method == "sentinel+icae" and rep.computed == len({p.text for p in example.passages})
    assert comp.index(example.passages).cached == rep.computed
