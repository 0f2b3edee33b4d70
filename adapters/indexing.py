"""``ragpress index`` as a library call: fill a method's per-passage cache for a corpus ahead of questions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compressor.base import Passage, TokenCounter
from compressor.errors import ConfigError
from compressor.registry import get_spec

from .evaluate import build_method

__all__ = ["index_corpus"]


def index_corpus(method: str, passages: Sequence[Passage], cache_dir: str | Path, decoder: str,
                 options: dict[str, Any] | None = None, chunk: int = 256, progress: bool = True) -> dict[str, Any]:
    """Index ``passages`` with ``method`` (sentinel sentence embeddings, icae slots) into ``cache_dir``, in
    steps of ``chunk`` passages; compress later with the same ``cache_dir``. Returns the totals of the
    :class:`~compressor.base.IndexReport` of every step (repeats are done once)."""
    from tqdm.auto import tqdm

    from compressor.models import load_tokenizer

    if not get_spec(method).cacheable:
        raise ConfigError(f"ragpress index: {method} keeps no per-passage cache; index with a method that has "
                          "one (sentinel, icae)")
    if chunk < 1:
        raise ConfigError(f"--chunk {chunk}: give a positive number of passages per step")
    counter = TokenCounter.from_tokenizer(load_tokenizer(decoder))
    comp = build_method(method, counter, decoder, {**(options or {}), "cache_dir": str(cache_dir)})
    totals: dict[str, Any] = {"passages": 0, "computed": 0, "cached": 0, "duplicates": 0, "skipped": 0, "seconds": 0.0}
    steps = range(0, len(passages), chunk)
    for i in tqdm(steps, desc=f"index {method}", unit="chunk", disable=not progress or len(passages) <= chunk):
        rep = comp.index(passages[i:i + chunk])
        for k in totals:
            totals[k] += getattr(rep, k)
    return {"method": method, "cache_dir": str(cache_dir), **totals, "seconds": round(totals["seconds"], 3)}
