"""Does link completion (``complete_links``) help? Measured on the probe's *training* questions, each scored by a
two-stage probe that never saw it (5-fold cross-fitting, as the trainer's nested CV does), so neither the
validation nor the held-out benchmark questions are touched, and the sample is five times the validation's.

Two parts:

1. Evidence kept at 20% of the tokens, per source, for each ``min_score`` with and without completion (no
   model runs: ranks and selection only).
2. Answer F1 at ratio 5 with one decoder, on the chosen sources, with and without completion, paired on the same
   questions (95% bootstrap interval of the difference).

    python research/link_completion.py --features-cache runs/sentinel-v4-feats.npz --decoder smollm2-135m-instruct
    python research/link_completion.py --features-cache runs/sentinel-v4-feats.npz --decoder smollm2-135m-instruct \
        --share   # full context, oracle and sentinel: the share of the way, with its interval

The features cache is the one ``ragpress train sentinel --features-cache`` writes (all 30 layers); the probe is
refit from it with the shipped artifact's layout, depth and regularisation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.bench import bootstrap_interval  # noqa: E402
from adapters.training_data import sentinel_examples, sentinel_records  # noqa: E402
from compressor import Budget, TokenCounter, get_compressor  # noqa: E402
from compressor.filters.base import Sentence, passage_links, select_within_budget  # noqa: E402
from compressor.sentinel.config import DEFAULT_LAYOUT, FeatureLayout  # noqa: E402
from compressor.sentinel.model import SHIPPED_ARTIFACT  # noqa: E402
from compressor.sentinel.probe import select_columns  # noqa: E402
from compressor.sentinel.train import _folds, fit_two_stage, load_features, question_texts, split_order  # noqa: E402


def out_of_fold_scores(features_cache: Path, data: Path, artifact: Path, folds: int = 5):
    """(training features, texts, examples, two-stage scores from a fit that never saw the question)."""
    cfg = json.loads((artifact / "compressor_config.json").read_text())
    seed = cfg["training"]["seed"]
    feats = load_features(features_cache, DEFAULT_LAYOUT)
    recs, _ = sentinel_records(data, seed=seed)
    pairs = sentinel_examples(data, seed=seed)
    texts = question_texts(recs)
    if len(feats) != len(recs) or any(len(q.y) != len(t.sents) for q, t in zip(feats, texts)):
        raise SystemExit(f"{features_cache} does not hold the features of these {len(recs)} training records "
                         "(other data or another sentence splitter): delete it and rerun `ragpress train sentinel "
                         "--features-cache` to rebuild it")
    order = split_order(len(feats), seed)
    n_val = max(1, int(len(order) * 0.15))  # as train_sentinel's default val_fraction
    if n_val != cfg["training"]["n_val_questions"]:
        raise SystemExit(f"the artifact held out {cfg['training']['n_val_questions']} validation questions, this "
                         f"split {n_val}: it was trained on other records")
    tr = order[n_val:]
    qs, ts, exs = [feats[i] for i in tr], [texts[i] for i in tr], [pairs[i] for i in tr]
    layout = FeatureLayout.from_manifest(cfg["features"])
    cols = select_columns(DEFAULT_LAYOUT, cfg["proxy"]["num_layers"], layout, cfg["features"]["layers"],
                          cfg["features"]["heads"])
    c, c2, top_k = cfg["scores"]["C"], cfg["scores"]["rerank"]["C"], cfg["rerank"]["top_k"]
    scores: list[np.ndarray] = [np.zeros(0)] * len(qs)
    for part in _folds(len(qs), folds):
        fit = [i for i in range(len(qs)) if i not in set(part)]
        probe, reranker = fit_two_stage([qs[i] for i in fit], [ts[i] for i in fit], cols, c, c2, top_k, 0, folds)
        for i in part:
            t = ts[i]
            scores[i] = reranker(t.question, t.passages, t.owner, t.sents, probe(qs[i].x[:, cols]))
    return qs, ts, exs, scores


def evidence_table(qs, ts, scores, thresholds) -> None:
    print("| min_score | links | " + " | ".join(f"{s} recall / all kept / tokens vs evidence (median)"
                                               for s in ("hotpotqa", "nq", "squad")) + " |")
    print("|---|---|---|---|---|")
    for th in thresholds:
        for links in (False, True):
            cells = []
            for src in ("hotpotqa", "nq", "squad"):
                rec, full, size = [], [], []
                for q, t, s in zip(qs, ts, scores):
                    if q.source != src or q.y.sum() == 0:
                        continue
                    kw = {}
                    if links:
                        sents = [Sentence(o, 0, 0, 0, x, 0) for o, x in zip(t.owner, t.sents)]
                        kw = {"owner": t.owner, "links": passage_links(t.passages, sents)}
                    keep = select_within_budget(s, q.costs, max(1, int(q.tokens_in * 0.2)), th, min_keep=1, **kw)
                    rec.append(q.y[keep].sum() / q.y.sum())
                    full.append(q.y[keep].sum() == q.y.sum())
                    size.append(sum(q.costs[i] for i in keep) / sum(q.costs[i] for i in np.nonzero(q.y)[0]))
                cells.append(f"{np.mean(rec):.3f} / {np.mean(full):.2f} / {np.median(size):.1f}x")
            print(f"| {'fill' if th is None else th} | {'yes' if links else 'no'} | " + " | ".join(cells) + " |")


def cross_fitted_sentinel(exs, scores, counter: TokenCounter, artifact: Path, **options):
    """The artifact's sentinel (``options`` override its config) scoring each question with its out-of-fold
    scores instead of running the proxy."""
    comp = get_compressor("sentinel", counter=counter, artifact=str(artifact), **options)
    by_q = {e.question: s for (_, e), s in zip(exs, scores)}

    def cross_fitted(query, passages, sentences):
        s = by_q[query]
        if len(s) != len(sentences):
            raise RuntimeError(f"{len(s)} scores for {len(sentences)} sentences: the features cache is stale")
        return s

    comp.score_sentences = cross_fitted
    return comp


def answer_f1(exs, scores, decoder: str, sources: list[str], min_score: float, artifact: Path,
              out: Path | None) -> None:
    from adapters.decoders import GenerationParams, HFBackend
    from adapters.evaluate import evaluate

    backend = HFBackend.load(decoder)
    comp = cross_fitted_sentinel(exs, scores, TokenCounter.from_tokenizer(backend.tokenizer), artifact)
    chosen = [e for src, e in exs if src in sources]
    f1 = {}
    for links in (False, True):
        comp.config = comp.config.model_copy(update={"min_score": min_score, "complete_links": links})
        recs = evaluate(chosen, backend, comp, Budget(ratio=5), GenerationParams(max_new_tokens=32), progress=False)
        f1[links] = np.array([r["f1"] for r in recs])
        ratio = sum(r["tokens_in"] for r in recs) / max(1, sum(r["tokens_out"] for r in recs))
        recall = np.mean([r["evidence_recall"] for r in recs if r["evidence_recall"] is not None])
        print(f"{decoder} {'+'.join(sources)} min_score={min_score} links={links}: {len(recs)} questions, "
              f"F1 {f1[links].mean():.4f}, evidence recall {recall:.3f}, ratio {ratio:.1f}", flush=True)
        if out is not None:
            with out.open("a") as fh:
                for e, r in zip(chosen, recs):
                    fh.write(json.dumps({"decoder": decoder, "links": links, "min_score": min_score, "id": e.id,
                                         "f1": r["f1"], "evidence_recall": r["evidence_recall"]}) + "\n")
    d = f1[True] - f1[False]
    lo, hi = bootstrap_interval(d.tolist())
    print(f"paired difference (links - none): {d.mean():+.4f} [{lo:+.4f}, {hi:+.4f}]; better on {(d > 0).sum()}, "
          f"worse on {(d < 0).sum()} of {len(d)}")


def share_of_the_way(exs, scores, decoder: str, sources: list[str], min_score: float, artifact: Path) -> None:
    """Full context, oracle and sentinel (these out-of-fold scores, ``min_score``, completion on) with one decoder
    at ratio 5 on the chosen sources: sentinel's share of the way from full context to the oracle, with a 95%
    bootstrap interval (questions resampled, the ratio recomputed)."""
    import random

    from adapters.decoders import GenerationParams, HFBackend
    from adapters.evaluate import evaluate

    backend = HFBackend.load(decoder)
    counter = TokenCounter.from_tokenizer(backend.tokenizer)
    sent = cross_fitted_sentinel(exs, scores, counter, artifact, min_score=min_score, complete_links=True)
    chosen = [e for src, e in exs if src in sources]
    f1 = {}
    for name, comp in (("none", get_compressor("none", counter=counter)),
                       ("oracle", get_compressor("oracle", counter=counter)), ("sentinel", sent)):
        recs = evaluate(chosen, backend, comp, Budget(ratio=5), GenerationParams(max_new_tokens=32), progress=False)
        f1[name] = np.array([r["f1"] for r in recs])
        print(f"{decoder} {'+'.join(sources)} {name}: {len(recs)} questions, F1 {f1[name].mean():.4f}", flush=True)
    x = np.stack([f1["none"], f1["oracle"], f1["sentinel"]], axis=1)

    def share(rows: np.ndarray) -> float:
        gap = rows[:, 1].mean() - rows[:, 0].mean()
        return float((rows[:, 2].mean() - rows[:, 0].mean()) / gap) if gap else float("nan")

    rng = random.Random(0)
    boot = [share(x[[rng.randrange(len(x)) for _ in range(len(x))]]) for _ in range(2000)]
    lo_s, hi_s = np.nanpercentile(boot, [2.5, 97.5])  # a resample where the oracle ties full context has no share
    lo, hi = bootstrap_interval((f1["sentinel"] - f1["none"]).tolist())
    print(f"share of the way to the oracle: {share(x):.1%} [{lo_s:.1%}, {hi_s:.1%}]; sentinel - full "
          f"context {x[:, 2].mean() - x[:, 0].mean():+.4f} [{lo:+.4f}, {hi:+.4f}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--features-cache", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--artifact", type=Path, default=SHIPPED_ARTIFACT)
    ap.add_argument("--decoder", help="also measure answer F1 with this decoder (slow: two runs per question)")
    ap.add_argument("--sources", default="hotpotqa", help="comma-separated sources for the F1 part")
    ap.add_argument("--min-score", type=float, default=1.5)
    ap.add_argument("--thresholds", default="[null, 1.0, 1.5, 2.0]", help="JSON list for the evidence table")
    ap.add_argument("--out", type=Path, help="append per-question F1 rows here")
    ap.add_argument("--share", action="store_true", help="with --decoder: also run full context and the oracle and "
                    "print sentinel's share of the way (completion on), instead of the with/without comparison")
    args = ap.parse_args()
    qs, ts, exs, scores = out_of_fold_scores(args.features_cache, args.data, args.artifact)
    evidence_table(qs, ts, scores, json.loads(args.thresholds))
    if args.decoder and args.share:
        share_of_the_way(exs, scores, args.decoder, args.sources.split(","), args.min_score, args.artifact)
    elif args.decoder:
        answer_f1(exs, scores, args.decoder, args.sources.split(","), args.min_score, args.artifact, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
