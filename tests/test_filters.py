from __future__ import annotations

import pytest
from conftest import HOTPOT

from adapters.datasets import load_dataset
from adapters.metrics import evidence_recall
from compressor import Budget, get_compressor
from compressor.filters import select_within_budget

PASSAGES = [
    {"title": "Paris", "text": "Paris is the capital of France. It has many museums. The Louvre is the largest."},
    {"title": "Berlin", "text": "Berlin is the capital of Germany. It is known for its techno clubs."},
    {"title": "Cats", "text": "Cats sleep a lot."},
]


def test_select_within_budget():
    assert select_within_budget([0.1, 0.9, 0.5], [5, 5, 5], 10) == [1, 2]
    assert select_within_budget([0.1, 0.9, 0.5], [5, 50, 5], 10) == [0, 2]  # skips what cannot fit
    assert select_within_budget([0.1, 0.9, 0.5], [5, 5, 5], None, threshold=0.4) == [1, 2]
    assert select_within_budget([0.5, 0.5], [5, 5], 5) == [0]  # ties keep the earlier sentence
    assert select_within_budget([0.1, 0.2, 0.3], [5, 5, 5], 10, threshold=0.9) == []
    assert select_within_budget([0.1, 0.2, 0.3], [5, 5, 5], 10, threshold=0.9, min_keep=1) == [2]
    assert select_within_budget([0.1, 0.2, 0.3], [5, 5, 50], 10, threshold=0.9, min_keep=1) == [1]  # best that fits


@pytest.mark.parametrize("method", ["bm25", "minilm"])
@pytest.mark.parametrize("budget", [Budget(ratio=2), Budget(ratio=5), Budget(target_tokens=12), Budget(target_tokens=1)])
def test_budget_never_exceeded_and_order_kept(counter, method, budget):
    comp = get_compressor(method, counter=counter)
    ctx = comp.compress("What is the capital of France?", PASSAGES, budget)
    cap = budget.max_tokens(ctx.tokens_in)
    assert ctx.tokens_out <= cap
    assert [p.index for p in ctx.passages] == sorted(p.index for p in ctx.passages)
    for cp in ctx.passages:
        src = PASSAGES[cp.index]["text"]
        assert cp.sentence_ids == sorted(cp.sentence_ids)
        assert cp.text == " ".join(src[s:e] for s, e in cp.spans)  # spans map back to the input
        assert counter.count(cp.text) == cp.tokens_out


@pytest.mark.parametrize("method", ["bm25", "minilm"])
def test_relevant_sentence_ranked_first(counter, method):
    ctx = get_compressor(method, counter=counter).compress("What is the capital of France?", PASSAGES,
                                                           Budget(target_tokens=9))
    assert "capital of France" in ctx.text


def test_budget_over_input_is_a_no_op(counter):
    ctx = get_compressor("bm25", counter=counter).compress("q?", PASSAGES, Budget(target_tokens=10_000))
    assert ctx.tokens_out == ctx.tokens_in or ctx.tokens_out <= ctx.tokens_in
    assert len(ctx.passages) == 3 and ctx.passages[2].text == "Cats sleep a lot."


def test_one_sentence_and_unpunctuated_passages(counter):
    ctx = get_compressor("bm25", counter=counter).compress("cats?", ["Cats sleep a lot", "x"], Budget(ratio=1.5))
    assert ctx.tokens_out <= Budget(ratio=1.5).max_tokens(ctx.tokens_in)


def test_threshold_selection(counter):
    ctx = get_compressor("minilm", counter=counter).compress("capital of France", PASSAGES, Budget(threshold=0.5))
    assert all(s >= 0.5 for p in ctx.passages for s in p.scores)


def test_bm25_on_real_hotpotqa_keeps_evidence(counter):
    exs = load_dataset("hotpotqa", HOTPOT, limit=10)
    comp = get_compressor("bm25", counter=counter)
    recalls = [evidence_recall(comp.compress(e.question, e.passages, Budget(ratio=3)), e.passages) for e in exs]
    assert sum(recalls) / len(recalls) > 0.5


def test_min_score_stops_before_the_budget(counter):
    """``min_score`` drops weak sentences even with room left, always keeps the best one, and gives way to a
    budget's own threshold and to a budget that holds the whole input."""
    q = "What is the capital of France?"
    full = get_compressor("bm25", counter=counter).compress(q, PASSAGES, Budget(ratio=1.2))
    comp = get_compressor("bm25", counter=counter, min_score=1e9)
    ctx = comp.compress(q, PASSAGES, Budget(ratio=1.2))
    assert len([i for p in ctx.passages for i in p.sentence_ids]) == 1 < len(full.passages[0].sentence_ids) + 1
    assert "capital of France" in ctx.text
    cut = sorted(s for p in full.passages for s in p.scores)[-2]
    ctx = get_compressor("bm25", counter=counter, min_score=cut).compress(q, PASSAGES, Budget(ratio=1.2))
    assert sorted(s for p in ctx.passages for s in p.scores) == sorted(s for p in full.passages for s in p.scores
                                                                      if s >= cut)
    assert comp.compress(q, PASSAGES, Budget(ratio=1.2, threshold=-1e9)).tokens_out == full.tokens_out
    assert comp.compress(q, PASSAGES, Budget(ratio=1)).tokens_out == full.tokens_in
