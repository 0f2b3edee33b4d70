"""The OpenAI-compatible compression proxy: settings, app factory, thin routers and the error edge.

``create_app(settings)`` builds the upstream and the :class:`~serving.handler.ProxyHandler` once and keeps
them on ``app.state``; ``serve(settings)`` runs it under uvicorn. Every error leaves as
``{"error": {"message", "type", "param", "code"}}``: 400 bad input, 401 missing or wrong key, 404 unknown
model or route, 413 body too large, 502 upstream unreachable, 504 timeout.

Nothing here logs a request body or a header: API keys are compared in constant time
(:func:`hmac.compare_digest` against every key) and never echoed; uvicorn's access log holds only the
method, path and status.
"""

from __future__ import annotations

import base64
import hmac
import json
import re
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.decoders import DecoderBackend
from compressor.base import TokenCounter
from compressor.errors import BackendError, MissingExtraError, RagpressError, UnknownNameError
from compressor.models import load_tokenizer

from .batching import CompressionBatcher
from .handler import ProxyHandler
from .inspector import add_inspector
from .limits import check_json
from .metrics import Metrics
from .openapi import openapi_schema
from .protocol import ChatCompletionRequest, CompletionRequest, InspectRequest, ProxyError
from .settings import ProxySettings
from .upstream import EmbeddedUpstream, RemoteUpstream, Upstream

__all__ = ["ProxySettings", "create_app", "serve", "serve_in_thread"]


def _error(e: ProxyError) -> JSONResponse:
    headers = e.headers or ({"WWW-Authenticate": "Bearer"} if e.status == 401 else None)
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _as_proxy_error(e: Exception) -> ProxyError:
    if isinstance(e, ProxyError):
        return e
    if isinstance(e, UnknownNameError):
        return ProxyError(400, str(e), param="compression.method", code="unknown_method")
    if isinstance(e, BackendError):
        return ProxyError(502, str(e), "upstream_error", code="upstream_error")
    if isinstance(e, MissingExtraError):
        return ProxyError(500, str(e), "server_error", code="missing_extra")
    if isinstance(e, RagpressError):  # InputError, ConfigError: the request asked for something unusable
        return ProxyError(400, str(e))
    return ProxyError(500, f"internal error: {type(e).__name__}", "server_error", code="internal_error")


class _Metered:
    """ASGI middleware: counts every HTTP request by path and status, timed to its last byte."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def send_(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_)
        finally:
            self.metrics.record_request(scope["path"], status[0], time.perf_counter() - t0)


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
    too_big = ProxyError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_big
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > limit:
            raise too_big
    if len(buf) > 64 * 1024:  # megabytes take a while to parse and walk: not on the event loop
        return await anyio.to_thread.run_sync(_parse_json, buf)
    return _parse_json(buf)


def _parse_json(buf: bytearray) -> dict[str, Any]:
    try:
        text = bytes(buf).decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ProxyError(400, f"request body is not valid UTF-8 (byte 0x{buf[e.start]:02x} at offset {e.start}); "
                         "send JSON encoded as UTF-8", code="invalid_encoding") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ProxyError(400, "request body nests too deeply to parse; flatten it", code="invalid_json") from None
    except json.JSONDecodeError as e:
        raise ProxyError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    except ValueError:  # an integer literal longer than Python converts (4,300 digits)
        raise ProxyError(400, "request body holds an integer too long to read; no field takes one that large",
                         code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProxyError(400, f"request body must be a JSON object, not a JSON {type(data).__name__}",
                         code="invalid_json")
    check_json(data)
    return data


# A value that matches no member of a union fails once per member, each location tagged with the member
# ('documents.0.str', 'documents.0.Document.body'). Our fields are lowercase; the tags are type names.
_UNION_TAG = re.compile(r"^(?:[A-Z]\w*|str|int|float|bool|none|(?:list|dict|tuple|set)\[.*\])$")


def _validation_error(e: ValidationError) -> ProxyError:
    """One 400 naming the field: union tags dropped from locations; where one member of a union got past the
    type check, the other members' 'not a string / not an object' errors dropped as noise."""
    errs = [(er["type"], tuple(er["loc"]), er["msg"]) for er in e.errors(include_url=False)]

    def clean(loc: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(x for x in loc if not (isinstance(x, str) and _UNION_TAG.match(x)))

    def noise(typ: str, loc: tuple[Any, ...]) -> bool:
        parent = clean(loc)
        return typ.endswith("_type") and any(
            not t.endswith("_type") and clean(lc)[: len(parent)] == parent for t, lc, _ in errs if lc != loc)

    kept: list[tuple[tuple[Any, ...], str]] = []
    for typ, loc, msg in errs:
        if not noise(typ, loc) and (clean(loc), msg) not in kept:
            kept.append((clean(loc), msg))
    common = kept[0][0] if kept else ()
    for loc, _ in kept[1:]:
        n = 0
        while n < min(len(common), len(loc)) and common[n] == loc[n]:
            n += 1
        common = common[:n]
    param = ".".join(str(x) for x in (common or (kept[0][0] if kept else ()))) or None
    detail = "; ".join(f"{'.'.join(str(x) for x in loc) or 'body'}: {msg}" for loc, msg in kept)
    return ProxyError(400, detail, param=param)


def _validate(cls: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None


def _respond(out: dict[str, Any] | Any) -> Response:
    if isinstance(out, dict):
        return JSONResponse(out)
    return StreamingResponse(out, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _build_upstream(settings: ProxySettings, backend: DecoderBackend | None,
                    transport: httpx.AsyncBaseTransport | None) -> tuple[Upstream, Any]:
    if settings.upstream is None:
        opts = {"timeout_s": settings.timeout_s, "default_max_tokens": settings.default_max_tokens,
                "batch_max_size": settings.batch_max_size, "batch_max_wait_ms": settings.batch_max_wait_ms}
        up = (EmbeddedUpstream(backend, settings.served_model_name or settings.model, **opts)
              if backend is not None else
              EmbeddedUpstream.load(settings.model, served_name=settings.served_model_name, **opts))
        tok = load_tokenizer(settings.tokenizer) if settings.tokenizer else up.backend.tokenizer
        return up, tok
    tok = backend.tokenizer if backend is not None and not settings.tokenizer else load_tokenizer(
        settings.tokenizer or settings.model)
    up = RemoteUpstream(settings.upstream, api_key=settings.upstream_api_key, timeout_s=settings.timeout_s,
                        transport=transport, prompt_embeds=settings.model if settings.upstream_prompt_embeds else None,
                        embeds_dtype=settings.upstream_dtype, tokenizer=backend.tokenizer if backend is not None else None,
                        default_max_tokens=settings.default_max_tokens)
    return up, tok


def create_app(settings: ProxySettings | None = None, *, backend: DecoderBackend | None = None,
               transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The proxy app. ``backend``: reuse an already loaded decoder (embedded upstream; with a remote one, only
    its tokenizer counts tokens). ``transport``: an httpx transport for the remote upstream (tests)."""
    settings = settings or ProxySettings()
    upstream, tokenizer = _build_upstream(settings, backend, transport)
    metrics = Metrics()
    handler = ProxyHandler(upstream, TokenCounter.from_tokenizer(tokenizer), method=settings.method,
                           budget=settings.budget(), metrics=metrics, limits=settings.limits(),
                           batcher=CompressionBatcher(settings.batch_max_size, settings.batch_max_wait_ms),
                           cache_dir=settings.cache_dir)
    metrics.batcher, metrics.caches = handler.batcher, handler.cache_counts
    metrics.decode_batcher = getattr(upstream, "batcher", None)
    keys = [k.encode() for k in settings.api_keys]

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        yield
        await upstream.aclose()

    app = FastAPI(title="ragpress proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    schema = openapi_schema()
    app.openapi = lambda: schema  # the routes read raw bodies (size limit first): the schema is stated
    app.state.settings, app.state.handler = settings, handler

    def check_key(request: Request) -> None:
        if not keys:
            return
        given = _given_key(request.headers.get("authorization", ""))
        if not given:
            raise ProxyError(401, "no API key given; send it as 'Authorization: Bearer <key>' (the openai "
                             "client's api_key)", code="missing_api_key")
        ok = False
        for k in keys:  # compare against every key: the time taken does not say which one nearly matched
            ok |= hmac.compare_digest(given.encode(), k)
        if not ok:
            raise ProxyError(401, "the API key is not valid for this proxy", code="invalid_api_key")

    @app.exception_handler(ProxyError)
    async def _proxy_error(request: Request, e: ProxyError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return _error(ProxyError(e.status_code, f"{request.method} {request.url.path}: {e.detail}", code=code))

    @app.exception_handler(Exception)
    async def _any_error(request: Request, e: Exception) -> JSONResponse:
        return _error(_as_proxy_error(e))

    secured = [Depends(check_key)]

    @app.post("/v1/chat/completions", dependencies=secured)
    async def chat_completions(request: Request) -> Response:
        req = _validate(ChatCompletionRequest, await _read_json(request, settings.max_body_bytes))
        return _respond(await _call(handler.chat, req))

    @app.post("/v1/completions", dependencies=secured)
    async def completions(request: Request) -> Response:
        req = _validate(CompletionRequest, await _read_json(request, settings.max_body_bytes))
        return _respond(await _call(handler.completion, req))

    @app.get("/v1/models", dependencies=secured)
    async def models() -> Response:
        return JSONResponse(await _call(handler.models))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "upstream": upstream.name, "method": settings.method,
                "methods": handler.served_methods()}

    @app.get("/metrics", dependencies=secured)
    async def metrics_() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    if settings.inspector:
        page_secured = add_inspector(app, handler, settings, check_key)

        @app.post("/inspect/compress", dependencies=page_secured, include_in_schema=False)
        async def inspect_compress(request: Request) -> Response:
            req = _validate(InspectRequest, await _read_json(request, settings.max_body_bytes))
            return JSONResponse(await _call(handler.inspect, req))

    app.add_middleware(_Metered, metrics=metrics)
    return app


def _given_key(authorization: str) -> str | None:
    """The key of an ``Authorization`` header: ``Bearer <key>``, or ``Basic`` with the key as the password (what
    a browser sends for the inspector page after its login prompt); None when there is none."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[2] or None
        except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
            return None
    return None


async def _call(fn: Any, *args: Any) -> Any:
    """Run a handler step, turning domain errors into OpenAI-shaped ones at this edge."""
    try:
        return await fn(*args)
    except ProxyError:
        raise
    except RagpressError as e:
        raise _as_proxy_error(e) from None


def serve(settings: ProxySettings) -> None:
    """Build the app (loading the decoder) and run it under uvicorn until interrupted."""
    import uvicorn

    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", start_timeout_s: float = 20.0) -> Iterator[str]:
    """Run ``app`` under uvicorn in a daemon thread on a free port (tests, notebooks); yield its base URL."""
    import socket
    import threading

    import uvicorn

    sock = socket.socket()
    # Without TCP_NODELAY each response waits on Nagle + delayed ACK (~40 ms); uvicorn sets it on sockets it
    # binds itself (`ragpress serve`), not on one handed to it.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the proxy did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
