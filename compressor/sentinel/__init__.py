"""The ``sentinel`` family: a trained probe on a proxy LLM's attention (see :mod:`.model`)."""

from __future__ import annotations

from pathlib import Path

from ..base import TokenCounter
from ..errors import ArtifactError
from ..registry import register_compressor
from .config import SentinelConfig
from .model import DEEP_ARTIFACT, SHALLOW_ARTIFACT, SHIPPED_ARTIFACT, SentinelCompressor, SentinelProbe

__all__ = ["SentinelConfig", "SentinelCompressor", "SentinelProbe", "SHIPPED_ARTIFACT", "DEEP_ARTIFACT",
           "SHALLOW_ARTIFACT"]


def _maker(shipped: Path, layers: str):
    def make(counter: TokenCounter, artifact: str | None = None, **options) -> SentinelCompressor:
        if artifact is None and not (shipped / "compressor_config.json").is_file():
            raise ArtifactError(f"no shipped sentinel probe at {shipped}; train one with `ragpress train sentinel "
                                f"--out DIR --layers {layers}` and pass `--artifact DIR`")
        return SentinelCompressor.from_pretrained(artifact or shipped, counter, **options)

    return make


# Always registered; without its trained probe each refuses to build (untrained weights are never a compressor).
# They differ only in how many proxy layers the probe reads: 2 (sentinel, the default since 2026-12-06), 4
# (sentinel_l4, the default before; the same answers within noise on the benchmark with both decoders, about a
# third more compression time: docs/experiments/sentinel.md#cost, benchmarks/sentinel-fast*) or 1 (sentinel_l1,
# the cheapest).
register_compressor("sentinel", _maker(SHIPPED_ARTIFACT, "2"), kind="text", cacheable=True,
                    description="attention probe on a proxy LLM (trained)", artifact=SHIPPED_ARTIFACT)
register_compressor("sentinel_l4", _maker(DEEP_ARTIFACT, "4"), kind="text", cacheable=True,
                    description="the attention probe on 4 proxy layers, not 2 (trained)", artifact=DEEP_ARTIFACT)
register_compressor("sentinel_l1", _maker(SHALLOW_ARTIFACT, "1"), kind="text", cacheable=True,
                    description="the attention probe on 1 proxy layer, the cheapest (trained)",
                    artifact=SHALLOW_ARTIFACT)
