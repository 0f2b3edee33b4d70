"""The ``ragpress`` command: thin; parses, calls a library function, formats. Errors are turned into one
readable line at this edge."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]


def _add_budget(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ratio", type=float, help="compression ratio (tokens in / tokens out), >= 1")
    g.add_argument("--target-tokens", type=int, help="keep at most this many context tokens")
    p.add_argument("--threshold", type=float, help="score threshold (sentence filters)")


def _add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a config option of a registered method, repeatable; VALUE is read as JSON when it parses "
                        "(--option max_context_tokens=800 --option complete_links=false), else as a string")


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
    ev.add_argument("--slot-cache", type=Path,
                    help="icae: slot cache folder; passages already in it are not encoded again (run twice to time hits)")
    ev.add_argument("--no-generate", action="store_true",
                    help="compress only: evidence recall, ratio and compression time, no answers (the decoder's "
                         "tokenizer still counts the budget)")
    ev.add_argument("--fill-budget", action="store_true",
                    help="sentence filters: ignore the method's min_score and fill the budget (the ranking, plus the "
                         "method's link completion when it has it on)")
    ev.add_argument("--retrieve", type=int, default=0, metavar="K",
                    help="nq: top-K passages retrieved (MiniLM, index cached under $RAGPRESS_HOME/indexes) from all "
                         "passages of the file, instead of the gold passage")
    _add_option(ev)

    ix = sub.add_parser("index", help="index time: fill a method's per-passage cache (sentinel sentence "
                                      "embeddings, icae slots) for a corpus, ahead of any question")
    ix.add_argument("--method", required=True, help="a method with a per-passage cache: sentinel or icae")
    ix.add_argument("--cache-dir", required=True, type=Path, help="the cache folder; compress with the same cache_dir")
    src = ix.add_mutually_exclusive_group(required=True)
    src.add_argument("--passages", type=Path, help="JSONL, one passage per line: a string or {\"title\", \"text\"}")
    src.add_argument("--dataset", choices=["hotpotqa", "nq", "squad", "jsonl"],
                     help="index every passage of this dataset file (--path)")
    ix.add_argument("--path", type=Path, help="the dataset file, with --dataset")
    ix.add_argument("--limit", type=int, help="with --dataset: the first N questions' passages")
    ix.add_argument("--decoder", default="smollm2-135m-instruct",
                    help="the decoder the method serves (its tokenizer splits and counts; soft methods encode for it)")
    ix.add_argument("--artifact", help="trained artifact folder for the method (default: the shipped one)")
    _add_option(ix)
    ix.add_argument("--chunk", type=int, default=256, help="passages per step of the progress bar")

    md = sub.add_parser("models", help="list or provision the named default models")
    md.add_argument("action", choices=["list", "provision"], nargs="?", default="list")
    md.add_argument("names", nargs="*")

    sub.add_parser("methods", help="list the registered compressor families")

    sv = sub.add_parser("serve", help="run the OpenAI-compatible compression proxy")
    sv.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0: the whole network)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--method", default="bm25", help="default compression method (a text method)")
    svb = sv.add_mutually_exclusive_group()
    svb.add_argument("--ratio", type=float, help="default compression ratio; unset: the method's default")
    svb.add_argument("--target-tokens", type=int, help="default document-token budget")
    sv.add_argument("--model", default="smollm2-135m-instruct", help="in-process decoder (named or HF folder)")
    sv.add_argument("--served-model-name", help="model name clients send (default: --model)")
    sv.add_argument("--upstream", help="remote OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1")
    sv.add_argument("--tokenizer", help="tokenizer counting document tokens (default: --model's)")
    sv.add_argument("--api-key", action="append", default=None,
                    help="accepted bearer key (repeatable; or RAGPRESS_API_KEYS=k1,k2); none: no auth")
    sv.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    sv.add_argument("--timeout", type=float, default=120.0, help="upstream / generation timeout, seconds")
    sv.add_argument("--max-documents", type=int, default=256, help="documents per request (400 over)")
    sv.add_argument("--max-document-tokens", type=int, default=32_768, help="document tokens per request (400 over)")
    sv.add_argument("--max-sentence-tokens", type=int, default=4_096,
                    help="longest sentence a filter compresses (400 over)")

    bn = sub.add_parser("bench", help="methods x ratios x datasets, side by side, resumable")
    bn.add_argument("--datasets", nargs="+", default=["hotpotqa", "nq-d9"],
                    help="hotpotqa | nq | squad, with -dK for K distractors and -u for SQuAD unanswerable (squad-d9-u)")
    bn.add_argument("--methods", nargs="+", default=["none", "no_context", "oracle", "bm25", "minilm", "sentinel"])
    bn.add_argument("--ratios", nargs="+", type=float, default=[3.0, 5.0])
    bn.add_argument("--decoders", nargs="+", default=["smollm2-135m-instruct"])
    bn.add_argument("--limit", type=int, default=100)
    bn.add_argument("--data", type=Path, default=Path("../shared/data"))
    bn.add_argument("--out-dir", type=Path, default=Path("runs/bench"))
    bn.add_argument("--seed", type=int, default=0)

    tr = sub.add_parser("train", help="train a compressor family and write its artifact")
    tsub = tr.add_subparsers(dest="family", required=True)
    ts = tsub.add_parser("sentinel", help="train the attention probe (reproduces the shipped artifact)")
    ts.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
    ts.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    ts.add_argument("--proxy", default="smollm2-135m-instruct")
    ts.add_argument("--embedder", default="minilm-l6", help="sentence embedder of the embed_* features")
    ts.add_argument("--hotpotqa", type=int, default=200, help="HotpotQA training questions")
    ts.add_argument("--nq", type=int, default=150, help="NQ training questions")
    ts.add_argument("--squad", type=int, default=150, help="SQuAD training questions")
    ts.add_argument("--seed", type=int, default=0)
    ts.add_argument("--features-cache", type=Path, help="npz cache of extracted features (reused if present)")
    ts.add_argument("--layers", type=int, help="force the early-exit depth (default: chosen by cross-validation)")
    ts.add_argument("--min-score", type=float, help="probe score below which sentences are dropped even when the "
                    "budget has room (chosen with research/choose_min_score.py; default: fill the budget)")
    ts.add_argument("--rerank", choices=["auto", "yes", "no"], default="auto",
                    help="second stage (multi-hop re-scoring from the probe's scores): auto keeps it when its "
                    "cross-validated recall@20%% beats the probe alone")
    ts.add_argument("--complete-links", action="store_true", help="store complete_links=True in the artifact: a "
                    "kept sentence naming another passage's title brings that passage's best sentence")
    _add_train_xrag(tsub)
    _add_train_icae(tsub)
    return ap


def _add_staged_options(p: argparse.ArgumentParser, d: Any) -> None:
    """Options every soft family's training has: precision, checkpoints, data selection, seed."""
    p.add_argument("--precision", choices=["bf16", "fp32"], default=d.precision)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--distractors", type=int, default=0, help="stage 2: K BM25 passages around each NQ gold one")
    p.add_argument("--n-stage1", type=int, help="use at most this many stage-1 passages")
    p.add_argument("--n-nq", type=int, help="use at most this many NQ training questions")
    p.add_argument("--n-squad", type=int, help="use at most this many SQuAD training questions")
    p.add_argument("--seed", type=int, default=d.seed)


def _add_train_icae(tsub: Any) -> None:
    from compressor.icae.config import ICAEConfig, ICAETrainConfig

    c, d = ICAEConfig(), ICAETrainConfig()
    ti = tsub.add_parser("icae", help="train the ICAE encoder (LoRA + memory slots)")
    ti.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
    ti.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    ti.add_argument("--work-dir", type=Path, help="checkpoints and loss log (default runs/icae-train/<out>)")
    ti.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work-dir")
    ti.add_argument("--base", default=c.base, help="base model = frozen decoder (named or HF folder)")
    ti.add_argument("--ratio", type=float, default=c.ratio, help="segment tokens per memory slot")
    ti.add_argument("--segment-tokens", type=int, default=c.segment_tokens)
    ti.add_argument("--accumulate", action="store_true", help="AutoCompressor-style summary accumulation")
    ti.add_argument("--lora-r", type=int, default=c.lora_r)
    ti.add_argument("--lora-alpha", type=float, default=c.lora_alpha)
    ti.add_argument("--lora-targets", default=c.lora_targets)
    ti.add_argument("--stage1-steps", type=int, default=d.stage1_steps, help="autoencoding + LM pretraining steps")
    ti.add_argument("--stage2-steps", type=int, default=d.stage2_steps, help="question -> answer tuning steps")
    ti.add_argument("--batch-size", type=int, default=d.batch_size)
    ti.add_argument("--stage1-lr", type=float, default=d.stage1_lr)
    ti.add_argument("--stage2-lr", type=float, default=d.stage2_lr)
    ti.add_argument("--lm-fraction", type=float, default=d.lm_fraction)
    ti.add_argument("--curriculum-start-tokens", type=int, default=d.curriculum_start_tokens)
    ti.add_argument("--curriculum-fraction", type=float, default=d.curriculum_fraction)
    ti.add_argument("--kl-weight", type=float, default=d.kl_weight, help="stage-2 weight of the KL to the text teacher")
    _add_staged_options(ti, d)


def _add_train_xrag(tsub: Any) -> None:
    from compressor.xrag.config import XRAGConfig, XRAGTrainConfig

    d = XRAGTrainConfig()
    tx = tsub.add_parser("xrag", help="train the xRAG bridge (one soft row per passage)")
    tx.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
    tx.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    tx.add_argument("--work-dir", type=Path, help="checkpoints, loss log, vector cache (default runs/xrag-train/<out>)")
    tx.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work-dir")
    tx.add_argument("--decoder", default="smollm2-135m-instruct")
    tx.add_argument("--embedder", default="minilm-l6")
    tx.add_argument("--bridge-width", type=int, default=XRAGConfig().bridge_width)
    tx.add_argument("--stage1-steps", type=int, default=d.stage1_steps, help="paraphrase pretraining steps")
    tx.add_argument("--stage2-steps", type=int, default=d.stage2_steps, help="question -> answer tuning steps")
    tx.add_argument("--batch-size", type=int, default=d.batch_size)
    tx.add_argument("--stage1-lr", type=float, default=d.stage1_lr)
    tx.add_argument("--stage2-lr", type=float, default=d.stage2_lr)
    tx.add_argument("--kl-weight", type=float, default=d.kl_weight, help="stage-2 self-distillation weight")
    tx.add_argument("--max-passage-tokens", type=int, default=d.max_passage_tokens)
    _add_staged_options(tx, d)


_TRAINED_SOFT = ("xrag", "icae")


def _method_options(args: argparse.Namespace, decoder: str) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if getattr(args, "artifact", None):
        opts["artifact"] = args.artifact
    for item in getattr(args, "option", None) or ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--option {item!r}: write KEY=VALUE, e.g. --option max_context_tokens=800")
        try:
            opts[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            opts[key.strip()] = raw
    return opts


def _build_method(args: argparse.Namespace, counter: Any, opts: dict[str, Any]) -> Any:
    """The method built by name with ``opts``; options its config does not take leave as one line."""
    from pydantic import ValidationError

    from compressor import get_compressor

    try:
        return get_compressor(args.method, counter=counter, **opts)
    except ValidationError as e:
        raise SystemExit(f"ragpress {args.cmd}: {args.method} does not take these options: "
                         f"{e.errors()[0]['loc']} {e.errors()[0]['msg']} (see `ragpress methods`)") from None


def cmd_eval(args: argparse.Namespace) -> int:
    from adapters.decoders import GenerationParams, HFBackend
    from adapters.datasets import add_distractors, corpus_of, load_dataset
    from adapters.evaluate import evaluate, summarize
    from compressor import Budget, TokenCounter, get_spec

    if args.method not in _TRAINED_SOFT:  # these may be unregistered (nothing shipped) yet load with --artifact
        get_spec(args.method)
    elif args.option:
        raise SystemExit(f"--option applies to methods built by name; {args.method} is configured by its --artifact")
    budget = Budget(ratio=args.ratio, target_tokens=args.target_tokens, threshold=args.threshold)
    if args.distractors and args.dataset not in ("nq", "squad"):
        raise SystemExit("--distractors applies to --dataset nq or squad")
    index, extra = None, {}
    if args.retrieve and (args.dataset != "nq" or args.distractors):
        raise SystemExit("--retrieve applies to --dataset nq, without --distractors")
    if args.distractors:
        everything = load_dataset(args.dataset, args.path, unanswerable=args.unanswerable)
        examples = add_distractors(everything[: args.limit], corpus_of(everything), args.distractors, seed=args.seed)
    elif args.retrieve:
        from adapters.retrieval import retrieve_examples

        examples, index, info = retrieve_examples(load_dataset("nq", args.path), args.limit, args.retrieve)
        extra = {"retrieve": args.retrieve, "gold_recall_at_k": info["gold_recall_at_k"], "index": info["index"]}
    else:
        examples = load_dataset(args.dataset, args.path, limit=args.limit, unanswerable=args.unanswerable)
    backend = HFBackend.load(args.decoder)
    counter = TokenCounter.from_tokenizer(backend.tokenizer)
    if args.method == "xrag":
        from compressor.xrag import load_xrag

        comp = load_xrag(counter, args.artifact, decoder=args.decoder, index=index)
        extra.update(artifact=args.artifact, trained=comp.trained)
        if not comp.trained:
            print("xrag: UNTRAINED bridge (control)", file=sys.stderr)
    elif args.method == "icae":
        from compressor.icae import load_icae

        comp = load_icae(counter, args.artifact, decoder=args.decoder,
                         cache_dir=str(args.slot_cache) if args.slot_cache else None)
        extra.update(artifact=args.artifact, trained=comp.trained)
        if not comp.trained:
            print("icae: UNTRAINED encoder (control)", file=sys.stderr)
    else:
        opts = _method_options(args, args.decoder)
        comp = _build_method(args, counter, opts)
        if args.option:
            extra["options"] = {k: v for k, v in opts.items() if k != "artifact"}  # recorded in the summary
    if args.fill_budget:
        from compressor.filters import SentenceFilter

        if not isinstance(comp, SentenceFilter):
            raise SystemExit(f"--fill-budget applies to sentence filters (bm25, minilm, sentinel), not {args.method}")
        comp.config = comp.config.model_copy(update={"min_score": None})
        extra["fill_budget"] = True
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    records = evaluate(examples, backend, comp, budget, params, generate=not args.no_generate)
    if args.method == "xrag":
        extra.update(index_hits=comp.index_hits, encoded_on_the_fly=comp.encoded_on_the_fly)
    if args.method == "icae":
        extra.update(encoded_passages=comp.encoded_passages,
                     slot_cache_hits=comp.cache.hits if comp.cache else None)
    if hasattr(comp, "run_stats"):  # longllmlingua: how much its hard budget cap trimmed
        extra.update(comp.run_stats())
    summary = summarize(records, args.method, args.ratio, dataset=args.dataset, decoder=args.decoder,
                        distractors=args.distractors, target_tokens=args.target_tokens, **extra)
    _print_table(summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        with open(args.out.with_suffix(".samples.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {args.out}")
    return 0


def _read_passages(path: Path) -> list[Any]:
    """The passages of a JSONL file, one per line (a string or an object); blank lines are skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"--passages {path}: line {n} is not JSON ({e.msg}); write one passage per line, "
                                 'a JSON string or {"title": ..., "text": ...}') from None
    return out


def cmd_index(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from compressor import TokenCounter, get_spec
    from compressor.base import coerce_passages
    from compressor.models import load_tokenizer

    spec = get_spec(args.method)
    if not spec.cacheable:
        raise SystemExit(f"ragpress index: {args.method} keeps no per-passage cache; index with a method that has "
                         "one (sentinel, icae)")
    if args.chunk < 1:
        raise SystemExit(f"--chunk {args.chunk}: give a positive number of passages per step")
    if args.dataset:
        from adapters.datasets import corpus_of, load_dataset

        if args.path is None:
            raise SystemExit("--dataset needs --path, the dataset file")
        passages = corpus_of(load_dataset(args.dataset, args.path, limit=args.limit))
    else:
        if args.path is not None or args.limit is not None:
            raise SystemExit("--path and --limit apply to --dataset; --passages reads the whole file")
        passages = coerce_passages(_read_passages(args.passages))
    opts = {**_method_options(args, args.decoder), "cache_dir": str(args.cache_dir)}
    if spec.kind == "soft":
        opts["decoder"] = args.decoder
    comp = _build_method(args, TokenCounter.from_tokenizer(load_tokenizer(args.decoder)), opts)
    totals = {"passages": 0, "computed": 0, "cached": 0, "duplicates": 0, "skipped": 0, "seconds": 0.0}
    for i in tqdm(range(0, len(passages), args.chunk), desc=f"index {args.method}", unit="chunk",
                  disable=len(passages) <= args.chunk):
        rep = comp.index(passages[i:i + args.chunk])
        for k in totals:
            totals[k] += getattr(rep, k)
    print(json.dumps({"method": args.method, "cache_dir": str(args.cache_dir), **totals,
                      "seconds": round(totals["seconds"], 3)}))
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


_DATA_FILES = {
    "hotpotqa": "hotpotqa_train/hotpotqa_train_a.jsonl",
    "nq": "nq_open/nq-open-oracle-even.jsonl.gz",
    "squad": "squad_v2_dev_subset/squad_v2_dev_first5articles.json",
}


def parse_dataset_label(label: str, data: Path) -> Any:
    """'nq-d9' -> NQ with 9 distractors; 'nq-r3' -> NQ with the top 3 retrieved passages; 'squad-d4-u' ->
    SQuAD with unanswerable questions too; a path ending in '.jsonl' -> your own records (see the README)."""
    from adapters.bench import DatasetSpec
    from compressor.errors import InputError

    if label.endswith(".jsonl"):
        if not Path(label).is_file():
            raise InputError(f"bench dataset {label!r}: no such file; give the path of a JSONL file of records")
        return DatasetSpec(label=Path(label).stem, kind="jsonl", path=Path(label))
    parts = label.split("-")
    kind = parts[0]
    if kind not in _DATA_FILES:
        raise InputError(f"unknown bench dataset {label!r}: use hotpotqa, nq or squad, with -dK, -rK (nq) and -u "
                         "suffixes, or the path of a .jsonl file")
    k, r, u = 0, 0, False
    for p in parts[1:]:
        if p[:1] in ("d", "r") and p[1:].isdigit():
            k, r = (int(p[1:]), r) if p[0] == "d" else (k, int(p[1:]))
        elif p == "u":
            u = True
        else:
            raise InputError(f"unknown suffix {p!r} in bench dataset {label!r}: use -dK, -rK or -u")
    try:
        return DatasetSpec(label=label, kind=kind, path=data / _DATA_FILES[kind], distractors=k, unanswerable=u,
                           retrieve=r)
    except ValueError as e:
        raise InputError(f"bench dataset {label!r}: -rK (retrieval) applies to nq, without -dK") from e


def cmd_bench(args: argparse.Namespace) -> int:
    from adapters.bench import BenchConfig, markdown_table, run_bench

    cfg = BenchConfig(datasets=[parse_dataset_label(d, args.data) for d in args.datasets], methods=args.methods,
                      ratios=args.ratios, decoders=args.decoders, limit=args.limit, seed=args.seed,
                      out_dir=args.out_dir)
    rows = run_bench(cfg)
    print(markdown_table(rows))
    print(f"wrote {args.out_dir}/summary.json, table.md, samples.jsonl and plots")
    return 0


def _train_soft(args: argparse.Namespace, family: str, make: Callable[[], tuple[Any, Any]], train_fn: Any) -> int:
    """Shared by the trained soft families: options -> records -> (resumable) training -> artifact."""
    from pydantic import ValidationError

    from adapters.training_data import xrag_records
    from compressor.errors import ConfigError

    try:
        config, train = make()
    except ValidationError as e:
        raise ConfigError(f"train {family} options are invalid: {e}") from None
    texts, qa, data = xrag_records(args.data, args.n_stage1, args.n_nq, args.n_squad, args.distractors, seed=args.seed)
    work = args.work_dir or Path("runs") / f"{family}-train" / args.out.name
    comp, report = train_fn(texts, qa, work, config, train, resume=args.resume)
    trained = report["stage1_steps_done"] + report["stage2_steps_done"] > 0
    path = comp.save_pretrained(args.out, trained=trained,
                                training={"data": data, **{k: v for k, v in report.items() if k != "log"}})
    print(json.dumps({k: v for k, v in report.items() if k != "train_config"}, indent=2))
    print(f"wrote {path}" + ("" if trained else " (untrained control: \"trained\": false)"))
    return 0


def cmd_train_xrag(args: argparse.Namespace) -> int:
    from compressor.xrag.config import XRAGConfig, XRAGTrainConfig
    from compressor.xrag.train import train_xrag

    return _train_soft(args, "xrag", lambda: (
        XRAGConfig(embedder=args.embedder, decoder=args.decoder, bridge_width=args.bridge_width),
        XRAGTrainConfig(stage1_steps=args.stage1_steps, stage2_steps=args.stage2_steps, batch_size=args.batch_size,
                        stage1_lr=args.stage1_lr, stage2_lr=args.stage2_lr, kl_weight=args.kl_weight,
                        max_passage_tokens=args.max_passage_tokens, precision=args.precision,
                        checkpoint_every=args.checkpoint_every, seed=args.seed)), train_xrag)


def cmd_train_icae(args: argparse.Namespace) -> int:
    from compressor.icae.config import ICAEConfig, ICAETrainConfig
    from compressor.icae.train import train_icae

    return _train_soft(args, "icae", lambda: (
        ICAEConfig(base=args.base, ratio=args.ratio, segment_tokens=args.segment_tokens, accumulate=args.accumulate,
                   lora_r=args.lora_r, lora_alpha=args.lora_alpha, lora_targets=args.lora_targets),
        ICAETrainConfig(stage1_steps=args.stage1_steps, stage2_steps=args.stage2_steps, batch_size=args.batch_size,
                        stage1_lr=args.stage1_lr, stage2_lr=args.stage2_lr, lm_fraction=args.lm_fraction,
                        curriculum_start_tokens=args.curriculum_start_tokens,
                        curriculum_fraction=args.curriculum_fraction, kl_weight=args.kl_weight,
                        precision=args.precision, checkpoint_every=args.checkpoint_every, seed=args.seed)), train_icae)


def cmd_train(args: argparse.Namespace) -> int:
    if args.family == "xrag":
        return cmd_train_xrag(args)
    if args.family == "icae":
        return cmd_train_icae(args)
    from adapters.training_data import sentinel_records
    from compressor import TokenCounter
    from compressor.models import load_tokenizer
    from compressor.sentinel.train import train_sentinel

    records, data = sentinel_records(args.data, args.hotpotqa, args.nq, args.squad, seed=args.seed)
    counter = TokenCounter.from_tokenizer(load_tokenizer(args.proxy))
    comp, report = train_sentinel(records, counter, proxy=args.proxy, embedder=args.embedder, seed=args.seed,
                                  features_cache=args.features_cache, layers=args.layers, min_score=args.min_score,
                                  rerank={"auto": None, "yes": True, "no": False}[args.rerank],
                                  complete_links=args.complete_links)
    training = {"data": data, **{k: v for k, v in report.items()
                                 if k not in ("chosen", "grid", "layout_ablation", "rerank")}}
    if args.min_score is not None:
        training["min_score"] = (f"{args.min_score:g}: best mean answer F1 (SmolLM2-135M and Gemma 3 270M, ratio 5) "
                                 "on the validation questions, by research/choose_min_score.py")
    if args.complete_links:
        training["complete_links"] = ("on: paired answer F1 on the HotpotQA training questions scored out of fold, "
                                      "by research/link_completion.py (see the README)")
    scores = {**report["chosen"], "rerank": report["rerank"], "layout_ablation": report["layout_ablation"],
              "grid": report["grid"]}
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


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from compressor.errors import ConfigError, require_extra

    for module in ("fastapi", "uvicorn", "httpx"):
        require_extra(module, "serve")
    from pydantic import ValidationError

    from serving.app import ProxySettings, serve

    keys = args.api_key or [k for k in os.environ.get("RAGPRESS_API_KEYS", "").split(",") if k.strip()]
    try:
        settings = ProxySettings(
            host=args.host, port=args.port, method=args.method, ratio=args.ratio, target_tokens=args.target_tokens,
            model=args.model, served_model_name=args.served_model_name, upstream=args.upstream,
            upstream_api_key=os.environ.get("RAGPRESS_UPSTREAM_API_KEY"), tokenizer=args.tokenizer, api_keys=keys,
            max_body_bytes=args.max_body_bytes, timeout_s=args.timeout, max_documents=args.max_documents,
            max_document_tokens=args.max_document_tokens, max_sentence_tokens=args.max_sentence_tokens)
    except ValidationError as e:
        detail = "; ".join(f"{'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors())  # no values: keys
        raise ConfigError(f"serve options are invalid: {detail}") from None
    serve(settings)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from compressor import available_compressors

    for name, spec in available_compressors().items():
        print(f"{name}\t{spec.kind}\t{spec.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from compressor.errors import RagpressError

    args = build_parser().parse_args(argv)
    handlers = {"eval": cmd_eval, "models": cmd_models, "methods": cmd_methods, "train": cmd_train, "bench": cmd_bench,
                "serve": cmd_serve, "index": cmd_index}
    try:
        return handlers[args.cmd](args)
    except RagpressError as e:
        print(f"ragpress: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
