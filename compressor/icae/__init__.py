"""The ``icae`` family: memory slots from a LoRA-adapted copy of the decoder (see :mod:`.model`).

Always registered as ``icae``; built without ``artifact`` it loads the trained encoder shipped at
``compressor/artifacts/icae-smollm2-135m/`` (and refuses untrained weights there), and where none ships it
raises :class:`~compressor.errors.ArtifactError` naming the fix. ``ragpress eval --method icae --artifact DIR``
(or :func:`load_icae`) loads an encoder you trained, or an untrained control made with ``ragpress train icae
--stage1-steps 0 --stage2-steps 0``.

Importing this package does not import torch: the torch-backed names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..base import TokenCounter
from ..registry import register_compressor
from .config import SHIPPED_ARTIFACT, ICAEConfig, ICAETrainConfig

__all__ = ["ICAECompressor", "ICAEConfig", "ICAEEncoder", "ICAETrainConfig", "SHIPPED_ARTIFACT", "SlotCache",
           "load_icae"]

_LAZY = {"ICAECompressor": ".model", "ICAEEncoder": ".model", "SlotCache": ".model", "load_icae": ".model"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make(counter: TokenCounter, artifact: str | None = None, **options: Any) -> Any:
    from .model import load_icae

    return load_icae(counter, artifact, **options)


register_compressor("icae", _make, kind="soft",
                    description="ICAE memory slots: LoRA encoder, 4x per 64-token segment (trained)",
                    fixed_ratio=True, cacheable=True, artifact=SHIPPED_ARTIFACT)
