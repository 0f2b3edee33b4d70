"""``compress_batch``: several questions' contexts compressed in one call give what ``compress`` gives on each.

What may differ, and why the tolerances: batching changes only how rows are padded and grouped into kernels.
A right-padded causal pass leaves every real token's values what they are alone, and masked mean pooling
ignores pads, so the math is the same; the float rounding of a differently shaped kernel is not. In float32
that moves a score by under 1e-5 (measured: max 2e-6 here); in bfloat16 (the shipped sentinel's proxy) the
attention rows themselves round, so there the kept sentences are compared, not the digits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import HOTPOT, REPO

from adapters.datasets import load_dataset
from compressor import Budget, CompressRequest, get_compressor
from compressor.errors import InputError

NQ = REPO.parent / "shared" / "data" / "nq_open" / "nq-open-oracle-even.jsonl.gz"


@pytest.fixture(scope="module")
def requests_():
    """Six HotpotQA questions (10 passages each) and four NQ ones with 9 distractors, at mixed budgets (one
    that holds the whole input, so nothing is scored)."""
    from adapters.datasets import load_examples, make_spec

    hp = load_dataset("hotpotqa", HOTPOT, limit=6)
    nq = load_examples(make_spec(label="nq", kind="nq", path=NQ, distractors=9), limit=4).examples
    budgets = [Budget(ratio=5), Budget(ratio=3), Budget(target_tokens=60), Budget(ratio=1), Budget(ratio=8),
               Budget(ratio=5, early_stop=True), Budget(ratio=4), Budget(ratio=10), Budget(target_tokens=200),
               Budget(ratio=2)]
    return [(ex.question, ex.passages, b) for ex, b in zip(hp + nq, budgets, strict=True)]


def kept(ctx) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.index, tuple(p.sentence_ids)) for p in ctx.passages]


def assert_same_text(batch, single, score_tol: float | None) -> None:
    for b, s in zip(batch, single, strict=True):
        assert kept(b) == kept(s) and b.text == s.text
        assert (b.tokens_in, b.tokens_out, b.stopped_by, b.asked_ratio) == (s.tokens_in, s.tokens_out, s.stopped_by,
                                                                            s.asked_ratio)
        if score_tol is not None:
            for pb, ps in zip(b.passages, s.passages, strict=True):
                np.testing.assert_allclose(pb.scores, ps.scores, atol=score_tol, rtol=0)


@pytest.mark.parametrize("method", ["bm25", "minilm"])
def test_filters_batch_equals_single(method, counter, requests_):
    comp = get_compressor(method, counter=counter)
    single = [comp.compress(*r) for r in requests_]
    batch = comp.compress_batch(requests_)
    assert_same_text(batch, single, 0.0 if method == "bm25" else 1e-5)
    assert all(b.compress_s == batch[0].compress_s for b in batch)  # the batch's time, shared


def test_sentinel_float32_batch_equals_single(counter, requests_):
    comp = get_compressor("sentinel", counter=counter, dtype="float32")
    single = [comp.compress(*r) for r in requests_]
    batch = comp.compress_batch(requests_)
    assert_same_text(batch, single, 1e-4)


def test_sentinel_padded_proxy_pass_equals_one_window_at_a_time(counter, requests_):
    """On a CPU the proxy reads one window a time (padding costs more than it saves there); on an accelerator
    several, right-padded, with no padding mask (causal: no real query sees a pad). The padded pass gives the
    same float32 features as the one-window passes."""
    from compressor.text import split_sentences

    comp = get_compressor("sentinel", counter=counter, dtype="float32")
    items = [(q, ps, [split_sentences(p.text) for p in ps]) for q, ps, _ in requests_]
    one = comp.attention.features_batch(items, layers=2, layout=comp.layout)
    padded = comp.attention.features_batch(items, layers=2, layout=comp.layout, batch_size=4)
    assert len({len(comp.attention._encode(comp.attention._prompt(*it)[0])[0]) for it in items}) > 4  # real padding
    for a, b in zip(one, padded, strict=True):
        np.testing.assert_allclose(a.x, b.x, atol=2e-4, rtol=0)


def test_sentinel_shipped_bf16_batch_keeps_the_same_sentences(counter, requests_):
    comp = get_compressor("sentinel", counter=counter)
    single = [comp.compress(*r) for r in requests_]
    batch = comp.compress_batch(requests_)
    same = sum(kept(b) == kept(s) for b, s in zip(batch, single, strict=True))
    assert same >= len(requests_) - 1, [(kept(b), kept(s)) for b, s in zip(batch, single)]
    for b, s in zip(batch, single, strict=True):  # the budget and its accounting hold either way
        assert b.tokens_in == s.tokens_in and (b.stopped_by == s.stopped_by or b.stopped_by in ("budget", "min_score"))


def test_icae_batch_equals_single(counter, requests_):
    comp = get_compressor("icae", counter=counter, dtype="float32")  # bf16 rounding depends on batch mates
    reqs = requests_[:4]
    single = [comp.compress(q, ps) for q, ps, _ in reqs]
    before = comp.encoded_passages
    batch = comp.compress_batch([(q, ps, None) for q, ps, _ in reqs])
    distinct = len({p.text for _, ps, _ in reqs for p in ps if len(comp._tokens(p.text)) > 1})
    assert comp.encoded_passages - before <= distinct  # each passage encoded once in the batch
    for b, s in zip(batch, single, strict=True):
        assert [p.index for p in b.passages] == [p.index for p in s.passages] and b.tokens_out == s.tokens_out
        for pb, ps in zip(b.passages, s.passages, strict=True):
            assert (pb.embeds is None) == (ps.embeds is None)
            if pb.embeds is not None:
                torch.testing.assert_close(pb.embeds, ps.embeds, atol=1e-4, rtol=1e-4)


def test_composition_batch_equals_single(counter, requests_):
    comp = get_compressor("sentinel+icae", counter=counter)
    reqs = [(q, ps, Budget(ratio=40)) for q, ps, _ in requests_[:3]]
    single = [comp.compress(*r) for r in reqs]
    batch = comp.compress_batch(reqs)
    for b, s in zip(batch, single, strict=True):
        assert [p.spans for p in b.passages] == [p.spans for p in s.passages]  # what the slots stand for
        assert b.tokens_out == s.tokens_out and b.ratio == pytest.approx(s.ratio)


def test_batch_input_is_checked_naming_the_request(counter):
    comp = get_compressor("bm25", counter=counter)
    good = ("Who?", ["Ana lives in Lisbon."], None)
    assert comp.compress_batch([]) == []
    assert len(comp.compress_batch([good, CompressRequest(query="Where?", passages=["A b. C d."])])) == 2
    with pytest.raises(InputError, match=r"requests\[1\] query is empty"):
        comp.compress_batch([good, ("  ", ["x."], None)])
    with pytest.raises(InputError, match=r"requests\[0\] is a list"):
        comp.compress_batch([["Who?", ["x."], None]])
    with pytest.raises(InputError, match=r"requests\[0\] passages\[0\]"):
        comp.compress_batch([("Who?", [3], None)])
