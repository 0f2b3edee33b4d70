"""Configuration of the ``sentinel`` family (no torch import here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from ..errors import ConfigError
from ..filters.base import SentenceFilterConfig

__all__ = ["SentinelConfig", "FeatureLayout", "FORMAT_VERSION", "DEFAULT_LAYOUT", "V1_LAYOUT", "EMBED_EXTRAS",
           "LINK_EXTRAS"]

# 2: the feature layout is named in the manifest (format-1 artifacts read as V1_LAYOUT)
# 3: a layout may name the embedder-similarity scalars; the embedder's id and sha256 are recorded and checked
# 4: a layout may name the passage-link scalars (LINK_EXTRAS)
# 5: an optional second stage (``rerank`` in the manifest, ``rerank.*`` tensors; see rerank.py)
# 6: the config may hold ``complete_links`` (multi-hop completion of the selection)
FORMAT_VERSION = 6


class SentinelConfig(SentenceFilterConfig):
    """Attention-probe options. ``layers`` is the early exit: only the first ``layers`` decoder layers of
    the proxy run (None = all); the shipped probe records the value chosen by measurement."""

    proxy: str = Field(default="smollm2-135m-instruct", description="Proxy causal LM: named model or HF folder.")
    layers: int | None = Field(default=None, ge=1, le=256, description="Early exit: proxy layers to run.")
    query_positions: int = Field(default=4, ge=1, le=64, description="Final prompt positions whose attention is read.")
    max_context_tokens: int = Field(default=8192, ge=16, description="Longest proxy prompt read in one pass; a "
                                    "longer context is read in windows of whole passages, each with the question "
                                    "and at most this long.")
    dtype: str = Field(default="bfloat16", pattern="^(bfloat16|float32|float16)$",
                       description="Dtype of the proxy and of the embedder.")
    embedder: str = Field(default="minilm-l6", description="Sentence embedder of the embed_cos / embed_z features "
                          "(named model or local folder); read only when the probe's layout names them.")
    back_references: bool = Field(
        default=True, description="On for sentinel (off for bm25 / minilm): on 100 NQ + 9 and 100 SQuAD + 9 training "
        "questions it keeps 0.75 / 0.90 of the answer sentences that open with a back-reference under the early "
        "stop, against 0.68 / 0.83 off, other answer sentences unchanged (research/back_references.py).")
    embed_share: float = Field(
        default=1.0, gt=0.0, le=1.0, description="Without a cache, the share of a question's sentences the embedder "
        "embeds at query time (1 = all). Below 1 the probe first scores every sentence with `screen_embedder`'s "
        "cosines in their place, the embedder embeds the best-scoring share (8 sentences at least), the other "
        "sentences' cosines are mapped from the screen's by a per-question least-squares line, and the probe "
        "scores again (docs/experiments/sentinel.md#cost).")
    screen_embedder: str = Field(default="minilm-l6-static", description="Cheap embedder that ranks the sentences "
                                 "when embed_share < 1 (a static table: a lookup per token).")
    cache_dir: str | None = Field(default=None, description="Folder of cached sentence embeddings: a passage's "
                                  "sentences are embedded once (ahead of time, or by the first question that "
                                  "reads it); None embeds them for every question.")


# Attention blocks: ``layers * heads`` columns each, a per-question z-score of the log mean attention that a
# group of query positions (the question's tokens, or the final prompt positions) pays to the sentence, or to
# the whole passage holding it (title included). Scalars: one column each; ``embed_cos`` / ``embed_z`` are the
# cosine similarity of the title-prefixed sentence's embedding to the question's (``SentinelConfig.embedder``)
# and its per-question z-score. Link scalars (multi-hop evidence: the second passage of a bridge question rarely
# shares words with the question, but a question-relevant passage names it): ``passage_bm25`` is the passage's
# best ``bm25_z``; ``link_in`` the best ``passage_bm25`` among the other passages whose text names this
# passage's title; ``link_out`` the best ``passage_bm25`` among the passages whose title this sentence names
# (both NO_LINK when there is none); ``log1p_mentions`` how many other passages name this passage's title.
ATTN_BLOCKS = ("question:zlogmean", "final:zlogmean", "passage_question:zlogmean", "passage_final:zlogmean")
EMBED_EXTRAS = ("embed_cos", "embed_z")
LINK_EXTRAS = ("passage_bm25", "link_in", "link_out", "log1p_mentions")
NO_LINK = -3.0
EXTRAS = ("log1p_tokens", "relative_position", "first_in_passage", "log1p_index_in_passage",
          "question_overlap", "title_overlap", "bm25_z", *EMBED_EXTRAS, *LINK_EXTRAS)


@dataclass(frozen=True)
class FeatureLayout:
    """The named feature blocks a probe reads, in column order: ``pooling`` attention blocks, then ``extra``
    scalars. Stored in the artifact, so a probe is always fed the columns it was fit on."""

    pooling: tuple[str, ...] = ATTN_BLOCKS
    extra: tuple[str, ...] = EXTRAS

    def __post_init__(self) -> None:
        for field_name, names, allowed in (("pooling", self.pooling, ATTN_BLOCKS), ("extra", self.extra, EXTRAS)):
            bad = [n for n in names if n not in allowed]
            if bad or len(set(names)) != len(names):
                raise ConfigError(f"feature layout {field_name}={list(names)}: unknown or repeated names {bad}; "
                                  f"choose from {list(allowed)}")

    @property
    def uses_embedder(self) -> bool:
        return any(e in self.extra for e in EMBED_EXTRAS)

    def column(self, name: str, layers: int, heads: int) -> int | None:
        """Column of the scalar ``name`` in the feature matrix (None when the layout does not read it)."""
        return len(self.pooling) * layers * heads + self.extra.index(name) if name in self.extra else None

    def width(self, layers: int, heads: int) -> int:
        return len(self.pooling) * layers * heads + len(self.extra)

    @classmethod
    def from_manifest(cls, features: dict[str, Any]) -> FeatureLayout:
        return cls(tuple(features["pooling"]), tuple(features["extra"]))


# The first shipped probe (format 1): the sentence's own attention, size and position only.
V1_LAYOUT = FeatureLayout(ATTN_BLOCKS[:2], EXTRAS[:2])
DEFAULT_LAYOUT = FeatureLayout()
