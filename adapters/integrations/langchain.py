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

from pydantic import ConfigDict, Field, PrivateAttr

from compressor.base import Budget, CompressedContext, Compressor, TokenCounter
from compressor.errors import InputError, MissingExtraError

from ._common import budget_of, text_compressor, to_passage

try:
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import BaseDocumentCompressor, Document
except ImportError as e:
    raise MissingExtraError("the LangChain integration needs langchain-core; install it with "
                            "`pip install 'ragpress[integrations]'`") from e

__all__ = ["RagpressDocumentCompressor"]


class RagpressDocumentCompressor(BaseDocumentCompressor):
    """Compress retrieved documents against the query with one registered text method."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    method: str = Field(default="bm25", description="A registered text method.")
    ratio: float | None = Field(default=None, description="tokens in / tokens out; None: the method's default.")
    target_tokens: int | None = Field(default=None, description="Keep at most this many tokens in all.")
    tokenizer: str = Field(default="smollm2-135m-instruct", description="Whose tokens the budget counts.")
    title_key: str | None = Field(default="title", description="Metadata key shown as the document title.")
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

    @property
    def last_context(self) -> CompressedContext | None:
        return self._last

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        if not documents:
            return []
        passages = [to_passage(d.page_content, d.metadata, self.title_key, i) for i, d in enumerate(documents)]
        ctx = self.compressor.compress(query, passages, self._budget)
        self._last = ctx
        return [Document(page_content=cp.text, metadata=dict(documents[cp.index].metadata), id=documents[cp.index].id)
                for cp in ctx.passages if cp.text]
