"""Retrieval for evals: each question gets the top-K passages of a corpus instead of its gold passage.

The corpus (every passage of the dataset file, deduplicated by text) is embedded once into a
:class:`~compressor.retrieval.DocumentIndex` cached under ``$RAGPRESS_HOME/indexes/``; at question time
only the question is encoded. The same index is handed to ``xrag`` so it reads the stored passage vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compressor.base import Passage

from .datasets import QAExample, corpus_of

__all__ = ["retrieve_examples"]


def retrieve_examples(everything: Sequence[QAExample], limit: int | None, k: int, name: str = "nq",
                      embedder: str = "minilm-l6") -> tuple[list[QAExample], Any, dict[str, Any]]:
    """The first ``limit`` examples with their passages replaced by the top-``k`` retrieved from the corpus
    of all ``everything``'s passages. A retrieved passage equal to the example's gold passage keeps its
    evidence label. Returns ``(examples, index, info)``; ``info`` holds the index folder and the share of
    questions whose gold passage was retrieved (``gold_recall_at_k``)."""
    from compressor.retrieval import cached_index

    index, folder, built = cached_index(name, corpus_of(list(everything)), embedder)
    examples = list(everything[:limit])
    found = index.retrieve([e.question for e in examples], k)
    out, hits = [], 0
    for e, ps in zip(examples, found):
        gold = {p.text for p in e.passages if p.evidence}
        hits += any(p.text in gold for p in ps)
        passages = [Passage(text=p.text, title=p.title,
                            evidence=((0, len(p.text.rstrip())),) if p.text in gold else None) for p in ps]
        out.append(e.model_copy(update={"passages": passages}))
    info = {"index": str(folder), "index_built_now": built, "corpus_passages": len(index),
            "gold_recall_at_k": hits / len(examples) if examples else None}
    return out, index, info
