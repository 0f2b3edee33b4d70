from __future__ import annotations

import json

import pytest
from conftest import make_tiny_llama

from adapters.bench import BenchConfig, DatasetSpec, run_bench
from adapters.datasets import parse_dataset_label
from compressor import BaseModelMismatchError, InputError, UnknownNameError

PASSAGES = [{"title": "Hamlet", "text": "Hamlet is a tragedy. It was written by William Shakespeare around 1600."},
            {"title": "Cats", "text": "Cats sleep a lot. They purr. They chase mice at night."}]


def test_bench_grid_resumes_and_pairs(tmp_path, tiny_model_dir):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"q{i}", "question": f"Who wrote Hamlet {i}?", "passages": PASSAGES,
                                          "answers": ["William Shakespeare"] if i < 2 else []})  # q2: unanswerable
                              for i in range(3)) + "\n")
    cfg = BenchConfig(datasets=[DatasetSpec(label="toy", kind="jsonl", path=data)], methods=["none", "no_context", "bm25"],
                      ratios=[2.0, 3.0], decoders=[str(tiny_model_dir)], limit=3, max_new_tokens=3,
                      out_dir=tmp_path / "bench")
    rows = run_bench(cfg, progress=False, log=lambda s: None)
    lines = (tmp_path / "bench" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 3 * (1 + 1 + 2)
    by = {(r["method"], r["ratio_requested"]): r for r in rows}
    assert set(by) == {("none", None), ("no_context", None), ("bm25", 2.0), ("bm25", 3.0)}
    assert by[("bm25", 3.0)]["ratio"] >= 3.0 and "d_f1_ci95" in by[("bm25", 3.0)]
    assert (tmp_path / "bench" / "table.md").read_text().startswith("| decoder |")
    # abstention is the mean over the unanswerable question only, and gets a table column
    recs = [json.loads(x) for x in lines]
    q2 = [r for r in recs if r["id"] == "q2" and r["method"] == "none"][0]
    assert by[("none", None)]["abstention"] == float(q2["abstained"]) and q2["accuracy"] == float(q2["abstained"])
    assert "abstention" in (tmp_path / "bench" / "table.md").read_text().splitlines()[0]
    run_bench(cfg, progress=False, log=lambda s: None)  # resume: nothing left to do
    assert len((tmp_path / "bench" / "samples.jsonl").read_text().splitlines()) == len(lines)


def test_bench_rejects_unknown_method_early(tmp_path):
    cfg = BenchConfig(datasets=[], methods=["nope"], out_dir=tmp_path)
    with pytest.raises(UnknownNameError):
        run_bench(cfg, progress=False)


def test_dataset_labels(tmp_path):
    s = parse_dataset_label("squad-d9-u", tmp_path)
    assert s.kind == "squad" and s.distractors == 9 and s.unanswerable
    r = parse_dataset_label("nq-r3", tmp_path)
    assert r.kind == "nq" and r.retrieve == 3 and r.distractors == 0
    with pytest.raises(InputError):
        parse_dataset_label("nq-x", tmp_path)
    with pytest.raises(InputError, match="'squad-r3': retrieve applies to nq without distractors"):
        parse_dataset_label("squad-r3", tmp_path)
    with pytest.raises(InputError, match="'nq-d4-r3': retrieve applies to nq without distractors"):
        parse_dataset_label("nq-d4-r3", tmp_path)
    with pytest.raises(InputError, match="no such file"):
        parse_dataset_label(str(tmp_path / "mine.jsonl"), tmp_path)
    (tmp_path / "mine.jsonl").write_text("")
    j = parse_dataset_label(str(tmp_path / "mine.jsonl"), tmp_path)
    assert j.kind == "jsonl" and j.label == "mine"


def test_fixed_ratio_soft_method_runs_once_and_from_a_filled_cache(tmp_path, tiny_model_dir, smol_tokenizer):
    """A cacheable soft family (a tiny ICAE encoder) runs once per dataset, unbudgeted; ``NAME@cache`` reads
    slots the bench stored before timing, so it never encodes during the timed run."""
    from compressor import ConfigError
    from compressor.icae import ICAECompressor, ICAEConfig, ICAEEncoder
    from compressor.models import load_causal_lm
    from compressor.registry import _REGISTRY, register_compressor

    built = []

    def make(counter, cache_dir=None, decoder=None):
        if decoder != str(tiny_model_dir):
            raise BaseModelMismatchError(f"trained on {tiny_model_dir}, not {decoder}")
        cfg = ICAEConfig(base=str(tiny_model_dir), segment_tokens=16, lora_r=2, cache_dir=cache_dir)
        built.append(ICAECompressor(counter, ICAEEncoder(load_causal_lm(tiny_model_dir, "float32")[0], cfg),
                                    smol_tokenizer))
        return built[-1]

    register_compressor("toy_soft", make, kind="soft", description="test", fixed_ratio=True, cacheable=True)
    try:
        with pytest.raises(ConfigError, match="no per-passage cache"):
            run_bench(BenchConfig(datasets=[], methods=["bm25@cache"], out_dir=tmp_path), progress=False)
        data = tmp_path / "d.jsonl"
        data.write_text("\n".join(json.dumps({"id": f"q{i}", "question": f"Who wrote Hamlet {i}?", "passages": PASSAGES,
                                              "answers": ["William Shakespeare"]}) for i in range(2)) + "\n")
        other = tmp_path / "other-decoder"  # a second decoder: the soft family is skipped there, text methods run
        make_tiny_llama(len(smol_tokenizer), seed=1).save_pretrained(other)
        smol_tokenizer.save_pretrained(other)
        cfg = BenchConfig(datasets=[DatasetSpec(label="toy", kind="jsonl", path=data)],
                          methods=["toy_soft", "toy_soft@cache", "bm25"], ratios=[2.0],
                          decoders=[str(tiny_model_dir), str(other)], limit=2, max_new_tokens=2,
                          out_dir=tmp_path / "bench")
        logs = []
        rows = run_bench(cfg, progress=False, log=logs.append)
        assert {(r["decoder"], r["method"]) for r in rows} == {
            (str(tiny_model_dir), "toy_soft"), (str(tiny_model_dir), "toy_soft@cache"), (str(tiny_model_dir), "bm25"),
            (str(other), "bm25")}
        assert sum("skipped, trained on" in x for x in logs) == 2
        rows = [r for r in rows if r["method"] != "bm25"]
        assert all(r["ratio"] > 2.0 for r in rows)
        plain, cached = built
        assert plain.cache is None and plain.encoded_passages == 4
        assert cached.encoded_passages == 2 and cached.cache.hits == 4  # index: 2 passages, once; timed: 4 hits
    finally:
        _REGISTRY.pop("toy_soft", None)


def test_oracle_runs_only_where_evidence_is_labelled(tmp_path, tiny_model_dir):
    """Retrieval can miss the gold passage: those questions have no evidence, and the oracle skips them
    (its row counts the rest) instead of failing the grid."""
    with_ev = [{"title": "Hamlet", "text": PASSAGES[0]["text"], "evidence": [[0, 20]]}, PASSAGES[1]]
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"q{i}", "question": "Who wrote Hamlet?",
                                          "passages": with_ev if i == 0 else PASSAGES,
                                          "answers": ["William Shakespeare"]}) for i in range(3)) + "\n")
    cfg = BenchConfig(datasets=[DatasetSpec(label="toy", kind="jsonl", path=data)], methods=["none", "oracle"],
                      decoders=[str(tiny_model_dir)], limit=3, max_new_tokens=2, out_dir=tmp_path / "bench")
    rows = {r["method"]: r for r in run_bench(cfg, progress=False, log=lambda s: None)}
    assert rows["none"]["n"] == 3 and rows["oracle"]["n"] == 1
