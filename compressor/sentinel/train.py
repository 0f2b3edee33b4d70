"""Training the sentinel probe from plain records (the CLI does the data loading).

A record is ``(question, passages)`` whose passages carry ``evidence`` spans (HotpotQA supporting facts, the
sentence holding a SQuAD/NQ answer). A sentence is a positive when at least half of it, or half of an
evidence span, overlaps evidence. Features are extracted once with all proxy layers; every early-exit depth
in the grid reuses their first-k-layer columns. The layout, depth and regularisation are chosen by
cross-validation on the training questions; validation questions (a seeded share of the records) are never
trained on nor used for a choice, and every candidate's score on them is reported.
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
from .config import DEFAULT_LAYOUT, EMBED_EXTRAS, LINK_EXTRAS, V1_LAYOUT, FeatureLayout, SentinelConfig
from .model import SentinelCompressor, SentinelProbe
from .probe import AttentionReader, select_columns
from .rerank import HopReranker, rerank_features

__all__ = ["QuestionFeatures", "extract_features", "fit_probe", "recall_at_budget", "split_order", "train_sentinel"]


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


def extract_features(records: Sequence[tuple[str, str, list[Passage]]], attention: AttentionReader,
                     counter: TokenCounter, progress: bool = True,
                     layout: FeatureLayout = DEFAULT_LAYOUT) -> list[QuestionFeatures]:
    """``records``: (source name, question, passages with evidence). Skips none: a record without a positive
    sentence is kept (it teaches the probe what irrelevant looks like) and counted in the report."""
    out = []
    for source, q, passages in tqdm(records, desc="probe features", disable=not progress):
        spans = [split_sentences(p.text) for p in passages]
        f = attention.features(q, passages, spans, layout=layout)
        y = np.array([lab for p, sp in zip(passages, spans) for lab in _labels(p, sp)], dtype=np.int64)
        costs = [counter.count(p.text[s:e]) + 1 for p, sp in zip(passages, spans) for s, e in sp]
        out.append(QuestionFeatures(source, f.x, y, costs, sum(counter.count(p.text) for p in passages)))
    return out


def save_features(path: str | Path, feats: Sequence[QuestionFeatures],
                  layout: FeatureLayout = DEFAULT_LAYOUT) -> None:
    """Cache extracted features (plain arrays, no pickle) so probe fitting can be redone without the proxy."""
    lens = np.array([len(q.y) for q in feats])
    np.savez_compressed(path, pooling=np.array(layout.pooling), extra=np.array(layout.extra), x=np.concatenate([q.x for q in feats]), y=np.concatenate([q.y for q in feats]),
                        costs=np.concatenate([np.array(q.costs) for q in feats]), lens=lens,
                        tokens_in=np.array([q.tokens_in for q in feats]), source=np.array([q.source for q in feats]))


def load_features(path: str | Path, layout: FeatureLayout = DEFAULT_LAYOUT) -> list[QuestionFeatures]:
    z = np.load(path, allow_pickle=False)
    cached = FeatureLayout(tuple(z["pooling"].tolist()), tuple(z["extra"].tolist())) if "pooling" in z else None
    if cached != layout:
        raise ValueError(f"{path} holds features of layout {cached}, not {layout}: delete it to re-extract")
    # read each array once: indexing an NpzFile decompresses the whole array again on every access
    x, y, costs, src, tok_in = z["x"], z["y"], z["costs"], z["source"], z["tokens_in"]
    out, start = [], 0
    for i, n in enumerate(z["lens"]):
        out.append(QuestionFeatures(str(src[i]), x[start:start + n], y[start:start + n],
                                    costs[start:start + n].tolist(), int(tok_in[i])))
        start += n
    return out


@dataclass
class QuestionText:
    """What the second stage reads besides the first stage's scores: one question's sentences as text."""

    question: str
    passages: list[Passage]
    owner: list[int]  # passage index per sentence
    sents: list[str]


def question_texts(records: Sequence[tuple[str, str, list[Passage]]]) -> list[QuestionText]:
    """The sentences of each record, split as :func:`extract_features` splits them (same order)."""
    out = []
    for _, q, passages in records:
        pairs = [(pi, p.text[a:b]) for pi, p in enumerate(passages) for a, b in split_sentences(p.text)]
        out.append(QuestionText(q, passages, [o for o, _ in pairs], [t for _, t in pairs]))
    return out


def split_order(n: int, seed: int = 0) -> list[int]:
    """Record indices in the seeded order of the train/validation split: the first ``int(n * val_fraction)``
    are the validation questions."""
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    return idx


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


# Candidate layouts, compared at full depth on the validation questions (the report keeps every row).
LAYOUT_CANDIDATES: dict[str, FeatureLayout] = {
    "v1 (sentence attention, size, position)": V1_LAYOUT,
    "+ passage structure": FeatureLayout(V1_LAYOUT.pooling, DEFAULT_LAYOUT.extra[:4]),
    "+ passage attention": FeatureLayout(DEFAULT_LAYOUT.pooling, DEFAULT_LAYOUT.extra[:4]),
    "+ lexical (no passage attention)": FeatureLayout(V1_LAYOUT.pooling, DEFAULT_LAYOUT.extra[:7]),
    "+ passage attention + embedder similarity": FeatureLayout(DEFAULT_LAYOUT.pooling,
                                                               DEFAULT_LAYOUT.extra[:4] + EMBED_EXTRAS),
    "+ passage attention + embedder similarity + passage links": FeatureLayout(
        DEFAULT_LAYOUT.pooling, DEFAULT_LAYOUT.extra[:4] + EMBED_EXTRAS + LINK_EXTRAS),
    "all": DEFAULT_LAYOUT,
}


def _stack(qs: Sequence[QuestionFeatures], cols: np.ndarray) -> list[QuestionFeatures]:
    return [QuestionFeatures(q.source, q.x[:, cols], q.y, q.costs, q.tokens_in) for q in qs]


def _fit_and_score(tr, val, cols, c, seed):
    """Fit on ``tr``, score on ``val``: (probe, AUC, recall@20%, recall@33%)."""
    from sklearn.metrics import roc_auc_score

    probe = fit_probe(np.concatenate([q.x[:, cols] for q in tr]), np.concatenate([q.y for q in tr]), c, seed)
    val_k = _stack(val, cols)
    y = np.concatenate([q.y for q in val])
    auc = float(roc_auc_score(y, probe(np.concatenate([q.x for q in val_k])))) if 0 < y.sum() < len(y) else float("nan")
    return probe, auc, recall_at_budget(val_k, probe, 0.20), recall_at_budget(val_k, probe, 0.33)


def _folds(n: int, folds: int) -> list[list[int]]:
    return [list(range(i, n, folds)) for i in range(folds)]


def _oof_scores(qs: Sequence[QuestionFeatures], cols: np.ndarray, c: float, seed: int, folds: int) -> list[np.ndarray]:
    """First-stage scores of every question from a probe that never saw it (``folds``-fold cross-fitting):
    the second stage must learn from scores as noisy as those it will get on new questions."""
    out: list[np.ndarray] = [np.zeros(0)] * len(qs)
    for part in _folds(len(qs), folds):
        held = set(part)
        probe = fit_probe(np.concatenate([q.x[:, cols] for i, q in enumerate(qs) if i not in held]),
                          np.concatenate([q.y for i, q in enumerate(qs) if i not in held]), c, seed)
        for i in part:
            out[i] = probe(qs[i].x[:, cols])
    return out


def fit_two_stage(qs: Sequence[QuestionFeatures], texts: Sequence[QuestionText], cols: np.ndarray, c: float,
                  c2: float, top_k: int, seed: int, folds: int) -> tuple[SentinelProbe, HopReranker]:
    """The first-stage probe on all of ``qs``, and the second stage fit on cross-fitted first-stage scores."""
    probe = fit_probe(np.concatenate([q.x[:, cols] for q in qs]), np.concatenate([q.y for q in qs]), c, seed)
    oof = _oof_scores(qs, cols, c, seed, folds)
    x2 = np.concatenate([rerank_features(t.question, t.passages, t.owner, t.sents, s, top_k)
                         for t, s in zip(texts, oof)])
    return probe, HopReranker(fit_probe(x2, np.concatenate([q.y for q in qs]), c2, seed), top_k)


def _score_questions(score: Callable[[QuestionFeatures, QuestionText], np.ndarray], qs, texts,
                     sources: Sequence[str] = ()) -> dict[str, float]:
    """AUC and recall@20%/33% of ``score(features, text)`` on ``qs`` (and recall@20% per source in
    ``sources``)."""
    from sklearn.metrics import roc_auc_score

    scored = [QuestionFeatures(q.source, score(q, t)[:, None], q.y, q.costs, q.tokens_in) for q, t in zip(qs, texts)]
    y = np.concatenate([q.y for q in scored])
    out = {"auc": float(roc_auc_score(y, np.concatenate([q.x[:, 0] for q in scored]))) if 0 < y.sum() < len(y)
           else float("nan"),
           "recall@20%": recall_at_budget(scored, lambda x: x[:, 0], 0.20),
           "recall@33%": recall_at_budget(scored, lambda x: x[:, 0], 0.33)}
    for src in sources:
        out[f"recall@20%_{src}"] = recall_at_budget([q for q in scored if q.source == src], lambda x: x[:, 0], 0.20)
    return out


def _rerank_report(tr, val, tr_texts, val_texts, cols, c, c2, top_k, seed, folds,
                   sources) -> tuple[dict[str, Any], tuple[SentinelProbe, HopReranker]]:
    """Scores of the two-stage probe next to the first stage alone, fit the same way: nested CV on the
    training questions, then fit on all of them and scored on the validation questions. Also returns that
    last fit (both stages on all training questions)."""
    def both(fit_q, fit_t, qs, texts):
        probe, reranker = fit_two_stage(fit_q, fit_t, cols, c, c2, top_k, seed, folds)
        two = _score_questions(lambda q, t: reranker(t.question, t.passages, t.owner, t.sents, probe(q.x[:, cols])),
                               qs, texts, sources)
        return two, _score_questions(lambda q, t: probe(q.x[:, cols]), qs, texts, sources), (probe, reranker)

    cv = []
    for part in _folds(len(tr), folds):
        fit = [i for i in range(len(tr)) if i not in set(part)]
        cv.append(both([tr[i] for i in fit], [tr_texts[i] for i in fit], [tr[i] for i in part],
                       [tr_texts[i] for i in part]))
    val_two, val_one, fitted = both(tr, tr_texts, val, val_texts)

    def mean(rows):
        return {k: round(float(np.nanmean([r[k] for r in rows])), 4) for k in rows[0]}

    report = {"C": c2, "top_k": top_k, "cv": mean([r[0] for r in cv]), "cv_first_stage": mean([r[1] for r in cv]),
              "val": mean([val_two]), "val_first_stage": mean([val_one])}
    return report, fitted


def _cv_score(tr, cols, c, seed, folds: int) -> tuple[float, float, float]:
    """Mean (AUC, recall@20%, recall@33%) over ``folds`` question-grouped folds of the training questions: a
    steadier basis for choosing the layout and depth than one small validation split."""
    scores = []
    for part in _folds(len(tr), folds):
        held = set(part)
        fit = [q for i, q in enumerate(tr) if i not in held]
        _, auc, r20, r33 = _fit_and_score(fit, [tr[i] for i in part], cols, c, seed)
        scores.append((auc, r20, r33))
    return tuple(float(np.nanmean([sc[j] for sc in scores])) for j in range(3))  # type: ignore[return-value]


def train_sentinel(
    records: Sequence[tuple[str, str, list[Passage]]],
    counter: TokenCounter,
    proxy: str = "smollm2-135m-instruct",
    embedder: str = "minilm-l6",
    layer_grid: Sequence[int] = (2, 4, 6, 8, 12, 16, 30),
    c_grid: Sequence[float] = (0.003, 0.01, 0.03),
    layouts: dict[str, FeatureLayout] | None = None,
    val_fraction: float = 0.15,
    recall_tolerance: float = 0.01,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
    features_cache: str | Path | None = None,
    layers: int | None = None,
    cv_folds: int = 5,
    min_score: float | None = None,
    rerank: bool | None = None,
    rerank_c: float = 0.1,
    rerank_top_k: int = 2,
    complete_links: bool = False,
) -> tuple[SentinelCompressor, dict[str, Any]]:
    """Extract features, pick the layout and (layers, C) by ``cv_folds``-fold cross-validation on the training
    questions, fit on all of them, and return the compressor with a report that also scores every candidate on
    the validation questions (never used for a choice). Layouts (default :data:`LAYOUT_CANDIDATES`) are
    compared at full depth; the chosen one has the best CV recall@20%. The depth chosen is the shallowest
    whose CV recall@20% is within ``recall_tolerance`` of the best (cheaper compression for the same quality);
    ``layers`` forces the depth instead (the grid still reports every depth). ``min_score`` and
    ``complete_links`` are stored in the compressor's config (see
    :class:`~compressor.filters.base.SentenceFilterConfig`); the recall figures of the report rank by score
    alone.

    Then the second stage (:mod:`~compressor.sentinel.rerank`, regularisation ``rerank_c``, hop queries from the
    ``rerank_top_k`` best sentences) is fit on cross-fitted first-stage scores and scored the same way (CV on
    the training questions, nested; and on the validation questions). ``rerank=None`` keeps it when its CV
    recall@20% beats the first stage's; True / False force the choice."""
    layouts = layouts or LAYOUT_CANDIDATES
    attention = AttentionReader.load(proxy, embedder=embedder)
    table = _FeatureTable(_union(layouts), attention.n_layers, attention.n_heads)
    grid = _depth_grid(layer_grid, table.layers, layers)
    feats = _load_or_extract(records, attention, counter, table.layout, features_cache, progress, log)
    qs = _split_questions(records, feats, val_fraction, seed, cv_folds, features_cache, log)
    layout_name, ablation = _choose_layout(qs, table, layouts, c_grid, log)
    layout = layouts[layout_name]
    timing = _time_depths(attention, [records[i] for i in qs.val_records[:8]], grid, layout)
    chosen, probe, rows = _choose_depth(qs, table, layout, grid, c_grid, timing, recall_tolerance, layers, log)
    rerank_report, two_stage = _choose_rerank(qs, table.columns(layout, chosen["layers"]), chosen["C"], rerank_c,
                                              rerank_top_k, sorted({q.source for q in feats}), rerank, log)
    probe, reranker = two_stage or (probe, None)
    config = SentinelConfig(proxy=proxy, layers=chosen["layers"], embedder=embedder, min_score=min_score,
                            early_stop=False,  # as the saved artifact loads: the min_score stop is asked for
                            complete_links=complete_links)
    comp = SentinelCompressor(counter, config, probe, attention, layout=layout, reranker=reranker)
    return comp, _report(feats, qs, {**chosen, "layout": layout_name}, rerank_report, ablation, rows, table.layers)


# -- the steps of train_sentinel, in order --------------------------------------------------------------------
@dataclass
class _FeatureTable:
    """What the features were extracted with: every candidate's blocks and scalars (``layout``), all
    ``layers`` of the proxy, ``heads`` per layer. A candidate layout at a depth reads a subset of its columns."""

    layout: FeatureLayout
    layers: int
    heads: int

    def columns(self, layout: FeatureLayout, layers: int) -> np.ndarray:
        return select_columns(self.layout, self.layers, layout, layers, self.heads)


def _union(layouts: dict[str, FeatureLayout]) -> FeatureLayout:
    """One layout holding every block and scalar of ``layouts`` (first seen first): extracted once, read by all."""
    return FeatureLayout(tuple(dict.fromkeys(b for lay in layouts.values() for b in lay.pooling)),
                         tuple(dict.fromkeys(e for lay in layouts.values() for e in lay.extra)))


def _depth_grid(layer_grid: Sequence[int], n_layers: int, layers: int | None) -> list[int]:
    """The early-exit depths to try: ``layer_grid`` capped at the proxy's depth, plus full depth and ``layers``."""
    if layers is not None and not 1 <= layers <= n_layers:
        raise ValueError(f"layers={layers}: the proxy has {n_layers} layers; choose 1..{n_layers} or None")
    return sorted({min(k, n_layers) for k in layer_grid} | {n_layers} | ({layers} if layers else set()))


def _load_or_extract(records: Sequence[tuple[str, str, list[Passage]]], attention: AttentionReader,
                     counter: TokenCounter, layout: FeatureLayout, cache: str | Path | None, progress: bool,
                     log: Callable[[str], None]) -> list[QuestionFeatures]:
    """Features of every record: read from ``cache`` when it exists, else extracted (and written there)."""
    if cache is not None and Path(cache).exists():
        feats = load_features(cache, layout)
        if len(feats) != len(records):
            raise ValueError(f"{cache} holds {len(feats)} questions, not {len(records)}: delete it")
        log(f"features loaded from {cache}")
        return feats
    feats = extract_features(records, attention, counter, progress, layout=layout)
    if cache is not None:
        save_features(cache, feats, layout)
    return feats


@dataclass
class _Questions:
    """The seeded train/validation split (features and sentence texts of each side, the record index of each
    validation question) and how choices are cross-validated on the training side (``seed``, ``folds``)."""

    train: list[QuestionFeatures]
    val: list[QuestionFeatures]
    train_texts: list[QuestionText]
    val_texts: list[QuestionText]
    val_records: list[int]
    seed: int
    folds: int

    def score(self, cols: np.ndarray, c: float) -> tuple[dict[str, float], SentinelProbe]:
        """One grid row: CV scores on the training questions and the scores on the validation questions of the
        probe fit on all training questions (returned too)."""
        cv = _cv_score(self.train, cols, c, self.seed, self.folds)
        probe, auc, r20, r33 = _fit_and_score(self.train, self.val, cols, c, self.seed)
        row = {"cv_auc": cv[0], "cv_recall@20%": cv[1], "cv_recall@33%": cv[2], "val_auc": auc,
               "val_recall@20%": r20, "val_recall@33%": r33}
        return {k: round(v, 4) for k, v in row.items()}, probe


def _split_questions(records: Sequence[tuple[str, str, list[Passage]]], feats: list[QuestionFeatures],
                     val_fraction: float, seed: int, folds: int, cache: str | Path | None,
                     log: Callable[[str], None]) -> _Questions:
    """Pair each question's features with its sentence texts (refusing features of other records) and split
    them by :func:`split_order`: the first ``val_fraction`` (at least one) are the validation questions."""
    texts = question_texts(records)
    stale = [i for i, (q, t) in enumerate(zip(feats, texts)) if len(q.y) != len(t.sents)]
    if stale:
        raise ValueError(f"features of {len(stale)} questions (first: #{stale[0]}) do not match their sentences: "
                         f"{cache} was extracted from other records or another splitter; delete it")
    idx = split_order(len(feats), seed)
    n_val = max(1, int(len(idx) * val_fraction))
    qs = _Questions([feats[i] for i in idx[n_val:]], [feats[i] for i in idx[:n_val]],
                    [texts[i] for i in idx[n_val:]], [texts[i] for i in idx[:n_val]], idx[:n_val], seed, folds)
    log(f"train: {len(qs.train)} questions, {sum(len(q.y) for q in qs.train)} sentences "
        f"({sum(int(q.y.sum()) for q in qs.train)} positive); validation: {len(qs.val)} questions, "
        f"{sum(len(q.y) for q in qs.val)} sentences ({sum(int(q.y.sum()) for q in qs.val)} positive)")
    return qs


def _rank(row: dict[str, Any]) -> tuple[float, float]:
    """What a choice maximises: CV recall@20%, then CV AUC."""
    return row["cv_recall@20%"], row["cv_auc"]


def _show(r: dict[str, Any]) -> str:
    return (f"cv auc={r['cv_auc']:.4f} r@20%={r['cv_recall@20%']:.4f} r@33%={r['cv_recall@33%']:.4f} | "
            f"val auc={r['val_auc']:.4f} r@20%={r['val_recall@20%']:.4f} r@33%={r['val_recall@33%']:.4f}")


def _choose_layout(qs: _Questions, table: _FeatureTable, layouts: dict[str, FeatureLayout], c_grid: Sequence[float],
                   log: Callable[[str], None]) -> tuple[str, list[dict[str, Any]]]:
    """Every candidate layout at full depth, for every C: the name of the best by :func:`_rank`, and the rows."""
    ablation = []
    for name, lay in layouts.items():
        cols = table.columns(lay, table.layers)
        for c in c_grid:
            row = {"layout": name, "C": c, **qs.score(cols, c)[0]}
            ablation.append(row)
            log(f"layout {name!r:<60} C={c:<5} {_show(row)}")
    best = max(ablation, key=_rank)
    log(f"layout chosen: {best['layout']!r}")
    return best["layout"], ablation


def _time_depths(attention: AttentionReader, sample: Sequence[tuple[str, str, list[Passage]]], grid: Sequence[int],
                 layout: FeatureLayout) -> dict[int, float]:
    """Seconds per question of feature extraction at each depth, on ``sample`` (a few validation questions)."""
    _, q0, ps0 = sample[0]
    attention.features(q0, ps0, [split_sentences(p.text) for p in ps0], layers=1, layout=layout)  # warm-up: loads
    timing: dict[int, float] = {}
    for k in grid:
        t0 = time.perf_counter()
        for _, q, ps in sample:
            attention.features(q, ps, [split_sentences(p.text) for p in ps], layers=k, layout=layout)
        timing[k] = (time.perf_counter() - t0) / len(sample)
    return timing


def _choose_depth(qs: _Questions, table: _FeatureTable, layout: FeatureLayout, grid: Sequence[int],
                  c_grid: Sequence[float], timing: dict[int, float], recall_tolerance: float, layers: int | None,
                  log: Callable[[str], None]) -> tuple[dict[str, Any], SentinelProbe, list[dict[str, Any]]]:
    """Every (depth, C) of ``layout``: the chosen row (``layers`` if forced, else the shallowest depth whose best
    CV recall@20% is within ``recall_tolerance`` of the top, at its best C), its probe, and all the rows."""
    rows = []
    best: dict[int, tuple[tuple[float, float], SentinelProbe]] = {}
    for k in grid:
        cols = table.columns(layout, k)
        for c in c_grid:
            scored, probe = qs.score(cols, c)
            row = {"layers": k, "C": c, **scored, "s_per_question": round(timing[k], 4)}
            rows.append(row)
            log(f"layers={k:>3} C={c:<5} {_show(row)} {timing[k]:.3f}s/question")
            if k not in best or _rank(row) > best[k][0]:
                best[k] = (_rank(row), probe)
    top = max(v[0][0] for v in best.values())
    chosen = layers or min(k for k, v in best.items() if v[0][0] >= top - recall_tolerance)
    return max((r for r in rows if r["layers"] == chosen), key=_rank), best[chosen][1], rows


def _choose_rerank(qs: _Questions, cols: np.ndarray, c: float, rerank_c: float, top_k: int, sources: Sequence[str],
                   rerank: bool | None, log: Callable[[str], None],
                   ) -> tuple[dict[str, Any], tuple[SentinelProbe, HopReranker] | None]:
    """The second stage scored next to the first stage alone (:func:`_rerank_report`); kept when forced by
    ``rerank``, else when its CV recall@20% is higher. Returns the report and, if kept, both stages refit on
    all training questions."""
    report, two_stage = _rerank_report(qs.train, qs.val, qs.train_texts, qs.val_texts, cols, c, rerank_c, top_k,
                                       qs.seed, qs.folds, sources)
    keep = rerank if rerank is not None else report["cv"]["recall@20%"] > report["cv_first_stage"]["recall@20%"]
    report["kept"] = bool(keep)
    log(f"second stage (C={rerank_c}, top_k={top_k}): cv {report['cv']} | first stage alone "
        f"{report['cv_first_stage']} | val {report['val']} -> {'kept' if keep else 'not kept'}")
    return report, two_stage if keep else None


def _report(feats: Sequence[QuestionFeatures], qs: _Questions, chosen: dict[str, Any], rerank: dict[str, Any],
            ablation: list[dict[str, Any]], grid: list[dict[str, Any]], proxy_layers: int) -> dict[str, Any]:
    sources: dict[str, int] = {}
    for q in feats:
        sources[q.source] = sources.get(q.source, 0) + 1
    return {
        "chosen": chosen,
        "rerank": rerank,
        "layout_ablation": ablation,
        "grid": grid,
        "n_train_questions": len(qs.train),
        "n_val_questions": len(qs.val),
        "cv_folds": qs.folds,
        "n_train_sentences": sum(len(q.y) for q in qs.train),
        "n_train_positive": sum(int(q.y.sum()) for q in qs.train),
        "questions_by_source": sources,
        "questions_without_positive": int(sum(1 for q in feats if q.y.sum() == 0)),
        "proxy_layers": proxy_layers,
        "seed": qs.seed,
    }
