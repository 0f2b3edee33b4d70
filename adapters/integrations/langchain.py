"""A LangChain document compressor running a ragpress text method.

>>> from langchain_core.documents import Document                                # doctest: +SKIP
>>> c = RagpressDocumentCompressor(method="bm25", ratio=4)                       # doctest: +SKIP
>>> c.compress_documents([Document(page_content="...")], "Who wrote Hamlet?")     # doctest: +SKIP

Each kept document comes back with only its kept sentences, its metadata and id carried over; a document
with nothing kept is left out. The numbers of the last call are on ``last_context``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict

from compressor.errors import MissingExtraError

from ._common import RagpressFields, to_passage

try:
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import BaseDocumentCompressor, Document
except ImportError as e:
    raise MissingExtraError("the LangChain integration needs langchain-core; install it with "
                            "`pip install 'ragpress[integrations]'`") from e

__all__ = ["RagpressDocumentCompressor"]


class RagpressDocumentCompressor(RagpressFields, BaseDocumentCompressor):
    """Compress retrieved documents against the query with one registered text method."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        super().__init__(**data)
        self._build()


    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        if not documents:
            return []
        passages = [to_passage(d.page_content, d.metadata, self.title_key, i) for i, d in enumerate(documents)]
        ctx = self.compressor.compress(query, passages, self._budget)
        self._last = ctx
        return [Document(page_content=cp.text, metadata=dict(documents[cp.index].metadata), id=documents[cp.index].id)
                for cp in ctx.passages if cp.text]
