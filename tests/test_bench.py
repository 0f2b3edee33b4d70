from __future__ import annotations

import json

import pytest

from adapters.bench import BenchConfig, DatasetSpec, run_bench
from compressor import InputError, UnknownNameError
from serving.cli import parse_dataset_label

PASSAGES = [{"title": "Hamlet", "text": "Hamlet is a tragedy. It was written by William Shakespeare around 1600."},
            {"title": "Cats", "text": "Cats sleep a lot. They purr. They chase mice at night."}]


def test_bench_grid_resumes_and_pairs(tmp_path, tiny_model_dir):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"q{i}", "question": f"Who wrote Hamlet {i}?", "passages": PASSAGES,
                                          "answers": ["William Shakespeare"]}) for i in range(3)) + "\n")
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
    run_bench(cfg, progress=False, log=lambda s: None)  # resume: nothing left to do
    assert len((tmp_path / "bench" / "samples.jsonl").read_text().splitlines()) == len(lines)


def test_bench_rejects_unknown_method_early(tmp_path):
    cfg = BenchConfig(datasets=[], methods=["nope"], out_dir=tmp_path)
    with pytest.raises(UnknownNameError):
        run_bench(cfg, progress=False)


def test_dataset_labels(tmp_path):
    s = parse_dataset_label("squad-d9-u", tmp_path)
    assert s.kind == "squad" and s.distractors == 9 and s.unanswerable
    with pytest.raises(InputError):
        parse_dataset_label("nq-x", tmp_path)
