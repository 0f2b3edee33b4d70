"""Run the benchmark grid and write BENCHMARKS.md (a thin script over ``adapters.bench``).

    .venv/bin/python examples/benchmark.py --datasets hotpotqa nq-d9 --limit 100

Resumable: rerun the same command after an interruption. ``ragpress bench`` is the same without the
BENCHMARKS.md step.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from adapters.bench import BenchConfig, run_bench, summarize_bench, write_benchmarks_md
from serving.cli import build_parser, parse_dataset_label

NOTES = """Timing columns come from one process on a 2-core machine that was at times shared with other jobs;
read them side by side within a row group, not as absolute latencies."""


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(["bench", *argv])
    cfg = BenchConfig(datasets=[parse_dataset_label(d, args.data) for d in args.datasets], methods=args.methods,
                      ratios=args.ratios, decoders=args.decoders, limit=args.limit, seed=args.seed,
                      out_dir=args.out_dir)
    samples = cfg.out_dir / "samples.jsonl"
    rows = summarize_bench(samples, cfg) if "--summarize-only" in sys.argv else run_bench(cfg)
    cmd = "python examples/benchmark.py " + " ".join(shlex.quote(a) for a in argv)
    write_benchmarks_md(rows, cfg, cmd, Path("BENCHMARKS.md"), NOTES)
    print("wrote BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main([a for a in sys.argv[1:] if a != "--summarize-only"]))
