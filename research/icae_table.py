"""Markdown tables of ``research/icae_eval.sh`` results: QA per dataset (paired with ``none`` on the same
questions) and reconstruction BLEU.   python research/icae_table.py runs/icae-eval"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str) -> None:
    d = Path(folder)
    print("| dataset | method | n | ratio | EM | F1 | accuracy | F1 / none | compress s | TTFT s | TTFT none / TTFT |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for ds in ("squad", "nq", "nq-d4"):
        none = json.loads((d / f"{ds}_none.json").read_text()) if (d / f"{ds}_none.json").exists() else None
        for m in ("none", "no_context", "icae", "control", "icae_cached"):
            p = d / f"{ds}_{m}.json"
            if not p.exists():
                continue
            s = json.loads(p.read_text())
            share = s["f1"] / none["f1"] if none and none["f1"] else None
            speed = none["ttft_s_mean"] / s["ttft_s_mean"] if none and s.get("ttft_s_mean") else None
            label = {"control": "icae (untrained control)", "icae_cached": "icae (slot cache hits)"}.get(m, m)
            print(f"| {ds} | {label} | {s['n']} | {_f(s.get('ratio'))} | {_f(s['em'])} | {_f(s['f1'])} | "
                  f"{_f(s['accuracy'])} | {_f(share)} | {_f(s.get('compress_s_mean'))} | {_f(s.get('ttft_s_mean'))} | "
                  f"{_f(speed)} |")
    print("\n| reconstruction | encoder | paragraphs | tokens | slots | BLEU | exact |")
    print("|---|---|---|---|---|---|---|")
    for p in sorted(d.glob("bleu_*.json")):
        s = json.loads(p.read_text())
        what = "first segment" if s["segment_only"] else "whole paragraph"
        print(f"| {what} | {'trained' if s['trained'] else 'untrained control'} | {s['paragraphs']} | "
              f"{s['tokens_mean']:.1f} | {s['slots_mean']:.1f} | {s['bleu']:.3f} | {s['exact_match']:.2f} |")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/icae-eval")
