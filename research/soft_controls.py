"""A soft method next to its controls, paired on the same questions of one bench run: answer F1 and accuracy
(containment) of each arm, and the method's paired difference to each other arm with the bench's seeded
bootstrap 95% interval (an interval that excludes 0 is a difference, one that spans it is noise).

    python research/soft_controls.py runs/bench-icae-v2/samples.jsonl --method icae \\
        --against none no_context none@lora icae@zeroed icae@other
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.bench import bootstrap_interval  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("samples", type=Path, nargs="+")
    ap.add_argument("--method", required=True)
    ap.add_argument("--against", nargs="+", required=True)
    args = ap.parse_args()
    recs = [json.loads(x) for p in args.samples for x in p.read_text().splitlines() if x.strip()]
    by: dict[tuple, dict[str, dict]] = {}
    for r in recs:
        by.setdefault((r["decoder"], r["dataset"], r["method"]), {})[r["id"]] = r
    print(f"| dataset | arm | n | ratio | F1 | accuracy | {args.method} - arm, F1 [95% CI] | "
          f"{args.method} - arm, accuracy [95% CI] |\n|---|---|---:|---:|---:|---:|---:|---:|")
    for dec, ds, m in sorted(k for k in by if k[2] == args.method):
        mine = by[(dec, ds, m)]
        for arm in [args.method, *args.against]:
            other = by.get((dec, ds, arm))
            if other is None:
                continue
            ids = sorted(set(mine) & set(other))
            tin = sum(other[i]["tokens_in"] or 0 for i in ids)
            tout = sum(other[i]["tokens_out"] or 0 for i in ids)
            ratio = f"{tin / tout:.1f}x" if tout and arm != "no_context" else "-"
            cells = [f"{statistics.fmean(other[i][k] for i in ids):.3f}" for k in ("f1", "accuracy")]
            diffs = []
            for k in ("f1", "accuracy"):
                d = [mine[i][k] - other[i][k] for i in ids]
                lo, hi = bootstrap_interval(d)
                diffs.append("-" if arm == args.method else f"{statistics.fmean(d):+.3f} [{lo:+.3f}, {hi:+.3f}]")
            print(f"| {ds} | `{arm}` | {len(ids)} | {ratio} | {cells[0]} | {cells[1]} | {diffs[0]} | {diffs[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
