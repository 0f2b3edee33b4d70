"""A LlamaIndex node postprocessor running a ragpress text method.

>>> pp = RagpressNodePostprocessor(method="bm25", ratio=4)                    # doctest: +SKIP
>>> index.as_query_engine(node_postprocessors=[pp])                            # doctest: +SKIP

Each kept node comes back as a copy holding only its kept sentences (id, metadata and score carried over);
a node with nothing kept is left out. The numbers of the last call are on ``last_context``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from compressor.errors import InputError, MissingExtraError

from ._common import RagpressFields, to_passage

try:
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError as e:
    raise MissingExtraError("the LlamaIndex integration needs llama-index-core; install it with "
                            "`pip install 'ragpress[integrations]'`") from e

__all__ = ["RagpressNodePostprocessor"]


class RagpressNodePostprocessor(RagpressFields, BaseNodePostprocessor):
    """Compress retrieved nodes against the query with one registered text method."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._build()

    @classmethod
    def class_name(cls) -> str:
        return "RagpressNodePostprocessor"

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
