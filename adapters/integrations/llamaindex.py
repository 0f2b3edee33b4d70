"""A LlamaIndex node postprocessor running a ragpress text method.

>>> pp = RagpressNodePostprocessor(method="bm25", ratio=4)                    # doctest: +SKIP
>>> index.as_query_engine(node_postprocessors=[pp])                            # doctest: +SKIP

Each kept node comes back as a copy holding only its kept sentences (id, metadata and score carried over);
a node with nothing kept is left out. The numbers of the last call are on ``last_context``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr

from compressor.base import Budget, CompressedContext, Compressor, TokenCounter
from compressor.errors import InputError, MissingExtraError

from ._common import budget_of, text_compressor, to_passage

try:
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError as e:
    raise MissingExtraError("the LlamaIndex integration needs llama-index-core; install it with "
                            "`pip install 'ragpress[integrations]'`") from e

__all__ = ["RagpressNodePostprocessor"]


class RagpressNodePostprocessor(BaseNodePostprocessor):
    """Compress retrieved nodes against the query with one registered text method."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    method: str = Field(default="bm25", description="A registered text method.")
    ratio: float | None = Field(default=None, description="tokens in / tokens out; None: the method's default.")
    target_tokens: int | None = Field(default=None, description="Keep at most this many tokens in all.")
    tokenizer: str = Field(default="smollm2-135m-instruct", description="Whose tokens the budget counts.")
    title_key: str | None = Field(default="title", description="Metadata key shown as the node title.")
    options: dict[str, Any] = Field(default_factory=dict, description="Method options (e.g. artifact=...).")
    counter: TokenCounter | None = Field(default=None, exclude=True, description="Overrides tokenizer.")
    compressor: Compressor | None = Field(default=None, exclude=True, description="A built compressor to use.")
    _last: CompressedContext | None = PrivateAttr(default=None)
    _budget: Budget = PrivateAttr(default_factory=Budget)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        # built here, after validation, so ragpress' own errors (unknown method, bad budget) come out as they are
        self._budget = budget_of(self.ratio, self.target_tokens)
        if self.compressor is None:
            self.compressor = text_compressor(self.method, self.tokenizer, self.counter, self.options)
        elif self.compressor.kind != "text":
            raise InputError(f"compressor {self.compressor.name!r} produces soft prompts; give a text method")

    @classmethod
    def class_name(cls) -> str:
        return "RagpressNodePostprocessor"

    @property
    def last_context(self) -> CompressedContext | None:
        return self._last

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if query_bundle is None:
            raise InputError("RagpressNodePostprocessor needs the query: postprocess_nodes(nodes, query_str=...)")
        if not nodes:
            return []
        passages = [to_passage(n.node.get_content(metadata_mode=MetadataMode.NONE), n.node.metadata, self.title_key, i)
                    for i, n in enumerate(nodes)]
        ctx = self.compressor.compress(query_bundle.query_str, passages, self._budget)
        self._last = ctx
        out = []
        for cp in ctx.passages:
            if cp.text:
                src = nodes[cp.index]
                node = src.node.model_copy(deep=True)
                node.set_content(cp.text)
                out.append(NodeWithScore(node=node, score=src.score))
        return out
