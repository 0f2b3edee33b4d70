"""The ``sentinel`` family: a trained probe on a proxy LLM's attention (see :mod:`.model`)."""

from __future__ import annotations

from ..base import TokenCounter
from ..registry import register_compressor
from .config import SentinelConfig
from .model import SHIPPED_ARTIFACT, SentinelCompressor, SentinelProbe

__all__ = ["SentinelConfig", "SentinelCompressor", "SentinelProbe", "SHIPPED_ARTIFACT"]


def _make(counter: TokenCounter, artifact: str | None = None, **options) -> SentinelCompressor:
    return SentinelCompressor.from_pretrained(artifact or SHIPPED_ARTIFACT, counter, **options)


# Registered only when the trained probe ships: untrained weights are never presented as a compressor.
if (SHIPPED_ARTIFACT / "compressor_config.json").exists():
    register_compressor("sentinel", _make, kind="text",
                        description="attention probe on a proxy LLM (trained, shipped artifact)", cacheable=True)
