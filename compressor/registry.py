"""The compressor registry: one dict keyed by name, filled through one function.

Built-in families register in their package ``__init__`` through :func:`register_compressor`; third-party
families do the same from a callback named in the ``ragpress.compressors`` entry-point group, e.g. in their
``pyproject.toml``::

    [project.entry-points."ragpress.compressors"]
    myfamily = "mypkg.family:register"     # register() calls ragpress' register_compressor(...)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .base import Compressor, TokenCounter
from .errors import ConfigError, UnknownNameError

__all__ = ["CompressorSpec", "register_compressor", "get_compressor", "available_compressors", "get_spec"]

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{1,31}(\+[a-z][a-z0-9_]{1,31})?$")  # 'a+b': a composition
_REGISTRY: dict[str, CompressorSpec] = {}
_ENTRY_POINTS_LOADED = False
ENTRY_POINT_GROUP = "ragpress.compressors"


@dataclass(frozen=True)
class CompressorSpec:
    """How to build one registered family. ``factory(counter=..., **options) -> Compressor``."""

    name: str
    factory: Callable[..., Compressor]
    kind: Literal["text", "soft"]
    description: str
    fixed_ratio: bool = False  # the ratio is set by training (soft families): benchmarks run it once, unbudgeted
    cacheable: bool = False  # accepts ``cache_dir``: per-passage work (slots, sentence embeddings) is stored and reused
    artifact: Path | None = None  # the shipped artifact folder a trained family builds from when none is given

    @property
    def shipped(self) -> bool:
        """Builds without an ``artifact`` option: it needs none, or its trained artifact ships. A trained family
        always registers; without its artifact, building it raises :class:`ArtifactError` naming the fix."""
        return self.artifact is None or (self.artifact / "compressor_config.json").is_file()


def register_compressor(
    name: str, factory: Callable[..., Compressor], *, kind: Literal["text", "soft"], description: str,
    fixed_ratio: bool = False, cacheable: bool = False, artifact: Path | None = None,
) -> CompressorSpec:
    """Register a family under ``name``. Rejects bad names and duplicates. ``artifact``: the folder of the
    trained artifact the family ships (it registers either way; :attr:`CompressorSpec.shipped` says whether
    it is there)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"compressor name {name!r} is invalid: use 2-32 chars of lowercase letters, digits and '_', "
            "starting with a letter (a composition joins two such names with '+')"
        )
    if name in _REGISTRY:
        raise ConfigError(f"compressor {name!r} is already registered; pick another name")
    if kind not in ("text", "soft"):
        raise ConfigError(f"compressor kind {kind!r} is invalid: use 'text' or 'soft'")
    spec = CompressorSpec(name=name, factory=factory, kind=kind, description=description, fixed_ratio=fixed_ratio,
                          cacheable=cacheable, artifact=Path(artifact) if artifact is not None else None)
    _REGISTRY[name] = spec
    return spec


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()()


def available_compressors() -> dict[str, CompressorSpec]:
    """All registered families, built-in and third-party, by name."""
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def get_spec(name: str) -> CompressorSpec:
    specs = available_compressors()
    if name not in specs:
        raise UnknownNameError(
            f"unknown compressor {name!r}; registered compressors are: {', '.join(specs)}"
        )
    return specs[name]


def get_compressor(name: str, counter: TokenCounter, **options: Any) -> Compressor:
    """Build the registered compressor ``name`` counting tokens with ``counter``."""
    return get_spec(name).factory(counter=counter, **options)
