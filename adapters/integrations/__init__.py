"""LangChain and LlamaIndex hooks for the text methods (optional extra ``integrations``).

Nothing here imports LangChain or LlamaIndex until a class is touched; a missing package raises
:class:`compressor.errors.MissingExtraError` naming ``pip install 'ragpress[integrations]'``.

* :class:`RagpressDocumentCompressor` (``adapters.integrations.langchain``): a LangChain
  ``BaseDocumentCompressor``, e.g. inside a ``ContextualCompressionRetriever``.
* :class:`RagpressNodePostprocessor` (``adapters.integrations.llamaindex``): a LlamaIndex
  ``BaseNodePostprocessor``, e.g. ``index.as_query_engine(node_postprocessors=[...])``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RagpressDocumentCompressor", "RagpressNodePostprocessor"]

_HOME = {"RagpressDocumentCompressor": ".langchain", "RagpressNodePostprocessor": ".llamaindex"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
