"""The ``longllmlingua`` outside peer: registered always, offline, within budget, in order, deterministic."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from compressor import Budget, InputError, MissingExtraError, available_compressors, get_compressor
from compressor.longllmlingua import LongLLMLinguaConfig

QUESTION = "Which river flows through the city where the Eiffel Tower stands?"
PASSAGES = [
    {"title": "Cats", "text": "Cats sleep for most of the day. They hunt small animals at night and groom "
                              "themselves often. Many people keep them as pets in small flats."},
    {"title": "Eiffel Tower", "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was "
                                      "designed by the company of Gustave Eiffel and finished in 1889."},
    {"title": "Paris", "text": "Paris is the capital of France. The river Seine flows through the city from "
                               "east to west, and many bridges cross it in the centre."},
]


def test_registered_even_without_the_package(counter, monkeypatch):
    assert "longllmlingua" in available_compressors()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llmlingua" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"ragpress\[bench\]"):
        get_compressor("longllmlingua", counter=counter)


def test_config_validates():
    with pytest.raises(ValueError, match="dtype"):
        LongLLMLinguaConfig(dtype="int8")
    with pytest.raises(ValueError, match="context_budget_extra"):
        LongLLMLinguaConfig(context_budget_extra=-1)
    with pytest.raises(ValueError, match="extra"):
        LongLLMLinguaConfig(reorder_context="sort")  # the paper's settings are fixed, not options


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network use in a test that must run offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_budget_over_input_is_a_no_op_without_the_scorer(counter):
    pytest.importorskip("llmlingua")
    comp = get_compressor("longllmlingua", counter=counter)
    ctx = comp.compress(QUESTION, PASSAGES, Budget(target_tokens=10_000))
    assert [p.text for p in ctx.passages] == [p["text"] for p in PASSAGES]
    assert ctx.tokens_out == ctx.tokens_in and comp._peer is None
    with pytest.raises(InputError, match="threshold"):
        comp.compress(QUESTION, PASSAGES, Budget(threshold=0.5))


@pytest.mark.real_model
def test_real_scorer_offline_within_budget_in_order_deterministic(counter, no_network):
    pytest.importorskip("llmlingua")
    import tiktoken

    from compressor.longllmlingua.compat import LocalEncoding

    real_encoding_for_model = tiktoken.encoding_for_model
    comp = get_compressor("longllmlingua", counter=counter)
    budget = Budget(ratio=3)
    first = comp.compress(QUESTION, PASSAGES, budget)
    assert isinstance(comp.peer.oai_tokenizer, LocalEncoding)  # tiktoken was never asked for its BPE file
    assert tiktoken.encoding_for_model is real_encoding_for_model  # the start-up swap is undone

    cap = budget.max_tokens(first.tokens_in)
    assert 0 < first.tokens_out <= cap
    assert [p.index for p in first.passages] == sorted({p.index for p in first.passages})
    for cp in first.passages:
        src = PASSAGES[cp.index]["text"]
        assert cp.text and cp.tokens_out == counter.count(cp.text) and cp.title == PASSAGES[cp.index]["title"]
        assert cp.spans and all(0 <= a < b <= len(src) for a, b in cp.spans)
        assert cp.spans == sorted(cp.spans) and cp.sentence_ids == [] and cp.scores == []
        # kept tokens are source text in source order: without whitespace, a subsequence of the kept spans
        assert _subsequence("".join(cp.text.split()), "".join("".join(src[a:b] for a, b in cp.spans).split()))
    stats = comp.run_stats()
    assert stats["longllmlingua_scored_calls"] == 1
    assert stats["longllmlingua_peer_tokens_out"] - stats["longllmlingua_tokens_out"] >= 0

    second = comp.compress(QUESTION, PASSAGES, budget)
    assert [(p.index, p.text, p.spans) for p in second.passages] == [(p.index, p.text, p.spans) for p in first.passages]


def _subsequence(small: str, big: str) -> bool:
    it = iter(big)
    return all(ch in it for ch in small)
