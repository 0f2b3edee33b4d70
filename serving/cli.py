"""The ``ragpress`` command: thin; parses, calls a library function, formats. Errors are turned into one
readable line at this edge."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]


def _add_budget(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ratio", type=float, help="compression ratio (tokens in / tokens out), >= 1")
    g.add_argument("--target-tokens", type=int, help="keep at most this many context tokens")
    p.add_argument("--threshold", type=float, help="score threshold (sentence filters)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ragpress", description="RAG context compression.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    ev = sub.add_parser("eval", help="answer a dataset with one method and score it")
    ev.add_argument("--dataset", required=True, choices=["hotpotqa", "nq", "squad", "jsonl"])
    ev.add_argument("--path", required=True, type=Path)
    ev.add_argument("--method", required=True)
    _add_budget(ev)
    ev.add_argument("--limit", type=int)
    ev.add_argument("--decoder", default="smollm2-135m-instruct", help="named model or local HF folder")
    ev.add_argument("--distractors", type=int, default=0, help="nq/squad: add K BM25 distractor passages")
    ev.add_argument("--unanswerable", action="store_true", help="squad: include unanswerable questions")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--max-new-tokens", type=int, default=32)
    ev.add_argument("--out", type=Path, help="write the summary JSON here (per-sample JSONL beside it)")
    ev.add_argument("--artifact", help="trained artifact folder for the method (default: the shipped one)")

    md = sub.add_parser("models", help="list or provision the named default models")
    md.add_argument("action", choices=["list", "provision"], nargs="?", default="list")
    md.add_argument("names", nargs="*")

    sub.add_parser("methods", help="list the registered compressor families")

    tr = sub.add_parser("train", help="train a compressor family and write its artifact")
    tsub = tr.add_subparsers(dest="family", required=True)
    ts = tsub.add_parser("sentinel", help="train the attention probe (reproduces the shipped artifact)")
    ts.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
    ts.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    ts.add_argument("--proxy", default="smollm2-135m-instruct")
    ts.add_argument("--hotpotqa", type=int, default=200, help="HotpotQA training questions")
    ts.add_argument("--nq", type=int, default=150, help="NQ training questions")
    ts.add_argument("--squad", type=int, default=150, help="SQuAD training questions")
    ts.add_argument("--seed", type=int, default=0)
    return ap


def _method_options(args: argparse.Namespace, decoder: str) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if getattr(args, "artifact", None):
        opts["artifact"] = args.artifact
    return opts


def cmd_eval(args: argparse.Namespace) -> int:
    from adapters.backends import GenerationParams, HFBackend
    from adapters.datasets import add_distractors, corpus_of, load_dataset
    from adapters.evaluate import evaluate, summarize
    from compressor import Budget, TokenCounter, get_compressor, get_spec

    get_spec(args.method)
    budget = Budget(ratio=args.ratio, target_tokens=args.target_tokens, threshold=args.threshold)
    if args.distractors and args.dataset not in ("nq", "squad"):
        raise SystemExit("--distractors applies to --dataset nq or squad")
    if args.distractors:
        everything = load_dataset(args.dataset, args.path, unanswerable=args.unanswerable)
        examples = add_distractors(everything[: args.limit], corpus_of(everything), args.distractors, seed=args.seed)
    else:
        examples = load_dataset(args.dataset, args.path, limit=args.limit, unanswerable=args.unanswerable)
    backend = HFBackend.load(args.decoder)
    counter = TokenCounter.from_tokenizer(backend.tokenizer)
    comp = get_compressor(args.method, counter=counter, **_method_options(args, args.decoder))
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    records = evaluate(examples, backend, comp, budget, params)
    summary = summarize(records, args.method, args.ratio, dataset=args.dataset, decoder=args.decoder,
                        distractors=args.distractors, target_tokens=args.target_tokens)
    _print_table(summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        with open(args.out.with_suffix(".samples.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {args.out}")
    return 0


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _print_table(s: dict[str, Any]) -> None:
    keys = ["n", "method", "ratio_requested", "em", "f1", "accuracy", "evidence_recall", "tokens_in_mean",
            "tokens_out_mean", "ratio", "compress_s_mean", "ttft_s_mean", "e2e_s_mean"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    print("| " + " | ".join(_fmt(s.get(k)) for k in keys) + " |")


def cmd_train(args: argparse.Namespace) -> int:
    from adapters.training_data import sentinel_records
    from compressor import TokenCounter
    from compressor.models import load_tokenizer
    from compressor.sentinel.train import train_sentinel

    records, data = sentinel_records(args.data, args.hotpotqa, args.nq, args.squad, seed=args.seed)
    counter = TokenCounter.from_tokenizer(load_tokenizer(args.proxy))
    comp, report = train_sentinel(records, counter, proxy=args.proxy, seed=args.seed)
    training = {"data": data, **{k: v for k, v in report.items() if k not in ("chosen", "grid")}}
    scores = {**report["chosen"], "grid": report["grid"]}
    path = comp.save_pretrained(args.out, training=training, scores=scores)
    print(f"chosen: {report['chosen']}\nwrote {path}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from compressor.models import NAMED_MODELS, model_fingerprint, resolve_model

    names = args.names or list(NAMED_MODELS)
    for n in names:
        if args.action == "provision":
            path = resolve_model(n)
            print(f"{n}\t{path}\tsha256={model_fingerprint(n)[:16]}")
        else:
            spec = NAMED_MODELS.get(n)
            print(f"{n}\t{spec.role if spec else '?'}\t{spec.description if spec else ''}\t({spec.pip if spec else ''})")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from compressor import available_compressors

    for name, spec in available_compressors().items():
        print(f"{name}\t{spec.kind}\t{spec.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from compressor.errors import RagpressError

    args = build_parser().parse_args(argv)
    handlers = {"eval": cmd_eval, "models": cmd_models, "methods": cmd_methods, "train": cmd_train}
    try:
        return handlers[args.cmd](args)
    except RagpressError as e:
        print(f"ragpress: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
