"""Reconstruction check of an ICAE encoder: the frozen decoder regenerates held-out paragraphs from their
memory slots and the [AE] row; BLEU (sacrebleu, 0-1) against the original text.

Held-out paragraphs: gold passages of the first 400 NQ-open questions (the eval questions; training never
reads them). ``--segment-only`` scores the first segment of each paragraph (exactly one encoder window at
the trained ratio); otherwise whole paragraphs, segment by segment.

    python research/icae_reconstruction.py --artifact runs/icae-smollm2-135m --limit 50 --out runs/icae-eval/bleu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", help="encoder folder (default: the shipped one)")
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--limit", type=int, default=50, help="paragraphs to reconstruct")
    ap.add_argument("--segment-only", action="store_true", help="only the first segment of each paragraph")
    ap.add_argument("--out", type=Path, help="write the scores and the reconstructions here (JSON)")
    args = ap.parse_args()

    import sacrebleu

    from adapters.datasets import load_dataset
    from adapters.training_data import EVAL_HOLDOUT
    from compressor.icae import load_icae
    from compressor.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    from compressor import TokenCounter

    comp = load_icae(TokenCounter.from_tokenizer(tok), args.artifact)
    nq = load_dataset("nq", args.data / "nq_open" / "nq-open-oracle-even.jsonl.gz")[: EVAL_HOLDOUT["nq"]]
    texts = list(dict.fromkeys(p.text for e in nq for p in e.passages))[: args.limit]
    if args.segment_only:
        seg = comp.config.segment_tokens
        texts = [comp.tokenizer.decode(comp._tokens(t)[:seg]) for t in texts]
    t0 = time.perf_counter()
    hyps = [comp.reconstruct(t) for t in texts]
    dt = time.perf_counter() - t0
    bleu = sacrebleu.corpus_bleu(hyps, [texts])
    exact = sum(h.strip() == t.strip() for h, t in zip(hyps, texts)) / len(texts)
    n_tok = [len(comp._tokens(t)) for t in texts]
    result = {
        "artifact": args.artifact or "shipped", "trained": comp.trained, "paragraphs": len(texts),
        "segment_only": args.segment_only, "segment_tokens": comp.config.segment_tokens, "ratio": comp.config.ratio,
        "tokens_mean": sum(n_tok) / len(n_tok), "slots_mean": sum(comp.config.rows_for(n) for n in n_tok) / len(n_tok),
        "bleu": round(bleu.score / 100, 4), "bleu_signature": str(bleu), "exact_match": round(exact, 4),
        "seconds": round(dt, 1),
    }
    print(json.dumps(result, indent=2))
    for h, t in list(zip(hyps, texts))[:3]:
        print(f"\n--- original\n{t}\n--- reconstructed\n{h}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**result, "samples": [{"original": t, "reconstructed": h}
                                                              for t, h in zip(texts, hyps)]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
