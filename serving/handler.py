"""The proxy's serving handler, built once at start-up and kept on ``app.state``.

request -> find documents (body and marked) -> compress them against the question -> put the kept text back
(a soft method's slots: a splice mark where the text would be, and the rows beside the payload) -> upstream ->
response with a ``compression`` block beside ``usage``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

from adapters.evaluate import build_method
from compressor.base import Budget, CompressedContext, Compressor, TokenCounter
from compressor.errors import ArtifactError, BudgetError, ConfigError, InputError
from compressor.prompt import with_marks
from compressor.registry import available_compressors, get_spec

from .batching import CompressionBatcher
from .documents import ExtractedDocs, extract_chat, extract_prompt, render_chat, render_prompt
from .limits import InputLimits, check_documents
from .metrics import Metrics
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    CompressionInfo,
    CompressionOptions,
    InspectRequest,
    ProxyError,
)
from .upstream import Kind, Upstream

__all__ = ["ProxyHandler", "sse"]


def sse(event: dict[str, Any] | str) -> bytes:
    """One server-sent event in OpenAI's framing."""
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class ProxyHandler:
    """Compresses request documents with a registered method and forwards to one upstream. Soft methods are
    served where the upstream takes embeddings (:attr:`Upstream.takes_embeddings`), built for the model it
    serves.

    ``method`` and ``budget`` are the server's defaults; a request's ``compression`` block overrides them.
    ``cache_dir``: the per-passage cache the cacheable methods read and fill (a folder or an fsspec URL; replicas
    may share one).
    Compressors are built once per method name and reused; the default one is built here, so a bad default
    fails at start-up, not on the first request. ``limits`` bound what one request may ask of them.
    """

    def __init__(self, upstream: Upstream, counter: TokenCounter, method: str = "bm25",
                 budget: Budget | None = None, metrics: Metrics | None = None,
                 limits: InputLimits | None = None, batcher: CompressionBatcher | None = None,
                 cache_dir: str | None = None) -> None:
        self.upstream = upstream
        self.counter = counter
        self.method = method
        self.budget = budget or Budget()
        self.metrics = metrics or Metrics()
        self.limits = limits or InputLimits()
        self.cache_dir = cache_dir
        self._compressors: dict[str, Compressor] = {}
        self._build_lock = threading.Lock()
        self.batcher = batcher or CompressionBatcher()  # compressors hold models and caches: one call at a time
        try:
            self.compressor(method)
        except ProxyError as e:  # a bad default fails at start-up, as one line
            raise ConfigError(f"--method {method}: {e}") from None

    # -- compression -----------------------------------------------------------------------------------
    def text_methods(self) -> list[str]:
        return [n for n, s in available_compressors().items() if s.kind == "text"]

    def served_methods(self) -> list[str]:
        """The methods a request may ask for here: the text ones, and the soft ones that ship where the upstream
        takes embeddings."""
        return [n for n, s in available_compressors().items()
                if s.kind == "text" or (self.upstream.takes_embeddings and s.shipped)]

    def compressor(self, name: str) -> Compressor:
        """The compressor for a registered method (built on first use, for the upstream's model)."""
        spec = get_spec(name)  # UnknownNameError lists the registered names
        if spec.kind != "text" and not self.upstream.takes_embeddings:
            raise ProxyError(400, f"method {name!r} produces soft prompts, which the upstream {self.upstream.name} "
                             "cannot take: it needs the embedded decoder, or a vLLM upstream started with "
                             "--enable-prompt-embeds and named with --upstream-prompt-embeds. Text methods: "
                             f"{', '.join(self.text_methods())}", param="compression.method", code="unsupported_method")
        with self._build_lock:
            if name not in self._compressors:
                try:
                    opts = {"cache_dir": self.cache_dir} if self.cache_dir and spec.cacheable else None
                    self._compressors[name] = build_method(name, self.counter, self.upstream.decoder or "", opts)
                except ArtifactError as e:  # no trained artifact here, or one for another decoder
                    raise ProxyError(400, f"method {name!r} is not available on this server ({e}); methods served "
                                     f"here: {', '.join(self.served_methods())}", param="compression.method",
                                     code="method_unavailable") from None
                adapter = self._compressors[name].decoder_adapter()
                if adapter is not None:  # its slots are read by the decoder with that adapter, not the upstream's
                    del self._compressors[name]
                    raise ProxyError(400, f"method {name!r} was trained with a decoder LoRA adapter ({adapter.name}) "
                                     "that this proxy's upstream does not apply yet; use it through the Python API "
                                     f"(RAGPipeline) or ragpress eval/bench. Methods served here: "
                                     f"{', '.join(m for m in self.served_methods() if m != name)}",
                                     param="compression.method", code="method_unavailable")
            return self._compressors[name]

    def cache_counts(self) -> dict[str, tuple[int, int]]:
        """Per built method with a per-passage cache: (hits, misses) of its cache reads so far."""
        out = {}
        for name, comp in list(self._compressors.items()):
            caches = comp.caches()
            if caches:
                out[name] = (sum(c.hits for c in caches), sum(c.misses for c in caches))
        return out

    def _budget(self, opts: CompressionOptions | None) -> Budget:
        """The server's budget with what the request's ``compression`` block sets (validated there)."""
        if opts is None:
            return self.budget
        update: dict[str, Any] = {k: v for k, v in (("early_stop", opts.early_stop), ("strict", opts.strict))
                                  if v is not None}
        if opts.ratio is not None or opts.target_tokens is not None:
            update.update(ratio=opts.ratio, target_tokens=opts.target_tokens)
        return self.budget.model_copy(update=update)

    async def _compress(self, docs: ExtractedDocs,
                        opts: CompressionOptions | None) -> tuple[CompressedContext | None, CompressionInfo]:
        """Compress every document of a request in one call; None when compression is off or there are none."""
        method = (opts.method if opts and opts.method else None) or self.method
        enabled = opts.enabled if opts else True
        comp = self.compressor(method) if enabled else None  # a bad name is a 400 even without documents
        if not len(docs) or comp is None:
            n = sum(await anyio.to_thread.run_sync(check_documents, docs, self.counter, self.limits, False)) \
                if len(docs) else 0
            return None, CompressionInfo(method=method if enabled else "off", enabled=enabled, documents=len(docs),
                                         tokens_before=n, tokens_after=n, ratio=1.0 if n else None,
                                         compression_ms=0.0)
        budget = self._budget(opts)
        t0 = time.perf_counter()
        await anyio.to_thread.run_sync(check_documents, docs, self.counter, self.limits, True)  # it tokenizes
        try:  # gathered with concurrent requests for up to the batcher's wait, compressed together
            ctx = await self.batcher.compress(comp, docs.query, docs.passages, budget, bool(opts and opts.explain))
        except BudgetError as e:  # a strict budget the method cannot meet: the client's to change
            param = "compression.target_tokens" if budget.target_tokens is not None else "compression.ratio"
            raise ProxyError(400, str(e), param=param, code="budget_unreachable") from None
        ms = (time.perf_counter() - t0) * 1000
        return ctx, CompressionInfo(method=ctx.method, enabled=True, documents=len(docs), tokens_before=ctx.tokens_in,
                                    tokens_after=ctx.tokens_out, ratio=ctx.ratio, asked_ratio=ctx.asked_ratio,
                                    kind=ctx.kind, compression_ms=round(ms, 3),
                                    stopped_by=ctx.stopped_by, duplicates=ctx.duplicates,
                                    duplicate_sentences=ctx.duplicate_sentences,
                                    explanation=[ctx.explanation] if ctx.explanation is not None else None)

    # -- endpoints -------------------------------------------------------------------------------------
    async def chat(self, req: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        messages = [m.model_dump(exclude_unset=True) for m in req.messages]
        docs = await anyio.to_thread.run_sync(extract_chat, messages, req.documents)  # linear, but bodies are MBs
        ctx, info = await self._compress(docs, req.compression)
        rows: dict[str, Any] = {}
        if len(docs):
            shown, rows = with_marks(ctx) if ctx is not None else (None, {})
            messages = render_chat(messages, docs, shown)
        return await self._forward("chat", req, messages, info, [rows])

    async def completion(self, req: CompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        prompts, infos, rows = [], [], []
        if req.documents and len(req.prompts) * len(req.documents) > self.limits.max_documents:
            raise ProxyError(400, f"{len(req.prompts)} prompts x {len(req.documents)} body documents are "
                             f"{len(req.prompts) * len(req.documents)} documents to compress, over this proxy's "
                             f"limit of {self.limits.max_documents} per request (--max-documents): send fewer",
                             param="documents", code="too_many_documents")
        for i, prompt in enumerate(req.prompts):
            docs = await anyio.to_thread.run_sync(extract_prompt, prompt, i, req.documents)
            ctx, info = await self._compress(docs, req.compression)
            shown, marks = with_marks(ctx) if ctx is not None else (None, {})
            prompts.append(render_prompt(prompt, docs, shown) if len(docs) else prompt)
            infos.append(info)
            rows.append(marks)
        if not infos:
            raise InputError("prompt is an empty list; give at least one prompt")
        return await self._forward("completion", req, prompts, _merge(infos), rows)

    async def inspect(self, req: InspectRequest) -> dict[str, Any]:
        """Compress only, with the explanation (the inspector page): the ``compression`` block a chat request with
        these documents would get, without decoding."""
        docs = await anyio.to_thread.run_sync(extract_chat, [{"role": "user", "content": req.question}], req.documents)
        opts = (req.compression or CompressionOptions()).model_copy(update={"explain": True})
        _, info = await self._compress(docs, opts)
        return {"compression": info.model_dump(mode="json")}

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": await self.upstream.models()}

    async def _forward(self, kind: Kind, req: ChatCompletionRequest | CompletionRequest, payload: list[Any],
                       info: CompressionInfo, rows: list[dict[str, Any]]) -> dict[str, Any] | AsyncIterator[bytes]:
        """``rows``: per prompt (one for chat), the soft rows by splice mark (empty: text only)."""
        self.metrics.record_compression(info)
        block = info.model_dump(mode="json", exclude={"explanation"} if info.explanation is None else None)
        soft = rows if any(rows) else None
        if not req.stream:
            return {**await self.upstream.complete(kind, req, payload, soft), "compression": block}
        chunks = await self.upstream.stream(kind, req, payload, soft)  # errors here still get an HTTP status
        return _sse_stream(chunks, block)


def _merge(infos: list[CompressionInfo]) -> CompressionInfo:
    """One block for a completion request with several prompts."""
    if len(infos) == 1:
        return infos[0]
    before, after = sum(i.tokens_before for i in infos), sum(i.tokens_after for i in infos)
    asked = {i.asked_ratio for i in infos}
    return CompressionInfo(method=infos[0].method, enabled=infos[0].enabled, documents=sum(i.documents for i in infos),
                           tokens_before=before, tokens_after=after, ratio=before / after if after else None,
                           asked_ratio=asked.pop() if len(asked) == 1 else None,
                           kind="soft" if any(i.kind == "soft" for i in infos) else "text",
                           compression_ms=sum(i.compression_ms for i in infos),
                           stopped_by=",".join(sorted({i.stopped_by for i in infos if i.stopped_by})) or None,
                           duplicates=sum(i.duplicates for i in infos),
                           duplicate_sentences=sum(i.duplicate_sentences for i in infos),
                           explanation=[i.explanation[0] if i.explanation else None for i in infos]
                           if any(i.explanation for i in infos) else None)


async def _sse_stream(chunks: AsyncIterator[dict[str, Any]], block: dict[str, Any]) -> AsyncIterator[bytes]:
    """OpenAI's framing: ``data: {chunk}`` events, the compression block on the first, then ``data: [DONE]``.
    An error after the first byte can no longer change the status: it is sent as an error event."""
    first = True
    try:
        async for c in chunks:
            yield sse({**c, "compression": block} if first else c)
            first = False
    except ProxyError as e:
        yield sse(e.body())
    except Exception as e:  # noqa: BLE001 - the stream has started; report instead of cutting it off
        yield sse(ProxyError(500, f"internal error: {type(e).__name__}: {e}", "internal_error").body())
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    yield sse("[DONE]")
