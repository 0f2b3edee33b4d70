from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DATA, HOTPOT, NQ, SQUAD

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


def _hotpot_record(rid) -> dict:
    return {"_id": rid, "question": "Where was Ana born?", "answer": "Porto", "type": "bridge", "level": "easy",
            "supporting_facts": [["Ana", 0]], "context": [["Ana", ["Ana was born in Porto.", " She paints."]],
                                                         ["Rain", ["It rained."]]]}


def test_integer_ids_are_taken_as_strings(tmp_path):
    """The public HotpotQA dev distractor file has integer ``_id``s: a JSON array or JSON lines, they load."""
    arr = tmp_path / "dev.json"
    arr.write_text(json.dumps([_hotpot_record(5), _hotpot_record("5ab")]))
    lines = tmp_path / "dev.jsonl"
    lines.write_text(json.dumps(_hotpot_record(7)) + "\n")
    assert [e.id for e in load_dataset("hotpotqa", arr)] == ["5", "5ab"]
    ex = load_dataset("hotpotqa", lines)[0]
    assert ex.id == "7" and ex.gold_sentences == ["Ana was born in Porto."] and ex.passages[0].evidence
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"id": 12, "question": "q?", "passages": ["a b"], "answers": ["a"]}) + "\n")
    assert load_dataset("jsonl", mine)[0].id == "12"


@pytest.mark.parametrize("kind,content,where,field", [
    ("hotpotqa", [json.dumps(_hotpot_record(1)), json.dumps({**_hotpot_record(2), "question": None})],
     "x.jsonl:2", "'question'"),
    ("hotpotqa", [json.dumps(_hotpot_record(1)), "{not json"], "x.jsonl:2", "not JSON"),
    ("hotpotqa", [json.dumps({**_hotpot_record(1), "supporting_facts": [["Ana", "first"]]})], "x.jsonl:1",
     "'supporting_facts.0.1'"),
    ("nq", [json.dumps({"question": "q", "answers": ["a"], "ctxs": [{"title": "t"}]})], "x.jsonl:1", "'ctxs.0.text'"),
    ("jsonl", ["", json.dumps({"question": "q?", "passages": [{"txt": "b"}]})], "x.jsonl:2", "'passages.0.text'"),
    ("jsonl", [json.dumps({"question": "q?"})], "x.jsonl:1", "'passages'"),
    ("squad", ['{"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": [{"question": "q"}]}]}]}'],
     "x.jsonl: data[0]", "'paragraphs.0.qas.0.id'"),
    ("squad", ['{"version": 2}'], "x.jsonl", "'data'"),
])
def test_a_malformed_record_is_one_line_naming_file_line_and_field(tmp_path, kind, content, where, field):
    f = tmp_path / "x.jsonl"
    f.write_text("\n".join(content) + "\n")
    with pytest.raises(InputError) as e:
        load_dataset(kind, f)
    msg = str(e.value)
    assert msg.startswith(f"{f.parent}/{where}") and field in msg and "\n" not in msg, msg


def test_passages_file_is_checked_line_by_line(tmp_path):
    from adapters.datasets import load_passages

    f = tmp_path / "p.jsonl"
    f.write_text('"plain text"\n\n{"title": "T", "text": "body"}\n')
    assert [(p.title, p.text) for p in load_passages(f)] == [(None, "plain text"), ("T", "body")]
    f.write_text('"ok"\n{"title": "T", "body": "x"}\n')
    with pytest.raises(InputError, match=r"p.jsonl:2: field 'text': Field required"):
        load_passages(f)
    f.write_text('"ok"\n   \n"   "\n')
    with pytest.raises(InputError, match=r"p.jsonl:3: field 'text'"):
        load_passages(f)


def test_cli_eval_reads_integer_ids_and_refuses_a_bad_record_in_one_line(tmp_path, tiny_model_dir, capsys):
    from serving.cli import main

    f = tmp_path / "dev.json"
    f.write_text(json.dumps([_hotpot_record(i) for i in range(3)]))
    out = tmp_path / "s.json"
    assert main(["eval", "--dataset", "hotpotqa", "--path", str(f), "--method", "bm25", "--ratio", "2",
                 "--decoder", str(tiny_model_dir), "--no-generate", "--out", str(out)]) == 0
    assert [json.loads(x)["id"] for x in out.with_suffix(".samples.jsonl").read_text().splitlines()] == ["0", "1", "2"]
    capsys.readouterr()
    f.write_text(json.dumps([_hotpot_record(0), {**_hotpot_record(1), "context": "oops"}]))
    assert main(["eval", "--dataset", "hotpotqa", "--path", str(f), "--method", "bm25",
                 "--decoder", str(tiny_model_dir), "--no-generate"]) == 2
    err = capsys.readouterr().err
    assert err == f"ragpress: error: {f}: record 1: field 'context': Input should be a valid list; " \
                  "a HotpotQA record has _id, question, answer, supporting_facts [[title, i]] and context " \
                  "[[title, [sentences]]]\n"


def test_validation_past_100_questions_is_kept_back_from_training():
    """n_val > 100: the soft families' validation takes NQ 300..399 and then the last NQ training questions,
    which the training records then leave out; up to 100 the training records do not change."""
    from adapters.training_data import distill_val_records, val_tail, xrag_records

    assert val_tail(50) == val_tail(100) == 0 and val_tail(130) == 30
    val, where = distill_val_records(DATA, 130, distractors=0)
    assert "[300:400] and [" in where and len(val) > 100
    _, base, _ = xrag_records(DATA, n_stage1=0)
    assert [r.question for r in xrag_records(DATA, n_stage1=0, n_val=100)[1]] == [r.question for r in base]
    texts, qa, _ = xrag_records(DATA, n_stage1=None, n_val=130)
    kept_back = {r.question for r in val[-25:]}
    assert len(kept_back & {r.question for r in base}) >= 20 and not kept_back & {r.question for r in qa}
    assert not {p.text for r in val for p in r.passages} & set(texts)  # nor read in paraphrase pretraining


def test_text_baseline_reads_the_records_of_the_soft_run_it_stands_beside(monkeypatch, tmp_path):
    """``ragpress train text-lora --records xrag``: the fine-tuned uncompressed baseline of an xrag run trains on
    xrag's records (each question with its gold passage), without the questions its validation kept back."""
    import compressor.decoder_lora as D
    from adapters.train import SoftData, TextLoRA, train_text_lora_artifact
    from adapters.training_data import xrag_records
    from compressor.icae.config import ICAETrainConfig

    seen = {}
    monkeypatch.setattr(D, "train_text_lora", lambda qa, *a, **k: (seen.setdefault("qa", qa), ({}, {}))[1])
    monkeypatch.setattr(D, "save_decoder_adapter", lambda out, *a, **k: out)
    train_text_lora_artifact(TextLoRA(records="xrag"), ICAETrainConfig(stage1_steps=0), SoftData(data=DATA, n_val=130),
                             tmp_path / "a")
    want = xrag_records(DATA, 0, n_val=130)[1]
    assert [r.question for r in seen["qa"]] == [r.question for r in want] and len(want) > 1000
    assert all(len(r.passages) == 1 for r in seen["qa"])


def test_squad_train_file_joins_stage_2_with_its_provenance(tmp_path):
    """``--squad-train``: a SQuAD-format train file's answerable questions follow the shared data's in both
    families' records (paragraph, shortest answer; icae's with distractor paragraphs of the same file), the card
    names the file and its sha256, a paragraph of a held-out eval question is left out, and a missing or broken
    file is one line naming it."""
    import gzip
    import hashlib

    from adapters.training_data import distill_records, squad_train, xrag_records

    path = Path(__file__).resolve().parents[1] / "training" / "data" / "squad_v2_train_first10articles.json.gz"
    _, base, _ = xrag_records(DATA, n_stage1=0)
    _, qa, data = xrag_records(DATA, n_stage1=0, squad_train_file=path)
    more = qa[len(base):]
    assert [r.question for r in qa[:len(base)]] == [r.question for r in base] and len(more) == 4371
    assert more[0].question == "When did Beyonce start becoming popular?" and more[0].answer == "in the late 1990s"
    assert all(len(r.passages) == 1 and r.answer == min(r.answers, key=len) for r in more)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert f"4371 SQuAD answerable questions of {path.name} (sha256 {sha})" in data["stage2"]
    cut = xrag_records(DATA, n_stage1=0, squad_train_file=path, n_squad_train=100)[1][len(base):]
    assert [r.question for r in cut] == [more[i * 4371 // 100].question for i in range(100)]
    assert len({r.passages[0].title for r in cut}) == 10  # every article, not the first one's questions

    small = tmp_path / "train.json.gz"  # a held-out eval paragraph inside a train file is not trained on
    doc = json.loads(gzip.decompress(path.read_bytes()))
    eval_para = load_dataset("squad", SQUAD)[0].passages[0].text
    doc["data"] = doc["data"][:1]
    doc["data"][0]["paragraphs"] = doc["data"][0]["paragraphs"][:3]
    doc["data"][0]["paragraphs"][1]["context"] = eval_para
    small.write_bytes(gzip.compress(json.dumps(doc).encode()))
    held = {eval_para}
    kept, _ = squad_train(small, held)
    assert kept and all(e.passages[0].text != eval_para for e in kept)
    recs, prov = distill_records(DATA, 3, n_nq=5, n_squad=5, n_hotpot=2, squad_train_file=small)
    mine = recs[-len(kept):]
    assert [r.question for r in mine] == [e.question for e in kept] and "k distractor paragraphs of that file" in \
        prov["stage2"]
    texts = {p.text for e in kept for p in e.passages}
    assert all(len(r.passages) <= 4 and {p.text for p in r.passages} <= texts for r in mine)
    assert all(r.passages[i].text in texts for r in mine for i in r.evidence)

    with pytest.raises(InputError, match=r"^--squad-train .*nope.json: no such file"):
        squad_train(tmp_path / "nope.json", set())
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(InputError, match=r"bad.json.gz: cannot be read as gzip"):
        squad_train(bad, set())
