"""``compress(..., explain=True)``: per passage and sentence, what was kept and why, in the API, the CLI and the
proxy. The explanation must agree with the result it explains (same kept sentences, same token counts), and
asking for it must not change the result."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import HOTPOT
from fastapi.testclient import TestClient

from adapters.datasets import load_dataset
from adapters.decoders import FakeBackend
from compressor import Budget, get_compressor
from compressor.explain import Explanation
from compressor.text import split_sentences
from serving.app import create_app
from serving.cli import main
from serving.settings import ProxySettings

ANA = {"title": "Ana", "text": "Ana lives in Lisbon. She has a cat named Tux. The weather is nice today."}
BOB = {"title": "Bob", "text": "Bob is a painter. He lives in Porto. Bob met Ana in school."}
Q = "Where does Ana live?"


@pytest.fixture(scope="module")
def example():
    return load_dataset("hotpotqa", HOTPOT, limit=1)[0]


def kept_of(ctx) -> set[tuple[int, int]]:
    return {(p.index, k) for p in ctx.passages for k in p.sentence_ids}


def explained(ex: Explanation) -> set[tuple[int, int]]:
    return {(p.index, s.sentence) for p in ex.passages for s in p.sentences if s.kept}


@pytest.mark.parametrize("method", ["bm25", "minilm", "sentinel"])
@pytest.mark.parametrize("budget", [Budget(ratio=5), Budget(ratio=20, early_stop=True), Budget(target_tokens=3),
                                    Budget(ratio=1), Budget(threshold=0.5)])
def test_a_filter_explains_exactly_what_it_kept(method, budget, counter, example):
    comp = get_compressor(method, counter=counter)
    plain = comp.compress(example.question, example.passages, budget)
    ctx = comp.compress(example.question, example.passages, budget, explain=True)
    assert ctx.text == plain.text and ctx.tokens_out == plain.tokens_out and plain.explanation is None
    ex = ctx.explanation
    assert ex is not None and ex.method == method and ex.kind == "text"
    assert [p.index for p in ex.passages] == list(range(len(example.passages)))  # every input passage, in order
    assert explained(ex) == kept_of(ctx)
    for pe, p in zip(ex.passages, example.passages, strict=True):
        assert [s.span for s in pe.sentences] == split_sentences(p.text)  # every sentence, with its span
        assert pe.tokens_in == counter.count(p.text)
        assert pe.tokens_out == sum(cp.tokens_out for cp in ctx.passages if cp.index == pe.index)
        for s in pe.sentences:
            assert s.tokens == counter.count(p.text[s.span[0]:s.span[1]])
            assert (s.reason in ("score", "link", "back_reference", "granularity", "input")) == s.kept
    scored = ctx.stopped_by != "input"
    assert ex.scored == scored and all((s.score is not None) == scored for p in ex.passages for s in p.sentences)
    if scored:  # a kept sentence's score is the one the result reports for it
        by = {(cp.index, k): sc for cp in ctx.passages for k, sc in zip(cp.sentence_ids, cp.scores, strict=True)}
        assert all(s.score == pytest.approx(by[(p.index, s.sentence)], abs=1e-6)
                   for p in ex.passages for s in p.sentences if s.kept)
    reasons = {s.reason for p in ex.passages for s in p.sentences}
    if ctx.stopped_by == "min_score":
        assert "min_score" in reasons
    if budget.threshold is not None and ctx.stopped_by == "threshold":
        assert "threshold" in reasons
    if budget.ratio == 1:
        assert reasons <= {"input", "duplicate"}


def test_the_reasons_of_a_filter(counter):
    """Link completion, back-references, repeats, the budget and the early stop each named."""
    comp = get_compressor("bm25", counter=counter, complete_links=True, back_references=True)
    ctx = comp.compress("What is the name of the cat?", [ANA, BOB, ANA], Budget(ratio=3), explain=True)
    reasons = {(p.index, s.sentence): (s.kept, s.reason) for p in ctx.explanation.passages for s in p.sentences}
    assert reasons[(0, 1)] == (True, "score")  # "She has a cat named Tux."
    assert reasons[(0, 0)] == (True, "back_reference")  # "Ana lives in Lisbon.": what "She" refers back to
    assert reasons[(0, 2)] == (False, "budget")
    assert ctx.explanation.passages[2].duplicate_of == 0
    assert all(s.reason == "duplicate" and not s.kept for s in ctx.explanation.passages[2].sentences)
    linked = comp.compress("Who did Bob meet in school?", [BOB, ANA], Budget(target_tokens=14), explain=True)
    why = {(p.index, s.sentence): (s.kept, s.reason) for p in linked.explanation.passages for s in p.sentences}
    assert why[(0, 2)] == (True, "score")  # "Bob met Ana in school." names passage Ana ...
    assert [s.reason for s in linked.explanation.passages[1].sentences if s.kept] == ["link"]  # ... which comes too
    early = get_compressor("bm25", counter=counter, min_score=0.1).compress(Q, [ANA, BOB], Budget(ratio=2),
                                                                           explain=True)
    assert early.stopped_by == "min_score"
    why = {(p.index, s.sentence): (s.kept, s.reason, s.score) for p in early.explanation.passages for s in p.sentences}
    assert all(r == "min_score" for kept, r, sc in why.values() if sc < 0.1)
    assert all(kept for kept, r, sc in why.values() if r == "score") and why[(1, 2)][:2] == (False, "budget")


@pytest.mark.parametrize("method", ["none", "no_context", "oracle"])
def test_reference_methods_are_explained_from_their_output(method, counter, example):
    ctx = get_compressor(method, counter=counter).compress(example.question, example.passages, Budget(ratio=4),
                                                           explain=True)
    ex = ctx.explanation
    assert not ex.scored and all(s.score is None for p in ex.passages for s in p.sentences)
    kept = {"none": {"passed_through"}, "no_context": set(), "oracle": {"evidence"}}[method]
    assert {s.reason for p in ex.passages for s in p.sentences if s.kept} == kept
    if method == "oracle":  # the sentences the evidence spans touch, and only those
        for pe, p in zip(ex.passages, example.passages, strict=True):
            gold = list(p.evidence or ())
            assert all(s.kept == any(max(s.span[0], a) < min(s.span[1], b) for a, b in gold) for s in pe.sentences)


def test_soft_methods_report_slots_and_ratio_per_passage(counter, example):
    comp = get_compressor("icae", counter=counter)
    ctx = comp.compress(example.question, example.passages, explain=True)
    ex = ctx.explanation
    assert ex.kind == "soft" and not ex.scored
    for pe, cp in zip(ex.passages, ctx.passages, strict=True):
        rows = None if cp.embeds is None else int(cp.embeds.shape[0])
        assert pe.slots == rows and pe.tokens_out == cp.tokens_out
        assert pe.ratio == pytest.approx(cp.tokens_in / cp.tokens_out)
        assert {s.reason for s in pe.sentences} == ({"slots"} if rows else {"passed_through"})


def test_a_composition_explains_the_filter_and_the_slots(counter, example):
    comp = get_compressor("sentinel+icae", counter=counter)
    ctx = comp.compress(example.question, example.passages, Budget(ratio=40), explain=True)
    text = comp.first.compress(example.question, example.passages, comp.filter_budget(Budget(ratio=40)))
    ex = ctx.explanation
    assert ex.method == "sentinel+icae" and ex.kind == "soft" and ex.scored
    assert explained(ex) == kept_of(text)  # the sentences the filter kept are the ones the slots stand for
    slots = {cp.index: int(cp.embeds.shape[0]) for cp in ctx.passages if cp.embeds is not None}
    assert {p.index: p.slots for p in ex.passages if p.slots is not None} == slots
    assert sum(p.tokens_out for p in ex.passages) == ctx.tokens_out
    assert all(torch.is_tensor(cp.embeds) for cp in ctx.passages if cp.index in slots)


def test_explain_later_from_the_result(counter):
    ctx = get_compressor("bm25", counter=counter).compress(Q, [ANA, BOB], Budget(ratio=2))
    assert ctx.explanation is None
    assert explained(ctx.explain()) == kept_of(ctx) and ctx.explanation is not None


# -- the proxy ---------------------------------------------------------------------------------------------------
def chat(**kw) -> dict:
    return {"model": "fake", "messages": [{"role": "user", "content": Q}], "documents": [ANA, BOB], "max_tokens": 4,
            **kw}


@pytest.fixture(scope="module")
def proxy(smol_tokenizer):
    app = create_app(ProxySettings(served_model_name="fake", method="bm25", ratio=2.0),
                     backend=FakeBackend(smol_tokenizer, model_name="fake"))
    return TestClient(app, raise_server_exceptions=False)


def test_proxy_explains_when_asked(proxy, counter):
    plain = proxy.post("/v1/chat/completions", json=chat()).json()["compression"]
    assert "explanation" not in plain  # the block stays as it was unless asked
    block = proxy.post("/v1/chat/completions", json=chat(compression={"explain": True})).json()["compression"]
    ex = Explanation.model_validate(block["explanation"][0])
    direct = get_compressor("bm25", counter=counter).compress(Q, [ANA, BOB], Budget(ratio=2), explain=True)
    assert ex == direct.explanation and block["tokens_after"] == direct.tokens_out
    assert proxy.post("/v1/chat/completions", json=chat(compression={"explain": "maybe"})).status_code == 400


def test_completion_explanations_are_per_prompt(proxy):
    body = {"model": "fake", "prompt": [f"<document>{ANA['text']}</document> {Q}", "No documents here."],
            "max_tokens": 2, "compression": {"explain": True}}
    block = proxy.post("/v1/completions", json=body).json()["compression"]
    assert len(block["explanation"]) == 2 and block["explanation"][1] is None
    assert len(block["explanation"][0]["passages"]) == 1


def test_inspect_compress_route(proxy):
    r = proxy.post("/inspect/compress", json={"question": Q, "documents": [ANA, BOB],
                                              "compression": {"method": "minilm", "ratio": 3}})
    assert r.status_code == 200, r.text
    block = r.json()["compression"]
    assert block["method"] == "minilm" and block["explanation"][0]["scored"]
    bad = proxy.post("/inspect/compress", json={"question": Q, "documents": []})
    assert bad.status_code == 400 and "documents" in bad.json()["error"]["message"]


# -- the CLI -----------------------------------------------------------------------------------------------------
def test_eval_explain_writes_explanations_beside_out(tmp_path, capsys):
    out = tmp_path / "ev.json"
    rc = main(["eval", "--dataset", "hotpotqa", "--path", str(HOTPOT), "--method", "bm25", "--ratio", "4",
               "--limit", "2", "--no-generate", "--explain", "--out", str(out)])
    assert rc == 0
    recs = [json.loads(line) for line in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    for r in recs:
        ex = Explanation.model_validate(r["explanation"])
        assert sum(p.tokens_out for p in ex.passages) == r["tokens_out"]
    capsys.readouterr()
    assert main(["eval", "--dataset", "hotpotqa", "--path", str(HOTPOT), "--method", "bm25", "--explain"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--explain" in err and "--out" in err
