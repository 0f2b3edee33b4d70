"""The ``sentinel`` family: a trained probe on a proxy LLM's attention (see :mod:`.model`)."""

from __future__ import annotations

from ..base import TokenCounter
from ..errors import ArtifactError
from ..registry import register_compressor
from .config import SentinelConfig
from .model import SHIPPED_ARTIFACT, SentinelCompressor, SentinelProbe

__all__ = ["SentinelConfig", "SentinelCompressor", "SentinelProbe", "SHIPPED_ARTIFACT"]


def _make(counter: TokenCounter, artifact: str | None = None, **options) -> SentinelCompressor:
    if artifact is None and not (SHIPPED_ARTIFACT / "compressor_config.json").is_file():
        raise ArtifactError(f"no shipped sentinel probe at {SHIPPED_ARTIFACT}; train one with `ragpress train "
                            "sentinel --out DIR` and pass `--artifact DIR`")
    return SentinelCompressor.from_pretrained(artifact or SHIPPED_ARTIFACT, counter, **options)


# Always registered; without its trained probe it refuses to build (untrained weights are never a compressor).
register_compressor("sentinel", _make, kind="text", description="attention probe on a proxy LLM (trained)",
                    cacheable=True, artifact=SHIPPED_ARTIFACT)
