"""Sentinel with ``embed_share`` < 1 against embedding every sentence: the same kept sentences? the same evidence?
how much faster? On training questions only (HotpotQA ``train_a[100:200]``, NQ ``[400:500]`` with 9 BM25
distractors), never the benchmark's. Each share compresses every question at ratio 3 and 5 (budget filled) and
with the shipped early stop at ratio 5; timings are per question, one after the other on an idle machine.

    python research/embed_share.py --shares 1 0.5 0.33 0.25 --out runs/embed-share.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.datasets import DATA_FILES, add_distractors, answer_sentence_evidence, corpus_of, load_dataset  # noqa: E402
from adapters.metrics import evidence_recall  # noqa: E402
from adapters.training_data import EVAL_HOLDOUT  # noqa: E402
from compressor import Budget, TokenCounter, get_compressor  # noqa: E402
from compressor.models import load_tokenizer  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BUDGETS = {"ratio 3": Budget(ratio=3), "ratio 5": Budget(ratio=5), "ratio 5, early stop": Budget(ratio=5, early_stop=True)}


def examples(n: int) -> dict[str, list]:
    hp = load_dataset("hotpotqa", DATA / DATA_FILES["hotpotqa"])
    nq = load_dataset("nq", DATA / DATA_FILES["nq"])
    start = EVAL_HOLDOUT["nq"]
    nq_d9 = [answer_sentence_evidence(e) for e in add_distractors(nq[start:start + n], corpus_of(nq), 9)]
    return {"hotpotqa": hp[EVAL_HOLDOUT["hotpotqa_a"]:EVAL_HOLDOUT["hotpotqa_a"] + n], "nq-d9": nq_d9}


def kept(ctx) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.index, tuple(p.sentence_ids)) for p in ctx.passages]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.5, 0.33, 0.25])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--method", default="sentinel")
    ap.add_argument("--out", type=Path, default=Path("runs/embed-share.json"))
    args = ap.parse_args()
    counter = TokenCounter.from_tokenizer(load_tokenizer("smollm2-135m-instruct"))
    sets = examples(args.n)
    results: dict = {}
    ref: dict = {}
    for share in args.shares:
        comp = get_compressor(args.method, counter=counter, embed_share=share)
        warm = sets["hotpotqa"][0]
        comp.compress(warm.question, warm.passages, Budget(ratio=5))
        for name, exs in sets.items():
            for bname, budget in BUDGETS.items():
                secs, rec, same, ctxs = [], [], 0, []
                for ex in exs:
                    t = time.perf_counter()
                    ctx = comp.compress(ex.question, ex.passages, budget)
                    secs.append(time.perf_counter() - t)
                    r = evidence_recall(ctx, ex.passages)
                    if r is not None:
                        rec.append(r)
                    ctxs.append(kept(ctx))
                key = f"{name} | {bname}"
                if share == args.shares[0]:
                    ref[key] = ctxs
                same = sum(a == b for a, b in zip(ctxs, ref[key]))
                row = {"share": share, "compress_s": statistics.fmean(secs), "evidence_recall": statistics.fmean(rec),
                       "same_kept_as_first_share": same / len(exs), "n": len(exs)}
                results.setdefault(key, []).append(row)
                print(key, json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"method": args.method, "shares": args.shares, "results": results}, indent=2))


if __name__ == "__main__":
    main()
