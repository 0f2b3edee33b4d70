"""The ``ragpress`` command: parse, call a library function, format. Errors are turned into one readable line at
this edge. It lives in ``serving/`` beside the proxy: both are the user-facing edge, above ``adapters/``
(evaluation, indexing, training, the benchmark) and ``compressor/`` (the families), which never import it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .options import from_args as _from_args
from .options import model_options as _model_options

__all__ = ["main", "build_parser"]

DEFAULT_DECODER = "smollm2-135m-instruct"


def _add_method(p: argparse.ArgumentParser, decoder_help: str) -> None:
    p.add_argument("--method", required=True, help="a registered method (`ragpress methods`)")
    p.add_argument("--decoder", default=DEFAULT_DECODER, help=decoder_help)
    p.add_argument("--artifact", help="trained artifact folder for the method (default: the shipped one)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a config option of the method, repeatable; VALUE is read as JSON when it parses "
                        "(--option max_context_tokens=800 --option complete_links=false), else as a string")


def build_parser() -> argparse.ArgumentParser:
    from adapters.bench import add_bench_options
    from adapters.datasets import DATASETS, DatasetSpec
    from adapters.evaluate import EvalRequest
    from adapters.indexing import IndexEngine
    from adapters.train import SentinelTraining, SoftData, TextLoRA
    from compressor.base import Budget
    from compressor.icae.config import ICAEConfig, ICAETrainConfig
    from compressor.xrag.config import XRAGConfig, XRAGTrainConfig
    from serving.settings import ProxySettings

    ap = argparse.ArgumentParser(prog="ragpress", description="RAG context compression.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    ev = sub.add_parser("eval", help="answer a dataset with one method and score it")
    ev.add_argument("--dataset", required=True, choices=DATASETS)
    ev.add_argument("--path", required=True, type=Path)
    _add_method(ev, "named model or local HF folder")
    _model_options(ev, Budget)
    _model_options(ev, DatasetSpec, exclude={"label", "kind", "path"})
    _model_options(ev, EvalRequest, exclude={"dataset", "method", "budget", "decoder", "options", "generate",
                                             "fill_budget"})
    ev.add_argument("--out", type=Path, help="write the summary JSON here (per-sample JSONL beside it)")
    ev.add_argument("--slot-cache", type=Path, help="a cacheable method's cache folder (--option cache_dir=DIR); "
                    "passages already in it are not encoded again (run twice to time hits)")
    ev.add_argument("--no-generate", action="store_true", help="compress only: evidence recall, ratio and "
                    "compression time, no answers (the decoder's tokenizer still counts the budget)")
    ev.add_argument("--fill-budget", action="store_true", help="sentence filters: ignore the method's min_score "
                    "and fill the budget (the ranking, plus the method's link completion when it has it on)")

    ix = sub.add_parser("index", help="index time: fill a method's per-passage cache (sentinel sentence "
                                      "embeddings, icae slots) for a corpus, ahead of any question")
    _add_method(ix, "the decoder the method serves (its tokenizer splits and counts; soft methods encode for it)")
    ix.add_argument("--cache-dir", required=True,
                    help="the cache: a folder or an fsspec URL (s3://...); compress with the same")
    src = ix.add_mutually_exclusive_group(required=True)
    src.add_argument("--passages", type=Path, help="JSONL, one passage per line: a string or {\"title\", \"text\"}")
    src.add_argument("--dataset", choices=DATASETS, help="index every passage of this dataset file (--path)")
    ix.add_argument("--path", type=Path, help="the dataset file, with --dataset")
    ix.add_argument("--limit", type=int, help="with --dataset: the first N questions' passages")
    _model_options(ix, IndexEngine)

    md = sub.add_parser("models", help="list or provision the named default models")
    md.add_argument("action", choices=["list", "provision"], nargs="?", default="list")
    md.add_argument("names", nargs="*")
    sub.add_parser("methods", help="list the registered compressor families")

    sv = sub.add_parser("serve", help="run the OpenAI-compatible compression proxy")
    _model_options(sv, ProxySettings, exclude={"api_keys", "upstream_api_key"}, rename={"timeout_s": "--timeout"})
    sv.add_argument("--api-key", action="append", dest="api_keys", default=argparse.SUPPRESS,
                    help="accepted bearer key (repeatable; or RAGPRESS_API_KEYS=k1,k2); none: no auth")

    add_bench_options(sub.add_parser("bench", help="methods x ratios x datasets, side by side, resumable"))

    tsub = sub.add_parser("train", help="train a compressor family and write its artifact").add_subparsers(
        dest="family", required=True)
    ts = tsub.add_parser("sentinel", help="train the attention probe (reproduces the shipped artifact)")
    ts.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    _model_options(ts, SentinelTraining)
    for family, config, train_config, what in (("xrag", XRAGConfig, XRAGTrainConfig, "the xRAG bridge (one soft "
                                                "row per passage)"),
                                               ("icae", ICAEConfig, ICAETrainConfig, "the ICAE encoder (LoRA + "
                                                "memory slots)"),
                                               ("text-lora", TextLoRA, ICAETrainConfig, "the fine-tuned uncompressed "
                                                "baseline (a decoder LoRA reading text, a soft family's records and targets)")):
        tp = tsub.add_parser(family, help=f"train {what}")
        tp.add_argument("--out", type=Path, required=True, help="artifact folder to write")
        tp.add_argument("--work-dir", type=Path, help=f"checkpoints and loss log (default runs/{family}-train/<out>)")
        tp.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work-dir")
        tp.set_defaults(configs=(config, train_config))
        for model in (config, train_config, SoftData):
            _model_options(tp, model, exclude={"encode_batch_size", "embed_batch_size", "cache_dir"})
    return ap


def _method_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for item in args.option:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--option {item!r}: write KEY=VALUE, e.g. --option max_context_tokens=800")
        try:
            opts[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            opts[key.strip()] = raw
    if args.artifact:
        opts["artifact"] = args.artifact
    if getattr(args, "slot_cache", None):
        opts["cache_dir"] = str(args.slot_cache)
    return opts


def cmd_eval(args: argparse.Namespace) -> int:
    from adapters.datasets import DatasetSpec, make_spec
    from adapters.evaluate import EvalRequest, run_eval, write_eval
    from compressor import Budget, InputError

    if getattr(args, "explain", False) and not args.out:
        raise InputError("--explain writes each question's explanation into the .samples.jsonl beside --out; give --out")
    spec = make_spec(label=args.dataset, kind=args.dataset, path=args.path,
                     **{k: v for k, v in vars(args).items() if k in DatasetSpec.model_fields and k != "path"})
    req = _from_args(EvalRequest, args, dataset=spec, method=args.method, decoder=args.decoder,
                     budget=_from_args(Budget, args), options=_method_options(args), generate=not args.no_generate,
                     fill_budget=args.fill_budget)
    result = run_eval(req, log=lambda m: print(m, file=sys.stderr))
    keys = ["n", "method", "ratio_requested", "target_tokens", "ratio", "n_rounded", "n_errors", "em", "f1",
            "accuracy", "evidence_recall", "tokens_in_mean", "tokens_out_mean", "compress_s_mean", "ttft_s_mean",
            "e2e_s_mean", "stopped_by"]
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    print("| " + " | ".join(_fmt(result.summary.get(k)) for k in keys) + " |")
    if result.summary["n_errors"]:
        first = next(r for r in result.records if r.get("error"))
        print(f"{result.summary['n_errors']} of {result.summary['n']} questions failed (scored as misses; "
              f"{_fmt(result.summary['errors'])}); the first, {first['id']}: {first['error']['type']}: "
              f"{first['error']['message']} (--fail-fast stops at the first)", file=sys.stderr)
    if args.out:
        print(f"wrote {write_eval(result, args.out)}")
    return 0


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return " ".join(f"{k} {n}" for k, n in v.items()) or "-"
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def cmd_index(args: argparse.Namespace) -> int:
    from adapters.datasets import corpus_of, load_dataset, load_passages
    from adapters.indexing import IndexEngine, index_corpus

    if args.dataset and args.path is None:
        raise SystemExit("--dataset needs --path, the dataset file")
    if not args.dataset and (args.path is not None or args.limit is not None):
        raise SystemExit("--path and --limit apply to --dataset; --passages reads the whole file")
    passages = corpus_of(load_dataset(args.dataset, args.path, limit=args.limit)) if args.dataset else \
        load_passages(args.passages)
    print(json.dumps(index_corpus(args.method, passages, args.cache_dir, args.decoder, _method_options(args),
                                  **_from_args(IndexEngine, args).model_dump())))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from adapters.bench import bench_config, markdown_table, run_bench

    print(markdown_table(run_bench(bench_config(args))))
    print(f"wrote {args.out_dir}/summary.json, table.md, samples.jsonl and plots")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from adapters.train import SentinelTraining, SoftData, train_sentinel_artifact, train_soft

    if args.family == "sentinel":
        path, report = train_sentinel_artifact(args.out, _from_args(SentinelTraining, args))
        print(f"chosen: {report['chosen']}\nwrote {path}")
        return 0
    Config, TrainConfig = args.configs  # the family's config models, set by its sub-parser
    path, report = train_soft(args.family, _from_args(Config, args), _from_args(TrainConfig, args),
                              _from_args(SoftData, args), args.out, args.work_dir, resume=args.resume)
    print(json.dumps({k: v for k, v in report.items() if k not in ("train_config", "log")}, indent=2))
    trained = report["stage1_steps_done"] + report["stage2_steps_done"] > 0
    print(f"wrote {path}" + ("" if trained else " (untrained control: \"trained\": false)"))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from compressor.models import NAMED_MODELS, model_fingerprint, resolve_model

    for n in args.names or list(NAMED_MODELS):
        if args.action == "provision":
            print(f"{n}\t{resolve_model(n)}\tsha256={model_fingerprint(n)[:16]}")
        else:
            spec = NAMED_MODELS.get(n)
            print(f"{n}\t{spec.role if spec else '?'}\t{spec.description if spec else ''}\t({spec.pip if spec else ''})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from compressor.errors import require_extra

    for module in ("fastapi", "uvicorn", "httpx"):
        require_extra(module, "serve")
    from serving.app import serve
    from serving.settings import ProxySettings

    keys = [k for k in os.environ.get("RAGPRESS_API_KEYS", "").split(",") if k.strip()]
    serve(_from_args(ProxySettings, args, **({} if "api_keys" in vars(args) else {"api_keys": keys}),
                     upstream_api_key=os.environ.get("RAGPRESS_UPSTREAM_API_KEY")))
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from compressor import available_compressors

    for name, spec in available_compressors().items():
        note = "" if spec.shipped else "  (no shipped artifact: pass --artifact DIR)"
        print(f"{name}\t{spec.kind}\t{spec.description}{note}")
    return 0


def _one_line(e: Exception, cmd: str) -> str:
    """A pydantic error of the user's options as one line: the fields and what is wrong, never their values
    (an API key may be among them)."""
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        detail = "; ".join(f"{'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors())
        return f"{cmd} options are invalid: {detail}"
    return str(e)


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from compressor.errors import RagpressError

    args = build_parser().parse_args(argv)
    handlers = {"eval": cmd_eval, "models": cmd_models, "methods": cmd_methods, "train": cmd_train, "bench": cmd_bench,
                "serve": cmd_serve, "index": cmd_index}
    try:
        return handlers[args.cmd](args)
    except (RagpressError, ValidationError) as e:
        name = f"{args.cmd} {args.family}" if args.cmd == "train" else args.cmd
        print(f"ragpress: error: {_one_line(e, name)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
