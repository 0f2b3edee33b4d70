"""Run the benchmark grid and write BENCHMARKS.md (a thin script over ``adapters.bench``).

    .venv/bin/python examples/benchmark.py --datasets hotpotqa nq-d9 --limit 100

Resumable: rerun the same command after an interruption. ``ragpress bench`` is the same without the
BENCHMARKS.md step.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from adapters.bench import add_bench_options, bench_config, run_bench, summarize_bench, write_benchmarks_md

NOTES = """Timing columns come from a 2-core machine that was at times shared with other jobs, and the grid is
resumable (rows added by a later run of the same command keep the earlier rows): read timings side by side
within a row group, not as absolute latencies.

Methods. `none`: full context; `no_context`: the question alone; `oracle`: only the sentences (HotpotQA
supporting facts) or passages (NQ gold) that the data marks as evidence. `bm25`, `minilm`: sentence filters
(query-aware ranking, kept in original order, budget in decoder tokens). `sentinel`: the trained attention probe on
SmolLM2 (its shipped `min_score` may keep fewer tokens than the budget: read the measured `ratio`);
`sentinel@cache`: the same, with each passage's sentence embeddings read from a cache the bench fills before the
timed run (index time), so only the question is embedded at query time. `icae`: memory slots at the encoder's fixed 4x, each passage compressed on its own, at query time; `icae@cache`: the same slots read from the slot cache, which the bench fills before
the timed run (index-time compression). `longllmlingua`: the outside peer, LongLLMLingua from `llmlingua==0.2.2`
with SmolLM2 as its scorer (question-aware coarse passage ranking + fine token pruning, its default settings
for `rate = 1 / ratio`), run fully offline. Adaptations, none of which changes its algorithm (see
`compressor/longllmlingua/compat.py`): the tiktoken file it fetches at start-up is replaced by a local counter
in the decoder's tokens (it only reports sizes); transformers 5 takes `Cache` objects where llmlingua passes and
slices legacy key/value tuples, so the scorer is wrapped to convert both ways (same tensors, same logits); its
output is hard-capped to the budget in decoder tokens, as every method is (`ragpress eval` reports how often that
cap trimmed: `trimmed_calls`, `trimmed_tokens`).

`evidence_recall` for a soft method (`icae`) counts every encoded passage as kept (1.0 here): it says nothing
was dropped, not that the decoder can read the evidence back out of the slots; its F1 answers that."""


def main(argv: list[str]) -> int:
    import argparse

    own = argparse.ArgumentParser(description="Run the benchmark grid and write BENCHMARKS.md.")
    add_bench_options(own)
    own.add_argument("--md", type=Path, default=Path("BENCHMARKS.md"), help="markdown report to write")
    own.add_argument("--publish", type=Path, default=Path("benchmarks"), help="committed folder for outputs")
    own.add_argument("--summarize-only", action="store_true", help="rebuild the report from samples.jsonl")
    mine = own.parse_args(argv)
    cfg = bench_config(mine)
    samples = cfg.out_dir / "samples.jsonl"
    rows = summarize_bench(samples, cfg) if mine.summarize_only else run_bench(cfg)
    shown = [a for a in argv if a != "--summarize-only"]
    cmd = "python examples/benchmark.py " + " ".join(shlex.quote(a) for a in shown)
    write_benchmarks_md(rows, cfg, cmd, mine.md, NOTES, publish=mine.publish)
    print(f"wrote {mine.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
