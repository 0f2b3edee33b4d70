"""Why evidence recall alone does not predict answer quality: F1 of a sentence filter split by whether it kept
all the evidence and by how much text it kept, next to the oracle's F1 on the same questions.

Reads the per-question samples a benchmark wrote (the published ones by default), no model runs:

    python research/recall_vs_f1.py benchmarks/samples.jsonl benchmarks/gemma3-270m/samples.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def groups(rows: list[dict], method: str, ratio: float | None, dataset: str, extra: float) -> dict[tuple, list]:
    """Per (decoder, all evidence kept?, kept tokens <= ``extra`` x the oracle's?): (filter F1, oracle F1) pairs."""
    oracle = {(r["decoder"], r["id"]): r for r in rows if r["method"] == "oracle" and r["dataset"] == dataset}
    out: dict[tuple, list] = defaultdict(list)
    for r in rows:
        o = oracle.get((r["decoder"], r["id"]))
        if (r["method"], r["ratio_requested"], r["dataset"]) != (method, ratio, dataset) or o is None \
                or r["evidence_recall"] is None:
            continue
        size = "short" if r["tokens_out"] <= extra * max(1, o["tokens_out"]) else "long"
        out[(r["decoder"], "all evidence" if r["evidence_recall"] == 1 else "partial", size)].append((r["f1"], o["f1"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("samples", nargs="+", type=Path, help="samples.jsonl files written by examples/benchmark.py")
    ap.add_argument("--dataset", default="hotpotqa")
    ap.add_argument("--methods", nargs="+", default=["sentinel@5", "bm25@5", "bm25@3", "minilm@5"],
                    help="METHOD@RATIO")
    ap.add_argument("--extra", type=float, default=2.0, help="'short': at most this many times the oracle's tokens")
    args = ap.parse_args()
    rows = [json.loads(line) for p in args.samples for line in p.read_text().splitlines() if line.strip()]
    print("| decoder | method | evidence kept | tokens vs oracle | n | F1 | oracle F1, same questions |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.methods:
        method, ratio = spec.split("@")
        for (dec, kept, size), v in sorted(groups(rows, method, float(ratio), args.dataset, args.extra).items()):
            f1, of1 = (sum(x[i] for x in v) / len(v) for i in (0, 1))
            bound = f"<= {args.extra:g}x" if size == "short" else f"> {args.extra:g}x"
            print(f"| {dec} | {method} {ratio}x | {kept} | {bound} | {len(v)} | {f1:.3f} | {of1:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
