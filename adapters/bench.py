"""The benchmark: methods x ratios x datasets on the same decoder(s) and the same questions, in one process.

Resumable: every finished sample is appended to ``samples.jsonl`` keyed by (decoder, dataset, method, ratio,
id) and skipped on the next run. Outputs in ``out_dir``: ``samples.jsonl``, ``summary.json``, ``table.md``
and, when matplotlib is installed, ``f1_vs_ratio.png`` and ``latency.png``.

Differences from ``none`` are paired on the same questions, with a seeded bootstrap 95% interval.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from compressor.base import Budget, TokenCounter
from compressor.decoder_lora import load_decoder_adapter
from compressor.errors import BaseModelMismatchError, ConfigError
from compressor.registry import get_spec

from .datasets import DatasetSpec, load_examples, parse_dataset_label
from .decoders import GenerationParams, HFBackend, backend_for
from .evaluate import build_method, evaluate, summarize

__all__ = ["DatasetSpec", "BenchConfig", "add_bench_options", "bench_config", "run_bench", "summarize_bench",
           "REFERENCE_METHODS"]

REFERENCE_METHODS = ("none", "no_context", "oracle")
CACHED = "@cache"  # suffix: a cacheable method (icae slots, sentinel sentence embeddings) timed on cache hits;
# the cache is filled first, as an index would be ahead of time
STOP = "@stop"  # suffix: a sentence filter's early stop at its min_score (Budget.early_stop), e.g. sentinel@stop
CONTROLS = {"@zeroed": "zeroed", "@other": "other"}  # suffixes: a soft method's controls (evaluate's ``control``)
LORA = "@lora"  # suffix: the method read by the decoder with BenchConfig.text_adapter (the fine-tuned baseline)
SUFFIXES = (CACHED, STOP, *CONTROLS, LORA)


class BenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    datasets: list[DatasetSpec]
    methods: list[str]
    ratios: list[float] = Field(default_factory=lambda: [3.0, 5.0])
    decoders: list[str] = Field(default_factory=lambda: ["smollm2-135m-instruct"])
    limit: int | None = Field(default=100, ge=1)
    seed: int = 0
    max_new_tokens: int = Field(default=32, ge=1)
    out_dir: Path = Path("runs/bench")
    artifacts: dict[str, str] = Field(default_factory=dict, description="Method name -> artifact folder, for "
                                      "the trained families (default: the shipped artifact).")
    text_adapter: Path | None = Field(default=None, description="A decoder-lora artifact that NAME@lora methods "
                                      "are read through (the fine-tuned uncompressed baseline).")


def _key(r: dict) -> tuple:
    return (r["decoder"], r["dataset"], r["method"], r["ratio_requested"], r["id"])


def add_bench_options(p: argparse.ArgumentParser) -> None:
    """The grid's options, shared by ``ragpress bench`` and ``examples/benchmark.py``; read back with
    :func:`bench_config`."""
    p.add_argument("--datasets", nargs="+", default=["hotpotqa", "nq-d9"],
                   help="hotpotqa | nq | squad, with -dK for K distractors and -u for SQuAD unanswerable (squad-d9-u)")
    p.add_argument("--methods", nargs="+", default=["none", "no_context", "oracle", "bm25", "minilm", "sentinel"])
    p.add_argument("--ratios", nargs="+", type=float, default=[3.0, 5.0])
    p.add_argument("--decoders", nargs="+", default=["smollm2-135m-instruct"])
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
    p.add_argument("--out-dir", type=Path, default=Path("runs/bench"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--artifact", nargs="+", default=[], metavar="NAME=PATH",
                   help="an artifact folder for a trained method (icae=runs/icae-v2); default: the shipped one")
    p.add_argument("--text-adapter", type=Path, help="decoder-lora artifact read by NAME@lora methods")


def bench_config(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(datasets=[parse_dataset_label(d, args.data) for d in args.datasets], methods=args.methods,
                       ratios=args.ratios, decoders=args.decoders, limit=args.limit, seed=args.seed,
                       out_dir=args.out_dir, artifacts=_pairs(args.artifact), text_adapter=args.text_adapter)


def _pairs(items: Sequence[str]) -> dict[str, str]:
    bad = [x for x in items if "=" not in x]
    if bad:
        raise ConfigError(f"--artifact {bad[0]!r}: write NAME=PATH, for example icae=runs/icae-v2")
    return dict(x.split("=", 1) for x in items)


def run_bench(cfg: BenchConfig, progress: bool = True, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run (or resume) the grid; return the summary rows (also written to ``out_dir``)."""
    for m in cfg.methods:
        _method_spec(m)  # fail on a bad name before any model loads
        if LORA in m and cfg.text_adapter is None:
            raise ConfigError(f"bench method {m!r} reads through a text adapter: pass --text-adapter PATH (a "
                              "decoder-lora artifact from `ragpress train text-lora`)")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    samples_path = cfg.out_dir / "samples.jsonl"
    done = set()
    if samples_path.exists():
        for line in samples_path.read_text().splitlines():
            if line.strip():
                done.add(_key(json.loads(line)))
    (cfg.out_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    data = {d.label: load_examples(d, cfg.limit, cfg.seed).examples for d in cfg.datasets}
    params = GenerationParams(max_new_tokens=cfg.max_new_tokens)
    with open(samples_path, "a") as sink:
        for dec in cfg.decoders:
            backend = HFBackend.load(dec)
            counter = TokenCounter.from_tokenizer(backend.tokenizer)
            comps: dict[str, Any] = {}
            readers: dict[str, Any] = {}
            for spec in cfg.datasets:
                exs = data[spec.label]
                for m in cfg.methods:
                    fixed = _method_spec(m).name in REFERENCE_METHODS or _method_spec(m).fixed_ratio
                    ratios: Sequence[float | None] = [None] if fixed else cfg.ratios
                    for r in ratios:
                        todo = [e for e in exs if (dec, spec.label, m, r, e.id) not in done]
                        if m == "oracle":  # only questions with labelled evidence (retrieval can miss the gold)
                            todo = [e for e in todo if any(p.evidence for p in e.passages)]
                        if not todo:
                            continue
                        if m not in comps:
                            try:
                                comps[m] = _build(m, counter, cfg.out_dir / "slot-cache", dec, cfg.artifacts)
                            except BaseModelMismatchError as e:  # soft families run on their own base only
                                comps[m] = None
                                log(f"{dec} | {m}: skipped, {e}")
                        if comps[m] is None:
                            continue
                        log(f"{dec} | {spec.label} | {m} | ratio {r}: {len(todo)} questions")
                        if CACHED in m:  # fill the cache first (index time); the timed run reads it
                            comps[m].index([p for e in todo for p in e.passages])
                        budget = Budget(ratio=r or None, early_stop=True if STOP in m else None)

                        def write(rec: dict, _m=m, _r=r, _dec=dec, _ds=spec.label) -> None:
                            rec.update(decoder=_dec, dataset=_ds, method=_m, ratio_requested=_r,
                                       peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
                            sink.write(json.dumps(rec) + "\n")
                            sink.flush()

                        if m not in readers:  # a soft method trained with a decoder LoRA reads through it
                            readers[m] = (backend.with_adapter(load_decoder_adapter(cfg.text_adapter, dec))
                                          if LORA in m else backend_for(backend, comps[m]))
                        control = next((c for suffix, c in CONTROLS.items() if suffix in m), None)
                        evaluate(todo, readers[m], comps[m], budget, params, progress=progress, on_sample=write,
                                 control=control)
            del backend, comps, readers
    rows = summarize_bench(samples_path, cfg)
    return rows


def _method_spec(m: str) -> Any:
    """The registry entry behind a bench method name: ``NAME@cache`` is NAME reading a pre-filled cache,
    ``NAME@stop`` NAME stopping early at its min_score; the suffixes combine (``sentinel@cache@stop``)."""
    name, *suffixes = m.split("@")
    spec = get_spec(name)
    for suffix in suffixes:
        if f"@{suffix}" not in SUFFIXES:
            raise ConfigError(f"bench method {m!r}: unknown suffix '@{suffix}'; use one of {', '.join(SUFFIXES)}")
    if LORA in m and spec.kind != "text":
        raise ConfigError(f"bench method {m!r}: @lora reads a text method through the text adapter; a soft "
                          "method brings its own decoder adapter")
    if any(c in m for c in CONTROLS) and spec.kind != "soft":
        raise ConfigError(f"bench method {m!r}: the controls @zeroed and @other apply to soft methods")
    if CACHED in m and not spec.cacheable:
        raise ConfigError(f"method {name!r} keeps no per-passage cache; drop '{CACHED}' from {m!r}")
    return spec


def _build(m: str, counter: TokenCounter, cache_dir: Path, decoder: str, artifacts: dict[str, str]) -> Any:
    """A soft family is built for ``decoder`` and raises :class:`BaseModelMismatchError` when it was trained on
    another base; text methods serve any decoder. ``NAME@cache`` reads (and is filled into) ``cache_dir``."""
    options: dict[str, Any] = {"cache_dir": str(cache_dir)} if CACHED in m else {}
    name = _method_spec(m).name
    if name in artifacts:
        options["artifact"] = artifacts[name]
    return build_method(name, counter, decoder, options)


def bootstrap_interval(diffs: list[float], seed: int = 0, n: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the mean of paired differences."""
    rng = random.Random(seed)
    k = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=k)) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def summarize_bench(samples_path: Path, cfg: BenchConfig) -> list[dict[str, Any]]:
    recs = [json.loads(line) for line in samples_path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault((r["decoder"], r["dataset"], r["method"], r["ratio_requested"]), []).append(r)
    rows = []
    for (dec, ds, m, rr), g in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        base = {r["id"]: r for r in groups.get((dec, ds, "none", None), [])}
        paired = [(r["f1"], base[r["id"]]["f1"]) for r in g if r["id"] in base]
        row = {
            "decoder": dec, "dataset": ds, **summarize(g, m, rr),  # the same summary as `ragpress eval`
            "decode_tok_s": (sum(r["new_tokens"] for r in g) / max(1e-9, sum(
                r["e2e_s"] - r["compress_s"] - r["ttft_s"] for r in g if not r.get("error")))),
            "peak_rss_mb": max(r.get("peak_rss_mb", 0) for r in g),
        }
        if paired and m != "none":
            diffs = [a - b for a, b in paired]
            lo, hi = bootstrap_interval(diffs, cfg.seed)
            nb = statistics.fmean(b for _, b in paired)
            row.update(d_f1_vs_none=statistics.fmean(diffs), d_f1_ci95=[lo, hi],
                       f1_share_of_none=(statistics.fmean(a for a, _ in paired) / nb) if nb else None)
        rows.append(row)
    (cfg.out_dir / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    (cfg.out_dir / "table.md").write_text(markdown_table(rows))
    _plots(rows, cfg.out_dir)
    return rows


def _f(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    if isinstance(v, list):
        return "[" + ", ".join(_f(x, 2) for x in v) + "]"
    return str(v)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    cols = ["decoder", "dataset", "method", "ratio_requested", "n", "n_errors", "ratio", "em", "f1", "accuracy",
            "evidence_recall",
            "abstention", "d_f1_vs_none", "d_f1_ci95", "tokens_out_mean", "compress_s_mean", "ttft_s_mean",
            "e2e_s_mean"]
    if all(r.get("abstention") is None for r in rows):  # no unanswerable questions in the grid
        cols.remove("abstention")
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_f(r.get(c)) for c in cols) + " |")
    return "\n".join(out) + "\n"


def _plots(rows: list[dict[str, Any]], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for dec in sorted({r["decoder"] for r in rows}):
        dsets = sorted({r["dataset"] for r in rows if r["decoder"] == dec})
        fig, axes = plt.subplots(1, len(dsets), figsize=(5 * len(dsets), 4), squeeze=False)
        for ax, ds in zip(axes[0], dsets):
            sub = [r for r in rows if r["decoder"] == dec and r["dataset"] == ds]
            for m in sorted({r["method"] for r in sub}):
                pts = sorted((r["ratio"] or 0.0, r["f1"]) for r in sub if r["method"] == m and r["ratio"])
                if m in ("none", "no_context", "oracle"):
                    for r in sub:
                        if r["method"] == m:
                            ax.axhline(r["f1"], ls="--", lw=1, label=m, color={"none": "k", "no_context": "grey", "oracle": "g"}[m])
                elif pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
            ax.set_xlabel("measured compression ratio (decoder tokens)")
            ax.set_ylabel("F1")
            ax.set_title(f"{ds} ({dec})")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"f1_vs_ratio_{_file_tag(dec)}.png", dpi=110)
        plt.close(fig)
        sub = [r for r in rows if r["decoder"] == dec]
        labels = [f"{r['dataset']}\n{r['method']}@{r['ratio_requested'] or '-'}" for r in sub]
        comp = [r["compress_s_mean"] or 0 for r in sub]
        pre = [r["ttft_s_mean"] or 0 for r in sub]
        dec_s = [max(0.0, (r["e2e_s_mean"] or 0) - (r["compress_s_mean"] or 0) - (r["ttft_s_mean"] or 0)) for r in sub]
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(sub)), 4))
        x = range(len(sub))
        ax.bar(x, comp, label="compression")
        ax.bar(x, pre, bottom=comp, label="prefill (time to first token)")
        ax.bar(x, dec_s, bottom=[a + b for a, b in zip(comp, pre)], label="decode")
        ax.set_xticks(list(x), labels, rotation=90, fontsize=6)
        ax.set_ylabel("seconds per question")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"latency_{_file_tag(dec)}.png", dpi=110)
        plt.close(fig)


def write_benchmarks_md(rows: list[dict[str, Any]], cfg: BenchConfig, command: str, path: Path,
                        notes: str = "", publish: Path | None = None) -> Path:
    """BENCHMARKS.md: the latest table, the plots, the exact command, the machine and the date. ``publish``:
    a folder (committed) that receives copies of the run's outputs, so the plot links work in a clone."""
    import datetime
    import os
    import platform
    import shutil

    src = cfg.out_dir
    if publish is not None:
        publish.mkdir(parents=True, exist_ok=True)
        for f in ["samples.jsonl", "summary.json", "table.md", "config.json", *(p.name for p in src.glob("*.png"))]:
            if (src / f).exists():
                shutil.copyfile(src / f, publish / f)
    where = publish if publish is not None else src
    plots = sorted(p.name for p in where.glob("*.png"))
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {datetime.date.today().isoformat()}.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; no GPU. Greedy decoding, {cfg.max_new_tokens} new tokens at most, "
        f"first {cfg.limit} questions of each set, seed {cfg.seed}.",
        "",
        "`ratio` is measured in the decoder's tokens (context tokens in / out). `d_f1_vs_none` is paired on the "
        "same questions, with a bootstrap 95% interval; differences whose interval spans 0 are noise. `n_errors`: "
        "questions whose compressor or decoder raised (recorded in the samples, scored as misses).",
        "",
        notes,
        "",
        markdown_table(rows),
        "",
    ]
    lines += [f"![{p}]({where.as_posix()}/{p})" for p in plots]
    path.write_text("\n".join(lines) + "\n")
    return path


def _file_tag(name: str) -> str:
    """A decoder name (a named model or a local folder path) as a safe file-name part."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name if "/" in name else name) or "decoder"
