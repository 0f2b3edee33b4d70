from __future__ import annotations

import json

import pytest
from conftest import HOTPOT, NQ, SQUAD

from adapters.datasets import add_distractors, corpus_of, load_dataset
from adapters.metrics import accuracy, evidence_recall, exact_match, f1_score, normalize_answer
from compressor import CompressedContext, CompressedPassage, InputError, Passage


def test_normalisation_and_scores():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert exact_match("the Paris.", ["Paris"]) == 1.0
    assert f1_score("Pierre Curie", ["Marie Curie"]) == pytest.approx(0.5)
    assert accuracy("It was Paris, France", ["Paris"]) == 1.0
    assert accuracy("Parisian", ["Paris"]) == 0.0
    assert f1_score("x", []) == 0.0 and f1_score("", []) == 1.0  # unanswerable: empty answer is right


def test_evidence_recall_counts_covered_spans():
    p = Passage(text="Alpha one. Beta two. Gamma three.", evidence=((0, 10), (21, 33)))
    ctx = CompressedContext(method="x", kind="text", query="q", n_input_passages=1, tokens_in=9, tokens_out=3,
                            passages=[CompressedPassage(index=0, text="Alpha one.", spans=[(0, 10)])])
    assert evidence_recall(ctx, [p]) == 0.5
    assert evidence_recall(ctx, [Passage(text="no labels")]) is None


def test_hotpotqa_loader_marks_supporting_facts():
    exs = load_dataset("hotpotqa", HOTPOT, limit=5)
    assert len(exs) == 5
    ex = exs[0]
    assert len(ex.passages) == 10 and ex.answers == ["romance"]
    marked = [(p.title, p.text[s:e]) for p in ex.passages for s, e in p.evidence or ()]
    assert len(marked) == len(ex.gold_sentences) == 2
    assert all(t.strip() == t and t in ex.gold_sentences for _, t in marked)


def test_hotpotqa_json_list_format():
    exs = load_dataset("hotpotqa", HOTPOT.parent / "hotpotqa_train_b.json", limit=3)
    assert len(exs) == 3 and all(ex.passages for ex in exs)


def test_nq_and_squad_loaders():
    nq = load_dataset("nq", NQ, limit=3)
    assert nq[0].question.startswith("who got the first nobel") and nq[0].passages[0].evidence
    sq = load_dataset("squad", SQUAD, limit=5)
    assert all(ex.answers for ex in sq)
    sq_all = load_dataset("squad", SQUAD, limit=200, unanswerable=True)
    assert any(not ex.answers for ex in sq_all)


def test_distractors_exclude_gold_and_place_it_seeded():
    everything = load_dataset("nq", NQ, limit=200)
    exs = add_distractors(everything[:10], corpus_of(everything), k=4, seed=3)
    again = add_distractors(everything[:10], corpus_of(everything), k=4, seed=3)
    positions = []
    for ex, orig, ex2 in zip(exs, everything, again):
        assert len(ex.passages) == 5
        gold = [i for i, p in enumerate(ex.passages) if p.evidence]
        assert len(gold) == 1 and ex.passages[gold[0]].text == orig.passages[0].text
        assert sum(p.text == orig.passages[0].text for p in ex.passages) == 1
        assert [p.text for p in ex.passages] == [p.text for p in ex2.passages]
        positions.append(gold[0])
    assert len(set(positions)) > 1


def test_jsonl_loader_and_errors(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"question": "q?", "passages": ["a", {"text": "b", "title": "B"}], "answers": ["a"]}) + "\n")
    ex = load_dataset("jsonl", f)[0]
    assert [p.text for p in ex.passages] == ["a", "b"] and ex.passages[1].title == "B"
    f.write_text(json.dumps({"question": "q?"}) + "\n")
    with pytest.raises(InputError, match="d.jsonl:1"):
        load_dataset("jsonl", f)
    with pytest.raises(InputError, match="does not exist"):
        load_dataset("jsonl", tmp_path / "missing.jsonl")


@pytest.mark.parametrize("pred, out", [
    ("", True), ("Unanswerable.", True), ("The context does not mention his birthplace.", True),
    ("It is not mentioned in the passage", True), ("I don't know", True), ("This cannot be determined.", True),
    ("William Shakespeare", False), ("He is known for the notion of the unknowable", False),
    ("Paris, the capital of France", False),
])
def test_abstained(pred, out):
    from adapters.metrics import abstained

    assert abstained(pred) is out
