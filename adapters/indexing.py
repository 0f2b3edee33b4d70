"""``ragpress index`` as a library call: fill a method's per-passage cache for a corpus ahead of questions."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from compressor.base import Passage, TokenCounter
from compressor.cache import local_root
from compressor.errors import ConfigError
from compressor.registry import get_spec

from .evaluate import build_method

__all__ = ["index_corpus", "IndexEngine"]


class IndexEngine(BaseModel):
    """Where ``ragpress index`` runs: in this process, or as a Ray Data job (``pip install 'ragpress[ray]'``)."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["local", "ray"] = Field(default="local", description="local: this process; ray: a Ray Data "
                                            "job, map_batches over passage blocks on actors that hold the model")
    workers: int = Field(default=2, ge=1, description="Ray actors (one CPU each) with --engine ray")
    ray_address: str | None = Field(default=None, description="a running Ray cluster (or 'auto'); none: a local "
                                    "Ray with --workers CPUs")
    chunk: int = Field(default=256, ge=1, description="passages per step (per Ray block)")


_TOTALS = ("passages", "computed", "cached", "duplicates", "skipped", "seconds")


def index_corpus(method: str, passages: Sequence[Passage], cache_dir: str | Path, decoder: str,
                 options: dict[str, Any] | None = None, chunk: int = 256, progress: bool = True,
                 engine: Literal["local", "ray"] = "local", workers: int = 2,
                 ray_address: str | None = None) -> dict[str, Any]:
    """Index ``passages`` with ``method`` (sentinel sentence embeddings, icae slots) into ``cache_dir``, in
    steps of ``chunk`` passages; compress later with the same ``cache_dir``. Returns the totals of the
    :class:`~compressor.base.IndexReport` of every step (repeats are done once).

    ``engine="ray"`` runs the same steps as a Ray Data job: the corpus (repeats removed) in blocks of ``chunk``
    passages, ``map_batches`` over ``workers`` actors that each load the method once, every actor writing the
    same content-addressed files into ``cache_dir`` (atomic writes, so a shared folder takes concurrent writers).
    ``ray_address``: a running cluster (``ray start --head``, or ``auto``); without one a local Ray starts with
    ``workers`` CPUs. On a cluster, ``cache_dir`` must be a folder every node sees (a shared filesystem)."""
    if not get_spec(method).cacheable:
        raise ConfigError(f"ragpress index: {method} keeps no per-passage cache; index with a method that has "
                          "one (sentinel, icae, xrag)")
    if chunk < 1:
        raise ConfigError(f"--chunk {chunk}: give a positive number of passages per step")
    if engine not in ("local", "ray"):
        raise ConfigError(f"--engine {engine!r}: choose local or ray")
    if workers < 1:
        raise ConfigError(f"--workers {workers}: give a positive number of Ray actors")
    local = local_root(cache_dir)
    cache_dir = str(local.resolve()) if local is not None else str(cache_dir)
    opts = {**(options or {}), "cache_dir": cache_dir}  # absolute: Ray workers may run in another folder
    t0 = time.perf_counter()
    unique = list({(p.title, p.text): p for p in passages}.values())  # a repeat is done once, wherever it is
    if engine == "ray":
        totals = _index_ray(method, unique, decoder, opts, chunk, workers, ray_address, progress)
    else:
        totals = _index_local(method, unique, decoder, opts, chunk, progress)
    totals.update(passages=len(passages), duplicates=len(passages) - len(unique),
                  seconds=time.perf_counter() - t0)  # the job's wall time, start-up included
    return {"method": method, "cache_dir": str(cache_dir), "engine": engine, **totals,
            "seconds": round(totals["seconds"], 3)}


def _indexer(method: str, decoder: str, options: dict[str, Any]) -> Any:
    from compressor.models import load_tokenizer

    counter = TokenCounter.from_tokenizer(load_tokenizer(decoder))
    return build_method(method, counter, decoder, options)


def _index_local(method: str, passages: list[Passage], decoder: str, options: dict[str, Any], chunk: int,
                 progress: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    comp = _indexer(method, decoder, options)
    totals: dict[str, Any] = dict.fromkeys(_TOTALS, 0)
    steps = range(0, len(passages), chunk)
    for i in tqdm(steps, desc=f"index {method}", unit="chunk", disable=not progress or len(passages) <= chunk):
        rep = comp.index(passages[i:i + chunk])
        for k in totals:
            totals[k] += getattr(rep, k)
    return totals


class _RayIndexer:
    """One Ray actor: the method loaded once, then :meth:`Compressor.index` per block of passages."""

    def __init__(self, method: str, decoder: str, options: dict[str, Any]) -> None:
        self.comp = _indexer(method, decoder, options)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        titles, texts = batch["title"], batch["text"]
        rep = self.comp.index([Passage(text=str(x), title=str(t) if t else None) for t, x in zip(titles, texts)])
        return {k: [getattr(rep, k)] for k in _TOTALS}


def _index_ray(method: str, passages: list[Passage], decoder: str, options: dict[str, Any], chunk: int,
               workers: int, address: str | None, progress: bool) -> dict[str, Any]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray: pip install 'ragpress[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    bars = ctx.enable_progress_bars
    ctx.enable_progress_bars = bars and progress
    logging.getLogger("ray.data").setLevel(logging.INFO if progress else logging.WARNING)
    try:
        ds = ray.data.from_items([{"title": p.title or "", "text": p.text} for p in passages],
                                 override_num_blocks=max(1, -(-len(passages) // chunk)))
        rows = ds.map_batches(_RayIndexer, fn_constructor_kwargs={"method": method, "decoder": decoder,
                                                                   "options": options},
                              batch_size=chunk, compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1,
                              batch_format="numpy").take_all()
    finally:
        ctx.enable_progress_bars = bars
        if started:
            ray.shutdown()
    totals: dict[str, Any] = dict.fromkeys(_TOTALS, 0)
    for r in rows:
        for k in _TOTALS:
            totals[k] += r[k]
    return totals
