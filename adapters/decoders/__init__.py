"""Decoder backends, one seam (:class:`DecoderBackend`) and one module per transport: ``hf`` (transformers,
``inputs_embeds``), ``fake`` (tests), ``vllm`` (the in-process engine, ``prompt_embeds``) and ``remote`` (a
vLLM OpenAI server over HTTP). vLLM and httpx import only when their module is used."""

from __future__ import annotations

import importlib
from typing import Any

from .base import DecoderBackend, Generation, GenerationParams, GenerationStopped, backend_for
from .fake import FakeBackend
from .hf import HFBackend

__all__ = ["DecoderBackend", "FakeBackend", "Generation", "GenerationParams", "GenerationStopped", "HFBackend",
           "RemoteVLLMBackend", "VLLMBackend", "backend_for"]

_LAZY = {"VLLMBackend": ".vllm", "RemoteVLLMBackend": ".remote"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
