"""Micro-batching in the proxy: concurrent requests compressed together, and decoded together by the embedded
decoder.

A call waits at most ``max_wait_ms`` for others (or until ``max_batch`` are waiting); the waiting calls that can
share one batch then run as one call in a worker thread. Compression: the requests of one compressor go through
one :meth:`~compressor.base.Compressor.compress_batch` (a filter's sentence embeddings in one batch, sentinel's
proxy windows in padded passes, icae's passages encoded together). Decoding: prompts with the same generation
parameters go through one ``backend.generate`` (left-padded, one forward pass per new token for all of them).
While a batch runs, the next calls gather, so under load batches fill by themselves and an idle server adds at
most ``max_wait_ms``.

Each call gets its own result through its own future: nothing is reordered between clients, and a call that
fails (a strict budget the method cannot meet, say) fails alone: a batch that raises is run again one call at a
time, so every other call still gets its answer. Reading a request body happens before any of this, so a slow
client holds nobody. ``max_batch=1`` turns batching off (one call per request, no wait).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio

from adapters.decoders import DecoderBackend, Generation, GenerationParams, GenerationStopped
from compressor.base import Budget, CompressedContext, Compressor
from compressor.prompt import Prompt

__all__ = ["CompressionBatcher", "DecodeBatcher", "DecodeTimeout"]


class _MicroBatcher:
    """Gathers calls for up to ``max_wait_ms`` (at most ``max_batch`` at a time) and runs each group of calls
    that :meth:`_key` puts together as one :meth:`_run_group` in a worker thread; ``lock`` serialises the runs
    (the work holds a model). ``batches`` and ``batched`` count the runs made and the calls they carried."""

    def __init__(self, max_batch: int = 8, max_wait_ms: float = 5.0, lock: threading.Lock | None = None) -> None:
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch {max_batch} must be >= 1 and max_wait_ms {max_wait_ms} >= 0")
        self.max_batch, self.max_wait_s = max_batch, max_wait_ms / 1000
        self.lock = lock or threading.Lock()
        self.batches = 0
        self.batched = 0
        self._pending: list[Any] = []
        self._running = 0  # batches started and not finished: while one runs, the next calls gather
        self._tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._counts = threading.Lock()

    def _key(self, item: Any) -> Hashable:
        """Calls with equal keys may share one run."""
        raise NotImplementedError

    def _run_group(self, group: list[Any]) -> list[Any]:
        """The result (or exception) of every call of ``group``, in order; runs in a worker thread."""
        raise NotImplementedError

    async def _submit(self, item: Any) -> Any:
        if self.max_batch == 1:
            out = (await anyio.to_thread.run_sync(self._run_group, [item]))[0]
            if isinstance(out, BaseException):
                raise out
            return out
        self._pending.append(item)
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None and not self._running:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._flush)
        return await item.future

    def _together_or_alone(self, group: list[Any], run: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """``run(group)``; if it raises, ``run([call])`` for each call alone, so only the failing calls fail (their
        exception is their result). Counts the runs that answered."""
        try:
            out = run(group)
            self._count(len(group))
            return out
        except Exception as e:  # noqa: BLE001 - find which call failed; the others still answer
            if len(group) == 1:
                return [e]
        out = []
        for it in group:
            try:
                out.append(run([it])[0])
                self._count(1)
            except Exception as e:  # noqa: BLE001 - this call's own failure
                out.append(e)
        return out

    def _count(self, n: int) -> None:
        with self._counts:
            self.batches += 1
            self.batched += n

    def _flush(self) -> None:
        """Take up to ``max_batch`` waiting calls (oldest first) and start them, unless a batch is running: then
        the calls keep gathering (up to ``max_batch``) and start when it ends. Arm the timer for the rest."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._running:
            return  # the running batch flushes when it ends
        self._pending = [it for it in self._pending if not it.future.done()]  # their clients went away
        take, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
        if take:
            self._running += 1
            task = asyncio.get_running_loop().create_task(self._run(take))
            self._tasks.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)
        if self._pending:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._flush)

    async def _run(self, items: list[Any]) -> None:
        try:
            groups: dict[Hashable, list[Any]] = {}
            for it in items:
                groups.setdefault(self._key(it), []).append(it)
            for group in groups.values():
                group = [it for it in group if not it.future.done()]  # their clients went away meanwhile
                if not group:
                    continue
                try:
                    results = await anyio.to_thread.run_sync(self._run_group, group)
                    if len(results) != len(group):
                        raise RuntimeError(f"a batch of {len(group)} calls gave {len(results)} results")
                except Exception as e:  # noqa: BLE001 - delivered to every caller of the group
                    results = [e] * len(group)
                for it, r in zip(group, results, strict=True):
                    if it.future.done():  # the client went away
                        continue
                    if isinstance(r, BaseException):
                        it.future.set_exception(r)
                    else:
                        it.future.set_result(r)
        finally:
            for it in items:  # whatever happened above (cancellation included), no caller waits forever
                if not it.future.done():
                    it.future.set_exception(RuntimeError("the batch this call was in did not finish"))
            self._running -= 1
            if self._pending:
                self._flush()


@dataclass
class _Compress:
    comp: Compressor
    query: str
    passages: list[Any]
    budget: Budget
    explain: bool
    future: asyncio.Future | None = field(default=None, repr=False)


class CompressionBatcher(_MicroBatcher):
    """Compression calls of one compressor (and one ``explain``) run as one ``compress_batch``."""

    async def compress(self, comp: Compressor, query: str, passages: list[Any], budget: Budget,
                       explain: bool = False) -> CompressedContext:
        """This request's compressed context, computed in a batch with whatever else arrived meanwhile."""
        future = None if self.max_batch == 1 else asyncio.get_running_loop().create_future()
        return await self._submit(_Compress(comp, query, passages, budget, explain, future))

    def _key(self, item: _Compress) -> Hashable:
        return id(item.comp), item.explain

    def _run_group(self, group: list[_Compress]) -> list[CompressedContext | BaseException]:
        """One ``compress_batch`` for the group (plain ``compress`` for one); if it raises, each request alone,
        so only the failing ones fail."""
        comp = group[0].comp

        def run(items: list[_Compress]) -> list[CompressedContext]:
            if len(items) == 1:
                it = items[0]
                return [comp.compress(it.query, it.passages, it.budget, explain=it.explain)]
            return list(comp.compress_batch([(it.query, it.passages, it.budget) for it in items],
                                            explain=items[0].explain))

        with self.lock:
            return self._together_or_alone(group, run)


class DecodeTimeout(Exception):
    """A decode call that did not get the decoder, or finish, before its deadline."""


@dataclass
class _Decode:
    backend: DecoderBackend
    prompt: Prompt
    params: GenerationParams
    deadline: float  # time.monotonic()
    future: asyncio.Future | None = field(default=None, repr=False)


class DecodeBatcher(_MicroBatcher):
    """Non-streaming generations with the same parameters run as one ``backend.generate`` (the transformers
    backend decodes a left-padded batch, one forward pass per new token for all rows). A seeded sampling call
    runs alone, so its seed gives the same text as it would unbatched. ``lock`` is the decoder's lock, shared
    with streaming calls (which run one at a time)."""

    async def decode(self, backend: DecoderBackend, prompt: Prompt, params: GenerationParams,
                     deadline: float) -> Generation:
        future = None if self.max_batch == 1 else asyncio.get_running_loop().create_future()
        return await self._submit(_Decode(backend, prompt, params, deadline, future))

    def _key(self, item: _Decode) -> Hashable:
        if item.params.temperature > 0 and item.params.seed is not None:
            return id(item)
        return id(item.backend), item.params.model_dump_json()

    def _run_group(self, group: list[_Decode]) -> list[Generation | BaseException]:
        last = max(it.deadline for it in group)
        wait = last - time.monotonic()
        if wait < 0 or not self.lock.acquire(timeout=wait):
            return [DecodeTimeout() for _ in group]
        try:
            gens = self._together_or_alone(group, self._generate)
        finally:
            self.lock.release()
        now = time.monotonic()
        return [DecodeTimeout() if now > it.deadline and not isinstance(g, BaseException) else g
                for it, g in zip(group, gens, strict=True)]

    @staticmethod
    def _generate(group: list[_Decode]) -> list[Generation | DecodeTimeout]:
        """One ``generate`` for the group; a backend that takes a ``stop`` check (the transformers one) ends its
        decode loop once the group's last deadline passes or every caller has left: then each call times out."""
        backend, prompts, params = group[0].backend, [it.prompt for it in group], group[0].params
        deadline = max(it.deadline for it in group)
        if "stop" not in inspect.signature(backend.generate).parameters:
            return list(backend.generate(prompts, params))

        def stop() -> bool:
            return time.monotonic() > deadline or all(it.future is not None and it.future.done() for it in group)

        try:
            return list(backend.generate(prompts, params, stop=stop))
        except GenerationStopped:
            return [DecodeTimeout() for _ in group]
