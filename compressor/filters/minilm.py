"""``minilm``: rank sentences by cosine similarity of MiniLM-L6 embeddings to the question's."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from ..base import Passage, TokenCounter
from ..registry import register_compressor
from .base import Sentence, SentenceFilter, SentenceFilterConfig

__all__ = ["MiniLMFilter", "MiniLMFilterConfig"]


class MiniLMFilterConfig(SentenceFilterConfig):
    embedder: str = Field(default="minilm-l6", description="Named embedder or local sentence-embedder folder.")


class MiniLMFilter(SentenceFilter):
    """Dense baseline: semantic match to the question, sentence by sentence (6-layer encoder, ~5 ms a
    sentence on a CPU). Like BM25 it scores sentences alone, so a bridge sentence that never names the
    question's entity ranks low."""

    name = "minilm"
    config: MiniLMFilterConfig

    def _docs(self, passages: list[Passage], sentences: list[Sentence]) -> list[str]:
        return [f"{passages[s.passage].title}: {s.text}" if self.config.title_in_score and passages[s.passage].title
                else s.text for s in sentences]

    def score_sentences(self, query: str, passages: list[Passage], sentences: list[Sentence]) -> np.ndarray:
        from ..embed import get_embedder

        if not sentences:
            return np.zeros(0)
        return get_embedder(self.config.embedder).similarity(query, self._docs(passages, sentences))

    def score_batch(self, items: list[tuple[str, list[Passage], list[Sentence]]]) -> list[np.ndarray]:
        """Every question and sentence of the batch embedded in one call (the encoder batches by length across
        questions); cosines as :meth:`score_sentences` gives them, up to float32 rounding of other padding."""
        from ..embed import get_embedder

        texts: list[str] = []
        spans = []
        for query, passages, sentences in items:
            docs = self._docs(passages, sentences)
            spans.append((len(texts), len(docs)))
            texts += [query, *docs]
        v = get_embedder(self.config.embedder).encode(texts)
        return [(v[a + 1:a + 1 + n] @ v[a]).numpy().astype("float64") for a, n in spans]


def _make(counter: TokenCounter, **options) -> MiniLMFilter:
    return MiniLMFilter(counter, MiniLMFilterConfig(**options))


register_compressor("minilm", _make, kind="text", description="MiniLM-L6 sentence similarity (baseline)")
