from __future__ import annotations

import pytest

from compressor import Budget, InputError, Passage, TokenCounter, get_compressor
from compressor.text import split_sentences


def test_budget_validation():
    with pytest.raises(ValueError):
        Budget(ratio=0.5)
    with pytest.raises(ValueError):
        Budget(ratio=2, target_tokens=10)
    with pytest.raises(ValueError):
        Budget(target_tokens=0)
    assert Budget(ratio=4).max_tokens(100) == 25
    assert Budget(target_tokens=500).max_tokens(100) == 100  # larger than the input: keep everything
    assert Budget().max_tokens(100) is None


@pytest.mark.parametrize(
    "passages, match",
    [
        ([], "passages is empty"),
        ("just a string", "not a single str"),
        ([1, 2], r"passages\[0\] is a int"),
        (["ok", "   "], r"passages\[1\] is invalid"),
        ([{"txt": "typo"}], r"passages\[0\] is invalid"),
    ],
)
def test_bad_passages_named(counter, passages, match):
    with pytest.raises(InputError, match=match):
        get_compressor("none", counter=counter).compress("q?", passages)


@pytest.mark.parametrize("query", ["", "   ", None, 3])
def test_bad_query(counter, query):
    with pytest.raises(InputError, match="query"):
        get_compressor("none", counter=counter).compress(query, ["text"])


def test_bad_budget_named(counter):
    with pytest.raises(InputError, match="budget"):
        get_compressor("none", counter=counter).compress("q?", ["text"], {"ratio": -1})


def test_evidence_span_checked():
    with pytest.raises(ValueError, match="outside"):
        Passage(text="abc", evidence=((0, 10),))


def test_none_and_no_context(counter):
    ps = [{"text": "Paris is the capital of France.", "title": "Paris"}, "Berlin is in Germany."]
    full = get_compressor("none", counter=counter).compress("Capital of France?", ps)
    assert full.tokens_in == full.tokens_out > 0 and full.ratio == 1.0
    assert [p.index for p in full.passages] == [0, 1] and full.passages[0].title == "Paris"
    empty = get_compressor("no_context", counter=counter).compress("Capital of France?", ps)
    assert empty.passages == [] and empty.tokens_out == 0 and empty.ratio is None
    assert empty.tokens_in == full.tokens_in


def test_oracle_keeps_only_evidence(counter):
    text = "Noise here. Paris is the capital. More noise."
    s = text.index("Paris")
    p = Passage(text=text, evidence=((s, s + len("Paris is the capital.")),))
    ctx = get_compressor("oracle", counter=counter).compress("q?", [p, "unlabelled distractor."])
    assert ctx.text == "Paris is the capital." and len(ctx.passages) == 1
    with pytest.raises(InputError, match="evidence"):
        get_compressor("oracle", counter=counter).compress("q?", ["no labels"])


@pytest.mark.parametrize("text", ["One sentence only", "A. B. C.", "  Leading space. Dr. Who arrived.  ", "x"])
def test_sentence_spans_cover_text(text):
    spans = split_sentences(text)
    covered = "".join(text[s:e] for s, e in spans)
    assert covered.replace(" ", "") == text.replace(" ", "")
    assert all(s < e for s, e in spans) and spans == sorted(spans)
    assert all(text[s:e] == text[s:e].strip() for s, e in spans)


def test_empty_text_has_no_sentences():
    assert split_sentences("   ") == []


def test_token_counter_memo_and_batch_agree_with_encoding():
    calls = {"one": 0, "many": 0}

    def one(s):
        calls["one"] += 1
        return s.split()

    def many(texts):
        calls["many"] += 1
        return [t.split() for t in texts]

    c = TokenCounter(one, encode_many=many, memo=4)
    texts = ["a b", "c d e", "", "a b", "f", "g h i j"]
    assert c.count_many(texts) == [2, 3, 0, 2, 1, 4] == [len(t.split()) for t in texts]
    assert calls == {"one": 0, "many": 1}  # one batch, each distinct text once
    assert c.count("a b") == 2 and calls["one"] == 0  # memoised
    assert c.count_many(["x y", "z"]) == [2, 1]  # over the memo's size: it starts over, counts stay right
    assert len(c._memo) <= 4
    assert TokenCounter(one).count_many(["p q", "r"]) == [2, 1]  # without a batch form


def test_split_sentences_returns_a_fresh_list_each_call():
    a = split_sentences("One. Two.")
    a.append((0, 0))
    assert split_sentences("One. Two.") == [(0, 4), (5, 9)]
