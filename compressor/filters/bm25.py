"""``bm25``: rank sentences by BM25 against the question (bm25s, English stop words)."""

from __future__ import annotations

import numpy as np

from ..base import Passage, TokenCounter
from ..registry import register_compressor
from .base import Sentence, SentenceFilter, SentenceFilterConfig

__all__ = ["BM25Filter", "bm25_scores"]


class BM25Filter(SentenceFilter):
    """Lexical baseline: each sentence (title-prefixed) is a BM25 document, the question the query. Zero
    model cost; blind to paraphrase and to multi-hop bridges."""

    name = "bm25"

    def score_sentences(self, query: str, passages: list[Passage], sentences: list[Sentence]) -> np.ndarray:
        docs = [f"{passages[s.passage].title or ''} {s.text}" if self.config.title_in_score else s.text
                for s in sentences]
        return bm25_scores(query, docs)


def bm25_scores(query: str, docs: list[str]) -> np.ndarray:
    """BM25 score of every doc against ``query``, the docs being the whole collection (English stop words).
    Zeros when nothing can match (no docs, or only stop words and punctuation)."""
    import bm25s

    if not docs:
        return np.zeros(0)
    corpus = bm25s.tokenize(docs, stopwords="en", show_progress=False)
    if not corpus.vocab:  # nothing but stop words and punctuation: bm25s cannot index it, nothing matches
        return np.zeros(len(docs))
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    qtok = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)[0]
    if not qtok:
        return np.zeros(len(docs))
    return np.asarray(retriever.get_scores(qtok), dtype=np.float64)


def _make(counter: TokenCounter, **options) -> BM25Filter:
    return BM25Filter(counter, SentenceFilterConfig(**options))


register_compressor("bm25", _make, kind="text", description="BM25 sentence ranking (baseline)")
