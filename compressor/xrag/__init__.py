"""The ``xrag`` family: one soft row per document through a trained bridge (see :mod:`.model`).

Always registered as ``xrag``; built without ``artifact`` it loads the bridge shipped at
``compressor/artifacts/xrag-minilm-smollm2/``, and one is put there only once it beats the untrained control
on held-out NQ (the first run, ``xrag-minilm-smollm2-exp1/``, did not and is kept as an experiment, loadable
with ``--artifact``). Where none ships, building it raises :class:`~compressor.errors.ArtifactError` naming
the fix: untrained weights are never offered as a compressor. ``ragpress eval --method xrag --artifact
DIR`` (or :func:`load_xrag`) still loads a bridge you trained, or an untrained control made with
``ragpress train xrag --stage1-steps 0 --stage2-steps 0``.

Importing this package does not import torch: the torch-backed names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..base import TokenCounter
from ..registry import register_compressor
from .config import SHIPPED_ARTIFACT, XRAGConfig, XRAGTrainConfig

__all__ = ["Bridge", "DocumentIndex", "SHIPPED_ARTIFACT", "XRAGCompressor", "XRAGConfig", "XRAGTrainConfig",
           "cached_index", "load_xrag", "text_key"]

_LAZY = {"Bridge": ".projector", "XRAGCompressor": ".model", "load_xrag": ".model",
         "DocumentIndex": "..retrieval", "cached_index": "..retrieval", "text_key": "..retrieval"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make(counter: TokenCounter, artifact: str | None = None, **options: Any) -> Any:
    from .model import load_xrag

    return load_xrag(counter, artifact, **options)


register_compressor("xrag", _make, kind="soft",
                    description="xRAG bridge: a few soft rows per passage from a vector kept at index time",
                    fixed_ratio=True, cacheable=True, artifact=SHIPPED_ARTIFACT)
