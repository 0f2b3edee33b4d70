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
    with pytest.raises(SystemExit, match="--fill-budget applies to sentence filters"):
        main(["eval", "--dataset", "hotpotqa", "--path", str(HOTPOT), "--limit", "1", "--method", "none",
              "--decoder", str(tiny_model_dir), "--no-generate", "--fill-budget"])


def test_cli_eval_method_options(tmp_path, tiny_model_dir):
    """--option KEY=VALUE reaches the method's config (JSON values), is recorded in the summary, and a wrong key,
    a malformed item or a method built from an artifact is refused with the fix."""
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
    with pytest.raises(SystemExit, match=r"bm25 does not take these options: \('nope',\)"):
        main(base + ["--method", "bm25", "--option", "nope=1"])
    with pytest.raises(SystemExit, match="write KEY=VALUE"):
        main(base + ["--method", "bm25", "--option", "min_score"])
    with pytest.raises(SystemExit, match="--option applies to methods built by name"):
        main(base + ["--method", "xrag", "--option", "min_score=1"])


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
