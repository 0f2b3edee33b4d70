"""Second stage of the sentinel probe: re-scoring from the first stage's scores, for multi-hop evidence.

The attention probe scores each sentence on its own. Its misses on HotpotQA are mostly the second hop of a
bridge question: "The population was 2,638 at the 2010 census." in the passage *New Durham, New Hampshire*,
which shares no word with "What is the population of a town that Sam Cataldo represents?" but is named by
the sentence the probe ranks first ("His district comprises the towns of ..., and New Durham"). The second
stage reads the first stage's scores and asks, per sentence: does a sentence the probe trusts name this
passage (``hop_in``, ``hop_top``), how does the sentence match the question expanded with the top sentences
(``hop_bm25``), and how good is its passage (``passage_max``). A logistic regression on these few columns
gives the final score. No proxy pass is added: the cost is two BM25 scorings and some title matching.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..base import Passage
from ..errors import ConfigError, InputError
from ..text import title_mentions

__all__ = ["RERANK_FEATURES", "HopReranker", "rerank_features", "zscore"]

# Column order of the second stage's input (stored in the artifact; a reranker is fed the columns it was fit on).
RERANK_FEATURES = (
    "score",  # the first stage's logit
    "score_z",  # its per-question z-score
    "hop_in",  # best score_z of a sentence in another passage that names this passage's title (-3: none)
    "hop_top",  # 1 if one of the top_k sentences (another passage's) names this passage's title
    "passage_max",  # best score_z in this sentence's passage
    "hop_bm25",  # z-scored BM25 of the title-prefixed sentence against the question + the top_k sentences
    "hop_in_x_bm25",  # hop_in times the z-scored BM25 against the question alone
    "hop_top_x_bm25",
    "hop_top_x_first",  # hop_top on the first sentence of the passage (it usually defines the entity)
    "hop_in_x_first",
    "reach",  # max(hop_in, passage_max): the passage is good, or named by a good sentence
    "score_minus_passage_max",
)
NO_HOP = -3.0


def zscore(a: np.ndarray) -> np.ndarray:
    """Per-column z-score over rows (zeros for a single row); a 1-D array is one column."""
    return (a - a.mean(0)) / (a.std(0) + 1e-6) if len(a) > 1 else np.zeros_like(a)


def rerank_features(query: str, passages: list[Passage], owner: list[int], sents: list[str], scores: np.ndarray,
                    top_k: int = 2) -> np.ndarray:
    """The :data:`RERANK_FEATURES` of every sentence: ``owner`` is its passage index, ``sents`` its text,
    ``scores`` the first stage's logits. ``[n_sentences, len(RERANK_FEATURES)]``."""
    from ..filters.bm25 import bm25_scores

    n = len(sents)
    s = np.asarray(scores, dtype=np.float64)
    if not len(owner) == n == len(s):
        raise InputError(f"rerank_features: owner has {len(owner)} entries, sents {n}, scores {len(s)}; give one of "
                         "each per sentence")
    if n == 0:
        return np.zeros((0, len(RERANK_FEATURES)))
    if not np.isfinite(s).all():
        raise InputError(f"rerank_features: the first stage's scores hold {int((~np.isfinite(s)).sum())} NaN/inf "
                         "values; check the probe's features")
    own = np.asarray(owner, dtype=np.int64)
    P = len(passages)
    z = zscore(s)
    names = title_mentions([p.title for p in passages], sents, own)  # sentence j names another passage b
    hop_in = np.maximum(np.where(names, z[:, None], -np.inf).max(0, initial=-np.inf), NO_HOP)[own]
    top = np.argsort(-s, kind="stable")[:top_k]
    hop_top = names[top].any(0)[own].astype(np.float64)
    pmax = np.full(P, NO_HOP)
    np.maximum.at(pmax, own, z)
    pmax = pmax[own]
    docs = [f"{passages[o].title or ''} {t}" for o, t in zip(own, sents)]
    bm = zscore(bm25_scores(query, docs))
    hop_bm = zscore(bm25_scores(" ".join([query, *(sents[j] for j in top)]), docs))
    first = np.r_[True, own[1:] != own[:-1]].astype(np.float64)
    cols = [s, z, hop_in, hop_top, pmax, hop_bm, hop_in * bm, hop_top * bm, hop_top * first, hop_in * first,
            np.maximum(hop_in, pmax), z - pmax]
    return np.stack(cols, axis=1)


class HopReranker:
    """The second stage: ``classifier`` (a standardised logistic regression, see
    :class:`~compressor.sentinel.model.SentinelProbe`) on :func:`rerank_features`."""

    def __init__(self, classifier: Callable[[np.ndarray], np.ndarray], top_k: int = 2) -> None:
        width = getattr(getattr(classifier, "coef", None), "shape", (len(RERANK_FEATURES),))[0]
        if width != len(RERANK_FEATURES):
            raise ConfigError(f"the reranker's classifier has {width} weights; the second stage has "
                              f"{len(RERANK_FEATURES)} features {list(RERANK_FEATURES)}")
        if top_k < 1:
            raise ConfigError(f"top_k={top_k}: the second stage reads at least the best sentence; use top_k >= 1")
        self.classifier, self.top_k = classifier, int(top_k)

    def __call__(self, query: str, passages: list[Passage], owner: list[int], sents: list[str],
                 scores: np.ndarray) -> np.ndarray:
        if len(sents) == 0:
            return np.zeros(0)
        return self.classifier(rerank_features(query, passages, owner, sents, scores, self.top_k))
