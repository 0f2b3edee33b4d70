"""Choose a sentinel probe's ``min_score`` on its validation questions, with every decoder.

``min_score`` drops sentences the probe scores below it even when the token budget has room: small decoders
answer worse with every distractor sentence they read, so keeping fewer can beat filling the budget. The value
is chosen here, on the probe's own validation questions (never trained on, and disjoint from the benchmark's
held-out questions), by the mean answer F1 over the decoders at ratio 5; the benchmark then measures it on
held-out questions. Probe scores are computed once per question and reused for every value.

    python research/choose_min_score.py --artifact runs/sentinel-v4 --out runs/min-score.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.decoders import GenerationParams, HFBackend  # noqa: E402
from adapters.evaluate import evaluate  # noqa: E402
from adapters.training_data import sentinel_examples  # noqa: E402
from compressor import Budget, TokenCounter, get_compressor  # noqa: E402
from compressor.sentinel.train import split_order  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", required=True)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--decoders", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--values", default="[null, -1, 0, 0.5, 1, 1.5, 2]", help="JSON list; null fills the budget")
    ap.add_argument("--ratio", type=float, default=5.0)
    ap.add_argument("--val-fraction", type=float, default=0.15, help="as in `ragpress train sentinel`")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    pairs = sentinel_examples(args.data, seed=args.seed)
    order = split_order(len(pairs), args.seed)
    val = [pairs[i] for i in order[: max(1, int(len(pairs) * args.val_fraction))]]
    values = json.loads(args.values)
    scores: dict[tuple, np.ndarray] = {}
    rows = []
    for dec in args.decoders:
        backend = HFBackend.load(dec)
        comp = get_compressor("sentinel", counter=TokenCounter.from_tokenizer(backend.tokenizer),
                              artifact=args.artifact)
        score = comp.score_sentences

        def cached(q, ps, ss, _score=score):
            key = (q, tuple(p.text for p in ps), tuple((s.passage, s.start, s.end) for s in ss))
            if key not in scores:
                scores[key] = _score(q, ps, ss)
            return scores[key]

        comp.score_sentences = cached
        for v in values:
            comp.config = comp.config.model_copy(update={"min_score": v})
            recs = evaluate([e for _, e in val], backend, comp, Budget(ratio=args.ratio),
                            GenerationParams(max_new_tokens=32), progress=False)
            row = {"decoder": dec, "min_score": v,
                   "ratio": round(sum(r["tokens_in"] for r in recs) / max(1, sum(r["tokens_out"] for r in recs)), 2),
                   "f1": round(float(np.mean([r["f1"] for r in recs])), 4),
                   "f1_by_source": {s: round(float(np.mean([r["f1"] for (src, _), r in zip(val, recs) if src == s])), 4)
                                    for s in sorted({src for src, _ in val})},
                   "evidence_recall": round(float(np.mean([r["evidence_recall"] for r in recs
                                                           if r["evidence_recall"] is not None])), 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    by_value = {json.dumps(v): float(np.mean([r["f1"] for r in rows if r["min_score"] == v])) for v in values}
    best = max(by_value, key=by_value.get)
    print(f"mean F1 over decoders by min_score: {by_value}\nchosen: min_score={best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
