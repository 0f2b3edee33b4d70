from __future__ import annotations

import json

import pytest

from adapters import FakeBackend, RAGPipeline, compress_messages
from compressor import Budget, InputError, UnknownNameError, get_compressor
from serving.cli import main

PASSAGES = [{"title": "Hamlet", "text": "Hamlet is a tragedy. It was written by William Shakespeare around 1600."},
            {"title": "Cats", "text": "Cats sleep a lot. They purr."}]


def test_pipeline_one_call_with_fake_backend(smol_tokenizer):
    be = FakeBackend(smol_tokenizer, reply="William Shakespeare")
    pipe = RAGPipeline(decoder=be, method="bm25", budget=Budget(ratio=2))
    a = pipe.answer("Who wrote Hamlet?", PASSAGES)
    assert a.text == "William Shakespeare" and a.method == "bm25"
    assert a.tokens_out <= a.tokens_in // 2 and a.ratio >= 2
    assert a.prompt_tokens == len(be.calls[-1])
    text = smol_tokenizer.decode(be.calls[-1].token_ids)
    assert "Who wrote Hamlet?" in text and all(cp.text in text for cp in a.context.passages)


def test_pipeline_rejects_unknown_method_before_loading(smol_tokenizer):
    with pytest.raises(UnknownNameError, match="registered compressors are"):
        RAGPipeline(decoder=FakeBackend(smol_tokenizer), method="nope")


def test_compress_messages_wraps_create(counter):
    seen = {}

    def create(*, messages, model, temperature):
        seen.update(messages=messages, model=model, temperature=temperature)
        return "ok"

    wrapped = compress_messages(create, get_compressor("bm25", counter=counter), Budget(ratio=2))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who wrote Hamlet?"}]
    assert wrapped(messages=msgs, model="m", temperature=0.1, documents=PASSAGES) == "ok"
    assert seen["model"] == "m" and seen["temperature"] == 0.1
    assert seen["messages"][0] == msgs[0]  # the system prompt is untouched
    last = seen["messages"][1]["content"]
    assert last.startswith("Documents:\n[1] Hamlet:") and last.endswith("Question: Who wrote Hamlet?")
    assert msgs[1]["content"] == "Who wrote Hamlet?"  # the caller's list is not mutated
    assert wrapped.last_context.tokens_out <= wrapped.last_context.tokens_in // 2
    # without documents the call passes through unchanged
    wrapped(messages=msgs, model="m", temperature=0.0)
    assert seen["messages"] == msgs


def test_compress_messages_needs_a_question(counter):
    wrapped = compress_messages(lambda **kw: kw, get_compressor("none", counter=counter))
    with pytest.raises(InputError, match="last user message"):
        wrapped(messages=[{"role": "system", "content": "x"}], documents=["a"])


def test_cli_eval_writes_json(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"Who wrote Hamlet {i}?", "passages": PASSAGES,
                                          "answers": ["William Shakespeare"]}) for i in range(2)) + "\n")
    out = tmp_path / "out.json"
    rc = main(["eval", "--dataset", "jsonl", "--path", str(data), "--method", "bm25", "--ratio", "2",
               "--decoder", str(tiny_model_dir), "--max-new-tokens", "4", "--out", str(out)])
    assert rc == 0
    s = json.loads(out.read_text())
    for k in ["n", "method", "ratio_requested", "em", "f1", "accuracy", "evidence_recall", "tokens_in_mean",
              "tokens_out_mean", "ratio", "compress_s_mean", "ttft_s_mean", "e2e_s_mean"]:
        assert k in s, k
    assert s["n"] == 2 and s["method"] == "bm25" and s["ratio_requested"] == 2.0 and s["ratio"] >= 2.0
    assert s["evidence_recall"] is None
    assert len(out.with_suffix(".samples.jsonl").read_text().splitlines()) == 2
    assert "| n | method |" in capsys.readouterr().out


def test_eval_survives_one_bad_question(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """A question whose compressor raises is recorded in its sample line (class and message), scored as a miss
    and counted in the summary and the CLI's; the others are answered. --fail-fast stops at it."""
    from compressor.filters.bm25 import BM25Filter

    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"question": q, "passages": PASSAGES, "answers": ["William Shakespeare"]})
                              for q in ("Who wrote Hamlet?", "Which question breaks it?", "When was Hamlet written?"))
                    + "\n")
    real = BM25Filter.score_sentences

    def flaky(self, query, passages, sentences):
        if "breaks" in query:
            raise RuntimeError("scorer fell over")
        return real(self, query, passages, sentences)

    monkeypatch.setattr(BM25Filter, "score_sentences", flaky)
    out = tmp_path / "out.json"
    args = ["eval", "--dataset", "jsonl", "--path", str(data), "--method", "bm25", "--ratio", "2",
            "--decoder", str(tiny_model_dir), "--max-new-tokens", "4", "--out", str(out)]
    assert main(args) == 0
    s = json.loads(out.read_text())
    rows = [json.loads(x) for x in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert s["n"] == 3 and s["n_errors"] == 1 and s["errors"] == {"RuntimeError": 1}
    assert rows[1]["error"] == {"type": "RuntimeError", "message": "scorer fell over"}
    assert (rows[1]["f1"], rows[1]["em"], rows[1]["accuracy"], rows[1]["prediction"]) == (0.0, 0.0, 0.0, None)
    assert rows[0]["error"] is None and rows[2]["error"] is None and rows[0]["prediction"] is not None
    assert s["f1"] == pytest.approx((rows[0]["f1"] + rows[2]["f1"]) / 3)  # the miss counts
    assert s["tokens_in_mean"] == pytest.approx((rows[0]["tokens_in"] + rows[2]["tokens_in"]) / 2)
    captured = capsys.readouterr()
    head, _, row = captured.out.splitlines()[:3]
    assert dict(zip(head.split(" | "), row.split(" | ")))["n_errors"] == "1"
    assert "1 of 3 questions failed" in captured.err and "RuntimeError: scorer fell over" in captured.err
    with pytest.raises(RuntimeError, match="scorer fell over"):  # today's behaviour: the run stops there
        main(args + ["--fail-fast"])


def test_cli_eval_rounds_a_target_and_counts_it(tmp_path, tiny_model_dir):
    """A ratio no sentence fits is rounded up to one sentence per question, counted in n_rounded; with --strict
    the question fails instead, and is counted as an error."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "Who wrote Hamlet?", "passages": PASSAGES[:1],
                                "answers": ["William Shakespeare"]}) + "\n")
    out = tmp_path / "out.json"
    args = ["eval", "--dataset", "jsonl", "--path", str(data), "--method", "bm25", "--ratio", "50",
            "--decoder", str(tiny_model_dir), "--no-generate", "--out", str(out)]
    assert main(args) == 0
    s = json.loads(out.read_text())
    assert (s["n_rounded"], s["n_errors"], s["stopped_by"]) == (1, 0, {"granularity": 1}) and s["ratio"] < 50
    assert main(args + ["--strict"]) == 0
    s = json.loads(out.read_text())
    assert (s["n_rounded"], s["n_errors"], s["errors"]) == (0, 1, {"BudgetError": 1})


def test_cli_eval_compress_only_and_fill_budget(tmp_path, tiny_model_dir):
    """--no-generate scores the compression alone (no answers); --fill-budget drops a filter's min_score and is
    refused for other methods."""
    from conftest import HOTPOT

    from adapters.datasets import load_dataset

    out = tmp_path / "out.json"
    rc = main(["eval", "--dataset", "hotpotqa", "--path", str(HOTPOT), "--limit", "3", "--method", "bm25", "--ratio",
               "3", "--decoder", str(tiny_model_dir), "--no-generate", "--fill-budget", "--out", str(out)])
    s = json.loads(out.read_text())
    assert rc == 0 and s["f1"] is None and s["ttft_s_mean"] is None and s["fill_budget"] is True
    assert 0 < s["evidence_recall"] <= 1 and s["ratio"] >= 3
    rows = [json.loads(x) for x in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [e.id for e in load_dataset("hotpotqa", HOTPOT, limit=3)]
    assert all(r["prediction"] is None and r["e2e_s"] == r["compress_s"] for r in rows)


def test_cli_refusals_are_one_line(tmp_path, tiny_model_dir, capsys):
    """--fill-budget on a method that is no sentence filter, an option the method does not take, and a trained
    family whose artifact does not ship: exit 2 with one line naming the fix, no traceback."""
    from conftest import HOTPOT

    base = ["eval", "--dataset", "hotpotqa", "--path", str(HOTPOT), "--limit", "1", "--decoder", str(tiny_model_dir),
            "--no-generate"]
    for extra, want in ((["--method", "none", "--fill-budget"], "--fill-budget applies to sentence filters"),
                        (["--method", "bm25", "--option", "nope=1"], r"bm25 does not take these options: ('nope',)"),
                        (["--method", "xrag"], "no shipped xrag bridge")):
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("ragpress: error: ") and want in err and err.count("\n") == 1, err


def test_cli_eval_method_options(tmp_path, tiny_model_dir):
    """--option KEY=VALUE reaches the method's config (JSON values), is recorded in the summary, and a wrong key,
    a malformed item is refused with the fix."""
    from conftest import HOTPOT

    base = ["eval", "--dataset", "hotpotqa", "--path", str(HOTPOT), "--limit", "2", "--decoder", str(tiny_model_dir),
            "--no-generate", "--ratio", "3"]
    out = {k: tmp_path / f"{k}.json" for k in ("fill", "cut")}
    assert main(base + ["--method", "bm25", "--out", str(out["fill"])]) == 0
    assert main(base + ["--method", "bm25", "--option", "min_score=1e9", "--option", "title_in_score=false",
                        "--out", str(out["cut"])]) == 0
    fill, cut = (json.loads(out[k].read_text()) for k in ("fill", "cut"))
    assert cut["options"] == {"min_score": 1e9, "title_in_score": False} and "options" not in fill
    assert cut["tokens_out_mean"] < fill["tokens_out_mean"]  # only the best sentence passes a huge min_score
    with pytest.raises(SystemExit, match="write KEY=VALUE"):
        main(base + ["--method", "bm25", "--option", "min_score"])


def test_cli_errors_are_one_line(capsys, tmp_path):
    assert main(["eval", "--dataset", "jsonl", "--path", str(tmp_path / "x.jsonl"), "--method", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragpress: error: unknown compressor 'nope'")


def test_cli_methods_lists_registry(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "none\ttext" in out and "bm25\ttext" in out


def test_compress_messages_keeps_positional_messages(counter):
    seen = {}

    def pipeline_like(text_inputs, **kw):  # a transformers pipeline takes the messages positionally
        seen.update(text_inputs=text_inputs, kw=kw)
        return "ok"

    wrapped = compress_messages(pipeline_like, get_compressor("bm25", counter=counter), Budget(ratio=2))
    assert wrapped([{"role": "user", "content": "Who wrote Hamlet?"}], documents=PASSAGES, max_new_tokens=3) == "ok"
    assert seen["text_inputs"][0]["content"].startswith("Documents:") and seen["kw"] == {"max_new_tokens": 3}


def test_options_from_a_model_are_typed_and_keep_the_model_default():
    import argparse
    from typing import Literal

    from pydantic import BaseModel, Field

    from serving.options import from_args, model_options

    class Opts(BaseModel):
        steps: int = Field(default=3, ge=1, description="how many")
        rate: float | None = None
        mode: Literal["a", "b"] = "a"
        flag: bool = False
        maybe: bool | None = None
        names: list[str] = Field(default_factory=list)

    p = argparse.ArgumentParser()
    model_options(p, Opts, rename={"rate": "--lr"})
    assert from_args(Opts, p.parse_args([])) == Opts()
    o = from_args(Opts, p.parse_args(["--steps", "7", "--lr", "0.5", "--mode", "b", "--flag", "--names", "x", "y",
                                      "--no-maybe"]))
    assert o == Opts(steps=7, rate=0.5, mode="b", flag=True, names=["x", "y"], maybe=False)
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "c"])
    assert "how many (default: 3)" in p.format_help()


def test_cli_train_options_come_from_the_configs(capsys):
    """Every field of the training configs is an option of its `ragpress train` subcommand, so none is unreachable."""
    from adapters.train import SentinelTraining, SoftData
    from compressor.icae.config import ICAEConfig, ICAETrainConfig
    from serving.cli import build_parser

    args = build_parser().parse_args(["train", "icae", "--out", "x", "--stage1-steps", "5", "--lm-tokens", "8",
                                      "--accumulate", "--n-nq", "3"])
    assert (args.stage1_steps, args.lm_tokens, args.accumulate, args.n_nq) == (5, 8, True, 3)
    with pytest.raises(SystemExit):
        main(["train", "icae", "--help"])
    helptext = capsys.readouterr().out
    for model, skip in ((ICAEConfig, {"encode_batch_size", "cache_dir"}), (ICAETrainConfig, set()), (SoftData, set())):
        for name in set(model.model_fields) - skip:
            assert f"--{name.replace('_', '-')} " in helptext, name
    s = build_parser().parse_args(["train", "sentinel", "--out", "x", "--layers", "4", "--complete-links"])
    assert (s.layers, s.complete_links) == (4, True)
    assert set(vars(s)) - {"cmd", "family", "out"} <= set(SentinelTraining.model_fields)
