"""Training the sentinel probe from plain records (the CLI does the data loading).

A record is ``(question, passages)`` whose passages carry ``evidence`` spans (HotpotQA supporting facts, the
sentence holding a SQuAD/NQ answer). A sentence is a positive when at least half of it, or half of an
evidence span, overlaps evidence. Features are extracted once with all proxy layers; every early-exit depth
in the grid reuses their first-k-layer columns. Validation questions (a seeded share of the records) are
never trained on; the depth and the regularisation are picked on them and reported.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..base import Passage, TokenCounter
from ..filters.base import select_within_budget
from ..text import split_sentences
from .config import SentinelConfig
from .model import SentinelCompressor, SentinelProbe
from .probe import AttentionProbe, select_layers

__all__ = ["QuestionFeatures", "extract_features", "fit_probe", "recall_at_budget", "train_sentinel"]


@dataclass
class QuestionFeatures:
    source: str
    x: np.ndarray  # all-layer features [n_sent, F]
    y: np.ndarray  # 0/1 per sentence
    costs: list[int]  # decoder tokens per sentence
    tokens_in: int


def _labels(p: Passage, spans: list[tuple[int, int]]) -> list[int]:
    out = []
    for s, e in spans:
        pos = 0
        for a, b in p.evidence or ():
            ov = max(0, min(e, b) - max(s, a))
            if ov and (ov >= 0.5 * (e - s) or ov >= 0.5 * (b - a)):
                pos = 1
        out.append(pos)
    return out


def extract_features(records: Sequence[tuple[str, str, list[Passage]]], attention: AttentionProbe,
                     counter: TokenCounter, progress: bool = True) -> list[QuestionFeatures]:
    """``records``: (source name, question, passages with evidence). Skips none: a record without a positive
    sentence is kept (it teaches the probe what irrelevant looks like) and counted in the report."""
    out = []
    for source, q, passages in tqdm(records, desc="probe features", disable=not progress):
        spans = [split_sentences(p.text) for p in passages]
        f = attention.features(q, passages, spans)
        y = np.array([lab for p, sp in zip(passages, spans) for lab in _labels(p, sp)], dtype=np.int64)
        costs = [counter.count(p.text[s:e]) + 1 for p, sp in zip(passages, spans) for s, e in sp]
        out.append(QuestionFeatures(source, f.x, y, costs, sum(counter.count(p.text) for p in passages)))
    return out


def save_features(path: str | Path, feats: Sequence[QuestionFeatures]) -> None:
    """Cache extracted features (plain arrays, no pickle) so probe fitting can be redone without the proxy."""
    lens = np.array([len(q.y) for q in feats])
    np.savez_compressed(path, x=np.concatenate([q.x for q in feats]), y=np.concatenate([q.y for q in feats]),
                        costs=np.concatenate([np.array(q.costs) for q in feats]), lens=lens,
                        tokens_in=np.array([q.tokens_in for q in feats]), source=np.array([q.source for q in feats]))


def load_features(path: str | Path) -> list[QuestionFeatures]:
    z = np.load(path, allow_pickle=False)
    out, start = [], 0
    for i, n in enumerate(z["lens"]):
        out.append(QuestionFeatures(str(z["source"][i]), z["x"][start:start + n], z["y"][start:start + n],
                                    z["costs"][start:start + n].tolist(), int(z["tokens_in"][i])))
        start += n
    return out


def fit_probe(x: np.ndarray, y: np.ndarray, c: float, seed: int = 0) -> SentinelProbe:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x)
    scale = np.where(scaler.scale_ > 1e-12, scaler.scale_, 1.0)
    lr = LogisticRegression(C=c, class_weight="balanced", max_iter=3000, random_state=seed)
    lr.fit((x - scaler.mean_) / scale, y)
    return SentinelProbe(scaler.mean_, scale, lr.coef_[0], float(lr.intercept_[0]))


def recall_at_budget(qs: Sequence[QuestionFeatures], scorer: Callable[[np.ndarray], np.ndarray], fraction: float) -> float:
    """Mean share of positive sentences kept when keeping ``fraction`` of each context's tokens."""
    rec = []
    for q in qs:
        if q.y.sum() == 0:
            continue
        keep = select_within_budget(scorer(q.x), q.costs, max(1, int(q.tokens_in * fraction)))
        rec.append(q.y[keep].sum() / q.y.sum())
    return float(np.mean(rec)) if rec else float("nan")


def train_sentinel(
    records: Sequence[tuple[str, str, list[Passage]]],
    counter: TokenCounter,
    proxy: str = "smollm2-135m-instruct",
    layer_grid: Sequence[int] = (2, 4, 6, 8, 12, 16, 30),
    c_grid: Sequence[float] = (0.003, 0.01, 0.03),
    val_fraction: float = 0.15,
    recall_tolerance: float = 0.01,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
    features_cache: str | Path | None = None,
) -> tuple[SentinelCompressor, dict[str, Any]]:
    """Extract features, pick (layers, C) on validation questions, fit, and return the compressor with a
    report. The depth chosen is the shallowest whose validation recall@20% is within ``recall_tolerance``
    of the best (cheaper compression for the same quality)."""
    from sklearn.metrics import roc_auc_score

    attention = AttentionProbe.load(proxy)
    n_layers, heads = attention.n_layers, attention.n_heads
    grid = sorted({min(k, n_layers) for k in layer_grid} | {n_layers})
    if features_cache is not None and Path(features_cache).exists():
        feats = load_features(features_cache)
        if len(feats) != len(records):
            raise ValueError(f"{features_cache} holds {len(feats)} questions, not {len(records)}: delete it")
        log(f"features loaded from {features_cache}")
    else:
        feats = extract_features(records, attention, counter, progress)
        if features_cache is not None:
            save_features(features_cache, feats)
    idx = list(range(len(feats)))
    random.Random(seed).shuffle(idx)
    n_val = max(1, int(len(idx) * val_fraction))
    val = [feats[i] for i in idx[:n_val]]
    tr = [feats[i] for i in idx[n_val:]]
    X = np.concatenate([q.x for q in tr])
    Y = np.concatenate([q.y for q in tr])
    Xv = np.concatenate([q.x for q in val])
    Yv = np.concatenate([q.y for q in val])
    log(f"train: {len(tr)} questions, {len(Y)} sentences ({int(Y.sum())} positive); "
        f"validation: {len(val)} questions, {len(Yv)} sentences ({int(Yv.sum())} positive)")

    # time per question for each depth, on validation questions
    timing: dict[int, float] = {}
    sample = [records[i] for i in idx[: min(8, n_val)]]
    for k in grid:
        t0 = time.perf_counter()
        for _, q, ps in sample:
            attention.features(q, ps, [split_sentences(p.text) for p in ps], layers=k)
        timing[k] = (time.perf_counter() - t0) / len(sample)

    rows = []
    best: dict[int, tuple[float, float, SentinelProbe]] = {}
    for k in grid:
        cut = lambda a, k=k: select_layers(a, n_layers, k, heads)  # noqa: E731
        for c in c_grid:
            probe = fit_probe(cut(X), Y, c, seed)
            auc = float(roc_auc_score(Yv, probe(cut(Xv))))
            val_k = [QuestionFeatures(q.source, cut(q.x), q.y, q.costs, q.tokens_in) for q in val]
            r20, r33 = recall_at_budget(val_k, probe, 0.20), recall_at_budget(val_k, probe, 0.33)
            rows.append({"layers": k, "C": c, "val_auc": round(auc, 4), "val_recall@20%": round(r20, 4),
                         "val_recall@33%": round(r33, 4), "s_per_question": round(timing[k], 4)})
            log(f"layers={k:>3} C={c:<5} auc={auc:.4f} recall@20%={r20:.4f} recall@33%={r33:.4f} "
                f"{timing[k]:.3f}s/question")
            if k not in best or (r20, auc) > best[k][:2]:
                best[k] = (r20, auc, probe)
    top = max(v[0] for v in best.values())
    chosen = min(k for k, v in best.items() if v[0] >= top - recall_tolerance)
    r20, auc, probe = best[chosen]
    chosen_row = max((r for r in rows if r["layers"] == chosen), key=lambda r: (r["val_recall@20%"], r["val_auc"]))
    config = SentinelConfig(proxy=proxy, layers=chosen)
    comp = SentinelCompressor(counter, config, probe, attention)
    sources: dict[str, int] = {}
    for q in feats:
        sources[q.source] = sources.get(q.source, 0) + 1
    report = {
        "chosen": chosen_row,
        "grid": rows,
        "n_train_questions": len(tr),
        "n_val_questions": len(val),
        "n_train_sentences": int(len(Y)),
        "n_train_positive": int(Y.sum()),
        "questions_by_source": sources,
        "questions_without_positive": int(sum(1 for q in feats if q.y.sum() == 0)),
        "proxy_layers": n_layers,
        "seed": seed,
    }
    return comp, report
