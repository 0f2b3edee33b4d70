"""Paired answer-F1 differences between two benchmark runs of the same questions: a changed method against its
published rows (same decoder, dataset and question ids), with the seeded bootstrap 95% interval of the bench.

    python research/paired_runs.py --new runs/bench-26/samples.jsonl --new-method sentinel@stop \\
        --old benchmarks/samples.jsonl benchmarks/retrieval-squad/samples.jsonl benchmarks/gemma3-270m/samples.jsonl \\
        --old-method sentinel --ratios 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.bench import bootstrap_interval  # noqa: E402


def rows(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new", type=Path, nargs="+", required=True)
    ap.add_argument("--new-method", required=True)
    ap.add_argument("--old", type=Path, nargs="+", required=True)
    ap.add_argument("--old-method", required=True)
    ap.add_argument("--ratios", type=float, nargs="+", default=[3.0, 5.0])
    args = ap.parse_args()
    new, old = rows(args.new), rows(args.old)
    key = lambda r: (r["decoder"], r["dataset"], r["ratio_requested"], r["id"])  # noqa: E731
    before = {key(r): r for r in old if r["method"] == args.old_method}
    print(f"| decoder | dataset | ratio | n | {args.old_method} F1 (ratio) | {args.new_method} F1 (ratio) | "
          "difference [95% CI] |\n|---|---|---|---|---|---|---|")
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for r in new:
        if r["method"] == args.new_method and r["ratio_requested"] in args.ratios and key(r) in before:
            groups.setdefault(key(r)[:3], []).append((before[key(r)], r))
    for (dec, ds, ratio), pairs in sorted(groups.items()):
        a, b = [p[0] for p in pairs], [p[1] for p in pairs]
        diffs = [y["f1"] - x["f1"] for x, y in pairs]
        lo, hi = bootstrap_interval(diffs)
        ra = sum(x["tokens_in"] for x in a) / max(1, sum(x["tokens_out"] for x in a))
        rb = sum(x["tokens_in"] for x in b) / max(1, sum(x["tokens_out"] for x in b))
        print(f"| {dec} | {ds} | {ratio:g} | {len(pairs)} | {statistics.fmean(x['f1'] for x in a):.3f} ({ra:.1f}x) | "
              f"{statistics.fmean(x['f1'] for x in b):.3f} ({rb:.1f}x) | {statistics.fmean(diffs):+.3f} "
              f"[{lo:+.3f}, {hi:+.3f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
