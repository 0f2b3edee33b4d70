"""Micro-batching of the proxy's compression: concurrent requests compressed together.

A request that reaches compression waits at most ``max_wait_ms`` for others (or until ``max_batch`` are
waiting); the waiting requests of one compressor then go through one :meth:`~compressor.base.Compressor.
compress_batch` call in a worker thread (a filter's sentence embeddings in one batch, sentinel's proxy windows in
padded passes, icae's passages encoded together). While a batch runs, the next requests gather, so under load
batches fill by themselves and an idle server adds at most ``max_wait_ms``.

Each request gets its own result through its own future: nothing is reordered between clients, and a request
whose input fails (a strict budget the method cannot meet, say) fails alone: a batch that raises is run again one
request at a time, so every other request still gets its answer. Reading a request body happens before any of
this, so a slow client holds nobody. ``max_batch=1`` turns batching off (one call per request, no wait).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import anyio

from compressor.base import Budget, CompressedContext, Compressor

__all__ = ["CompressionBatcher"]


@dataclass
class _Item:
    comp: Compressor
    query: str
    passages: list[Any]
    budget: Budget
    explain: bool
    future: asyncio.Future = field(repr=False)


class CompressionBatcher:
    """Gathers compression calls for up to ``max_wait_ms`` (at most ``max_batch`` at a time) and runs the calls
    of each compressor as one ``compress_batch``; ``lock`` serialises all compression (compressors hold models
    and caches). ``batches`` and ``batched`` count the calls made and the requests they carried."""

    def __init__(self, max_batch: int = 8, max_wait_ms: float = 5.0, lock: threading.Lock | None = None) -> None:
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch {max_batch} must be >= 1 and max_wait_ms {max_wait_ms} >= 0")
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1000
        self.lock = lock or threading.Lock()
        self.batches = 0
        self.batched = 0
        self._pending: list[_Item] = []
        self._timer: asyncio.TimerHandle | None = None
        self._counts = threading.Lock()

    async def compress(self, comp: Compressor, query: str, passages: list[Any], budget: Budget,
                       explain: bool = False) -> CompressedContext:
        """This request's compressed context, computed in a batch with whatever else arrived meanwhile."""
        if self.max_batch == 1:
            return await anyio.to_thread.run_sync(self._run_one, comp, query, passages, budget, explain)
        loop = asyncio.get_running_loop()
        item = _Item(comp, query, passages, budget, explain, loop.create_future())
        self._pending.append(item)
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush)
        return await item.future

    def _run_one(self, comp: Compressor, query: str, passages: list[Any], budget: Budget,
                 explain: bool) -> CompressedContext:
        with self.lock:
            self._count(1)
            return comp.compress(query, passages, budget, explain=explain)

    def _count(self, n: int) -> None:
        with self._counts:
            self.batches += 1
            self.batched += n

    def _flush(self) -> None:
        """Take up to ``max_batch`` waiting calls (oldest first) and start them; arm the timer for the rest."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        take, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
        if take:
            asyncio.get_running_loop().create_task(self._run(take))
        if self._pending:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._flush)

    async def _run(self, items: list[_Item]) -> None:
        groups: dict[tuple[int, bool], list[_Item]] = {}
        for it in items:
            groups.setdefault((id(it.comp), it.explain), []).append(it)
        for group in groups.values():
            try:
                results = await anyio.to_thread.run_sync(self._run_group, group)
            except BaseException as e:  # noqa: BLE001 - delivered to every caller; never lost in a task
                results = [e] * len(group)
            for it, r in zip(group, results, strict=True):
                if it.future.done():  # the client went away
                    continue
                if isinstance(r, BaseException):
                    it.future.set_exception(r)
                else:
                    it.future.set_result(r)

    def _run_group(self, group: list[_Item]) -> list[CompressedContext | BaseException]:
        """One ``compress_batch`` for the group; if it raises, each request alone, so only the failing ones fail."""
        comp = group[0].comp
        with self.lock:
            try:
                out: list[CompressedContext | BaseException] = list(comp.compress_batch(
                    [(it.query, it.passages, it.budget) for it in group], explain=group[0].explain))
                self._count(len(group))
                return out
            except Exception:  # noqa: BLE001 - find which request failed; the others still answer
                if len(group) == 1:
                    raise
            out = []
            for it in group:
                try:
                    out.append(comp.compress(it.query, it.passages, it.budget, explain=it.explain))
                    self._count(1)
                except Exception as e:  # noqa: BLE001 - this request's own failure
                    out.append(e)
            return out
