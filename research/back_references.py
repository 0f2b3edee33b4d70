"""Answer sentences that name their subject only through the sentence before ("He has two dogs ... a cat named
Tux"): how many a sentence filter keeps, with and without ``back_references``, at 3x and 5x, budget filled.

Evidence is relabelled to the sentences of the gold passage that hold a gold answer string
(:func:`adapters.datasets.answer_sentence_evidence`); an answer sentence "refers back" when it opens with a
pronoun or a definite description (:func:`compressor.text.refers_back`). Scores are computed once per question
and every setting selects from them, so the settings differ only in selection.

    python research/back_references.py --split train --out runs/backref-train.json   # choose the margin
    python research/back_references.py --split bench --out runs/backref-bench.json   # the benchmark's questions
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.datasets import add_distractors, answer_sentence_evidence, corpus_of, load_dataset  # noqa: E402
from adapters.training_data import EVAL_HOLDOUT  # noqa: E402
from compressor import Budget, TokenCounter, get_compressor  # noqa: E402
from compressor.models import load_tokenizer  # noqa: E402
from compressor.text import refers_back  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SETTINGS = {"off": {"back_references": False}, **{f"margin {m}": {"back_references": True, "back_reference_margin": m}
                                                  for m in (0.0, 0.1, 0.25, 0.5)}}


def examples(split: str, n: int) -> dict[str, list]:
    """NQ and answerable SQuAD with 9 BM25 distractors: the benchmark's first ``n`` questions (``bench``) or
    ``n`` training questions after the held-out ones (``train``)."""
    nq = load_dataset("nq", DATA / "nq_open" / "nq-open-oracle-even.jsonl.gz")
    sq = load_dataset("squad", DATA / "squad_v2_dev_subset" / "squad_v2_dev_first5articles.json")
    out = {}
    for name, every, start in (("nq-d9", nq, EVAL_HOLDOUT["nq"]), ("squad-d9", sq, EVAL_HOLDOUT["squad"])):
        pick = every[:n] if split == "bench" else every[start:start + n]
        out[name] = [answer_sentence_evidence(e) for e in add_distractors(pick, corpus_of(every), 9, seed=0)]
    return out


def _cached(score, memo: dict):
    def cached(q, ps, ss):
        key = (q, tuple(p.text for p in ps))
        if key not in memo:
            memo[key] = score(q, ps, ss)
        return memo[key]
    return cached


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=["train", "bench"], required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--methods", nargs="+", default=["sentinel", "minilm", "bm25"])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    counter = TokenCounter.from_tokenizer(load_tokenizer("smollm2-135m-instruct"))
    data = examples(args.split, args.n)
    rows = []
    for method in args.methods:
        comps = {k: get_compressor(method, counter=counter, **v) for k, v in SETTINGS.items()}
        memo: dict = {}
        for c in comps.values():  # score once per question, select per setting
            c.score_sentences = _cached(c.score_sentences, memo)
        for ds, exs in data.items():
            for ratio, stop in ((3.0, False), (5.0, False), (3.0, True), (5.0, True)):
                if stop and comps["off"].config.min_score is None:  # no min_score: no early stop to measure
                    continue
                for name, c in comps.items():
                    hit = {"back": [0, 0], "other": [0, 0]}
                    tin = tout = 0
                    for e in exs:
                        ctx = c.compress(e.question, e.passages, Budget(ratio=ratio, early_stop=stop))
                        tin, tout = tin + ctx.tokens_in, tout + ctx.tokens_out
                        kept = {(cp.index, s) for cp in ctx.passages for s, _ in cp.spans}
                        for pi, p in enumerate(e.passages):
                            for s, t in p.evidence or ():
                                k = "back" if refers_back(p.text[s:t]) else "other"
                                hit[k][1] += 1
                                hit[k][0] += (pi, s) in kept
                    row = {"method": method, "dataset": ds, "ratio": ratio, "early_stop": stop, "setting": name, "ratio_reached": tin / tout,
                           "back_sentences": hit["back"][1], "back_recall": hit["back"][0] / max(1, hit["back"][1]),
                           "other_recall": hit["other"][0] / max(1, hit["other"][1]),
                           "all_recall": (hit["back"][0] + hit["other"][0]) / max(1, hit["back"][1] + hit["other"][1])}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
