"""The ``longllmlingua`` outside peer: LongLLMLingua from the ``llmlingua`` package, offline (see :mod:`.model`).

Always registered, like every method; building it without the package raises ``MissingExtraError`` naming
``pip install 'ragpress[bench]'``. Importing this package imports neither torch nor llmlingua.
"""

from __future__ import annotations

from typing import Any

from ..base import TokenCounter
from ..registry import register_compressor
from .config import LongLLMLinguaConfig

__all__ = ["LongLLMLinguaConfig", "LongLLMLinguaCompressor"]


def __getattr__(name: str) -> Any:
    if name == "LongLLMLinguaCompressor":
        from .model import LongLLMLinguaCompressor

        return LongLLMLinguaCompressor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make(counter: TokenCounter, **options: Any) -> Any:
    from .model import LongLLMLinguaCompressor

    return LongLLMLinguaCompressor(counter, LongLLMLinguaConfig(**options))


register_compressor("longllmlingua", _make, kind="text",
                    description="LongLLMLingua (llmlingua 0.2.2, outside peer; SmolLM2 scorer, offline)")
