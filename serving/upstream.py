"""Where the (compressed) request goes: the in-process decoder or a remote OpenAI-compatible server.

* :class:`EmbeddedUpstream`: a :class:`~adapters.decoders.DecoderBackend` in this process (default: the
  default model). Applies the chat template, generates in a worker thread (the model is shared: non-streaming
  requests that arrive together with the same sampling parameters are decoded as one batch, streams one at a
  time), streams token by token, and stops a generation whose client left or whose deadline passed.
* :class:`RemoteUpstream`: any OpenAI-compatible server (vLLM, another proxy, OpenAI) over one reused
  ``httpx.AsyncClient``; every field the client sent passes through. Unreachable: 502; timeout: 504;
  the upstream's own 4xx errors are relayed with their status.

Both answer with OpenAI-shaped dicts: one response, or an async iterator of stream chunks. Errors raised
before the first chunk of a stream become HTTP statuses; later ones become an error event.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import anyio
import httpx

from adapters.decoders import DecoderBackend, Generation, GenerationParams, HFBackend
from compressor.errors import InputError
from compressor.prompt import Prompt, PromptBuilder, PromptTemplate

from .batching import DecodeBatcher, DecodeTimeout
from .protocol import ChatCompletionRequest, CompletionRequest, ProxyError, new_id, now

__all__ = ["Upstream", "EmbeddedUpstream", "RemoteUpstream"]

Kind = Literal["chat", "completion"]
Request = ChatCompletionRequest | CompletionRequest


Rows = list[dict[str, Any]] | None  # per prompt (one for chat): soft rows by splice mark; None: text only


class Upstream(ABC):
    """One decoder behind the proxy. ``payload``: the rendered messages (chat) or prompts (completion);
    ``rows``: per prompt, the soft rows its splice marks stand for (only where :attr:`takes_embeddings`)."""

    name: str
    decoder: str | None = None  # the model served (named or folder): soft methods are built for it
    takes_embeddings: bool = False  # soft prompts (memory slots) can be sent to it

    @abstractmethod
    async def complete(self, kind: Kind, req: Request, payload: list[Any], rows: Rows = None) -> dict[str, Any]:
        """The whole response."""

    @abstractmethod
    async def stream(self, kind: Kind, req: Request, payload: list[Any],
                     rows: Rows = None) -> AsyncIterator[dict[str, Any]]:
        """Check the request and start; return the chunks (without the final ``[DONE]``)."""

    @abstractmethod
    async def models(self) -> list[dict[str, Any]]:
        """The ``data`` list of ``GET /v1/models``."""

    async def aclose(self) -> None:
        return None


class _Stop(Exception):
    """Raised inside the decode loop to end a generation early."""


class EmbeddedUpstream(Upstream):
    """The in-process decoder. Fields it cannot honour (logprobs, tools, penalties) are ignored. A
    transformers decoder takes soft rows (generation from input embeddings), so soft methods are served."""

    def __init__(self, backend: DecoderBackend, served_name: str | None = None, *, timeout_s: float = 120.0,
                 default_max_tokens: int = 256, batch_max_size: int = 1, batch_max_wait_ms: float = 0.0) -> None:
        self.backend = backend
        self.served_name = served_name or backend.model_name
        self.name = "embedded"
        self.timeout_s = timeout_s
        self.default_max_tokens = default_max_tokens
        self.created = now()
        self._lock = threading.Lock()
        # non-streaming generations with the same parameters are decoded together; streams run one at a time
        self.batcher = DecodeBatcher(batch_max_size, batch_max_wait_ms, lock=self._lock)
        self.decoder = backend.model_name
        self.takes_embeddings = backend.hidden_size is not None
        cfg = getattr(getattr(backend, "model", None), "config", None)
        self.max_context = getattr(cfg.get_text_config(), "max_position_embeddings", None) if cfg else None

    @classmethod
    def load(cls, model: str, **kwargs: Any) -> EmbeddedUpstream:
        return cls(HFBackend.load(model), served_name=kwargs.pop("served_name", None) or model, **kwargs)

    async def models(self) -> list[dict[str, Any]]:
        return [{"id": self.served_name, "object": "model", "created": self.created, "owned_by": "ragpress"}]

    # -- request -> prompts ----------------------------------------------------------------------------
    def _check_model(self, model: str) -> None:
        if model != self.served_name:
            raise ProxyError(404, f"The model {model!r} does not exist; this proxy serves {self.served_name!r}",
                             param="model", code="model_not_found")

    def _chat_prompt(self, messages: list[dict[str, Any]], rows: dict[str, Any] | None = None) -> Prompt:
        return chat_prompt(self.backend.tokenizer, messages, rows, self.served_name)

    def _text_prompt(self, prompt: str, rows: dict[str, Any] | None = None) -> Prompt:
        if not prompt:
            raise InputError("prompt is empty")
        if not rows:
            return Prompt(segments=[list(self.backend.tokenizer(prompt)["input_ids"])])
        return completion_prompt(self.backend.tokenizer, prompt, rows)

    def _jobs(self, kind: Kind, req: Request, payload: list[Any],
              rows: Rows = None) -> list[tuple[int, Prompt, GenerationParams]]:
        """(prompt index, prompt, params) per choice, in choice order."""
        self._check_model(req.model)
        rows = rows or [None] * (1 if kind == "chat" else len(payload))
        prompts = [self._chat_prompt(payload, rows[0])] if kind == "chat" else \
            [self._text_prompt(p, r) for p, r in zip(payload, rows)]
        max_new = req.max_new_tokens or self.default_max_tokens
        cap = next(m.le for m in GenerationParams.model_fields["max_new_tokens"].metadata if hasattr(m, "le"))
        if max_new > cap:
            raise ProxyError(400, f"max_tokens {max_new} is more than the in-process decoder generates in one "
                             f"request ({cap}); lower it", param="max_tokens", code="invalid_value")
        for p in prompts:
            if self.max_context and len(p) + max_new > self.max_context:
                raise ProxyError(400, f"This model's maximum context length is {self.max_context} tokens; the "
                                 f"prompt has {len(p)} and max_tokens asks for {max_new}. Shorten the prompt, "
                                 "compress harder or lower max_tokens.", param="messages",
                                 code="context_length_exceeded")
        jobs = []
        for pi, p in enumerate(prompts):
            for c in range(req.n):
                try:
                    params = GenerationParams(
                        max_new_tokens=max_new, temperature=1.0 if req.temperature is None else req.temperature,
                        top_p=1.0 if req.top_p is None else req.top_p,
                        seed=None if req.seed is None else req.seed + c, stop=req.stop)
                except ValueError as e:
                    raise InputError(f"sampling parameters are invalid: {e}") from None
                jobs.append((pi, p, params))
        return jobs

    def _run(self, prompt: Prompt, params: GenerationParams, deadline: float,
             on_delta: Callable[[str], None] | None, cancelled: threading.Event) -> Generation:
        def check(delta: str) -> None:
            if cancelled.is_set() or time.monotonic() > deadline:
                raise _Stop()
            if on_delta is not None and delta:
                on_delta(delta)

        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise _Stop()
        try:
            return self.backend.stream(prompt, params, on_delta=check)
        finally:
            self._lock.release()

    def _timeout(self) -> ProxyError:
        return ProxyError(504, f"generation did not finish within {self.timeout_s:g} s", "timeout_error",
                          code="timeout")

    # -- responses -------------------------------------------------------------------------------------
    async def complete(self, kind: Kind, req: Request, payload: list[Any], rows: Rows = None) -> dict[str, Any]:
        jobs = self._jobs(kind, req, payload, rows)
        deadline = time.monotonic() + self.timeout_s
        gens = await asyncio.gather(*(self.batcher.decode(self.backend, p, params, deadline) for _, p, params in jobs),
                                    return_exceptions=True)
        failed = next((g for g in gens if isinstance(g, BaseException)), None)
        if isinstance(failed, DecodeTimeout):
            raise self._timeout()
        if failed is not None:
            raise failed
        rid, created = new_id(kind), now()
        if kind == "chat":
            choices = [{"index": i, "message": {"role": "assistant", "content": g.text}, "logprobs": None,
                        "finish_reason": g.finish_reason} for i, g in enumerate(gens)]
        else:
            choices = [{"index": i, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason}
                       for i, g in enumerate(gens)]
        prompt_tokens = sum(len(p) for p in {id(p): p for _, p, _ in jobs}.values())
        return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion", "created": created,
                "model": self.served_name, "system_fingerprint": None, "choices": choices,
                "usage": _usage(prompt_tokens, sum(len(g.token_ids) for g in gens))}

    async def stream(self, kind: Kind, req: Request, payload: list[Any],
                     rows: Rows = None) -> AsyncIterator[dict[str, Any]]:
        jobs = self._jobs(kind, req, payload, rows)
        return self._chunks(kind, req, jobs)

    async def _chunks(self, kind: Kind, req: Request,
                      jobs: list[tuple[int, Prompt, GenerationParams]]) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        cancelled = threading.Event()
        deadline = time.monotonic() + self.timeout_s

        def put(item: tuple[str, int, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone (server shutting down)
                cancelled.set()

        def worker() -> None:
            try:
                for ci, (_, p, params) in enumerate(jobs):
                    g = self._run(p, params, deadline, lambda d, ci=ci: put(("delta", ci, d)), cancelled)
                    put(("done", ci, g))
            except BaseException as e:  # noqa: B036 - handed to the event loop, re-raised there
                put(("error", -1, e))
            finally:
                put(("end", -1, None))

        rid, created, obj = new_id(kind), now(), "chat.completion.chunk" if kind == "chat" else "text_completion"
        usage = req.include_usage

        def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
            c = {"id": rid, "object": obj, "created": created, "model": self.served_name,
                 "system_fingerprint": None, "choices": choices}
            if usage:
                c["usage"] = None
            return c

        def choice(ci: int, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
            if kind == "chat":
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {"content": text} if text is not None else {})
                return {"index": ci, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": ci, "text": text or "", "logprobs": None, "finish_reason": finish}

        loop.run_in_executor(None, worker)  # never raises: worker hands its errors to the queue
        try:
            if kind == "chat":
                yield chunk([choice(ci, None, None, role=True) for ci in range(len(jobs))])
            completion_tokens = 0
            while True:
                what, ci, x = await queue.get()
                if what == "delta":
                    yield chunk([choice(ci, x, None)])
                elif what == "done":
                    completion_tokens += len(x.token_ids)
                    yield chunk([choice(ci, None, x.finish_reason)])
                elif what == "error":
                    raise self._timeout() if isinstance(x, _Stop) else x
                else:
                    break
            if usage:
                prompt_tokens = sum(len(p) for p in {id(p): p for _, p, _ in jobs}.values())
                yield {**chunk([]), "usage": _usage(prompt_tokens, completion_tokens)}
        finally:
            cancelled.set()  # the client left or the stream ended: stop the decode loop at its next token


def chat_prompt(tokenizer: Any, messages: list[dict[str, Any]], rows: dict[str, Any] | None = None,
                served: str = "this model") -> Prompt:
    """A chat request's prompt through the decoder's chat template, text parts joined, splice marks replaced
    by their soft rows (:meth:`~compressor.prompt.PromptBuilder.chat`, as :meth:`adapters.RAGPipeline.chat`)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"{served!r} has no chat template; use /v1/completions")
    plain = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            other = [p.get("type") for p in content if p.get("type") != "text"]
            if other:
                raise InputError(f"messages[{i}] has a {other[0]!r} part; the in-process decoder takes text only")
            content = "".join(p.get("text", "") for p in content)
        plain.append({"role": m["role"], "content": content or ""})
    return PromptBuilder(tokenizer, PromptTemplate(style="chat")).chat(plain, rows)


def completion_prompt(tokenizer: Any, prompt: str, rows: dict[str, Any]) -> Prompt:
    """A completion prompt with splice marks: the text pieces tokenized as a text prompt is (the tokenizer's
    leading special tokens, a BOS, first), the marks replaced by their rows. Both upstreams use it."""
    segments = PromptBuilder(tokenizer, PromptTemplate(style="chat")).splice(prompt, rows, stop=()).segments
    ids = list(tokenizer("")["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    special = [t for t in ids if t != eos]  # what goes before a text (a BOS), never a trailing EOS
    if special:
        segments = [special + segments[0], *segments[1:]] if isinstance(segments[0], list) else [special, *segments]
    return Prompt(segments=segments)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class RemoteUpstream(Upstream):
    """An OpenAI-compatible server at ``base_url`` (its ``/v1`` URL, as an openai client would take).

    Failures map to statuses once, here: unreachable 502 (``upstream_unavailable``); no answer within
    ``timeout_s`` 504 (the whole response for plain requests, the response head and each read of a stream,
    since a long generation may stream for longer); a 5xx, a body or stream event that is not a JSON object,
    a stream that ends without ``[DONE]`` or a refused upstream key 502 (``upstream_error``); the upstream's
    other 4xx errors are relayed with their status.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout_s: float = 120.0,
                 connect_timeout_s: float = 5.0, transport: httpx.AsyncBaseTransport | None = None,
                 prompt_embeds: str | None = None, embeds_dtype: str = "bfloat16", tokenizer: Any | None = None,
                 default_max_tokens: int = 256) -> None:
        """``prompt_embeds``: the model (named or HF folder) a vLLM upstream started with
        ``--enable-prompt-embeds`` serves. Soft methods are then served: a request with slots has its chat
        template applied here (``tokenizer``, default the model's), its text rows looked up in the model's
        embedding table and slots spliced in, and goes to ``/v1/completions`` as ``prompt_embeds``; a chat
        request's answer is turned back into a chat completion (and its stream into chat chunks).
        ``embeds_dtype``: the dtype the upstream runs in (its ``--dtype``); ``default_max_tokens``: what a soft
        chat request without ``max_tokens`` gets (vLLM's completions route would stop at 16)."""
        base = base_url.rstrip("/")
        self.decoder = prompt_embeds
        self.takes_embeddings = prompt_embeds is not None
        self.table: Any = None
        self.tokenizer = tokenizer
        self.default_max_tokens = default_max_tokens
        if prompt_embeds is not None:
            from adapters.decoders.vllm import EmbeddingTable
            from compressor.models import load_tokenizer

            self.table = EmbeddingTable.from_pretrained(prompt_embeds, embeds_dtype)
            self.tokenizer = tokenizer or load_tokenizer(prompt_embeds)
        self.name = _redact(base)  # what error messages show: never a password in the URL
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=base + "/", headers=headers, transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    def _body(self, kind: Kind, req: Request, payload: list[Any], rows: Rows = None) -> dict[str, Any]:
        if rows:
            return self._embeds_body(kind, req, payload, rows)
        if kind == "chat":
            return req.upstream_body(messages=payload)
        return req.upstream_body(prompt=payload[0] if isinstance(req.prompt, str) else payload)

    def _embeds_body(self, kind: Kind, req: Request, payload: list[Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        """A ``/v1/completions`` body carrying the prompt(s) as ``prompt_embeds``: every field the client sent
        passes, the messages or prompt replaced."""
        from adapters.decoders.remote import encode_embeds
        from adapters.decoders.vllm import prompt_embeds

        if kind == "chat":
            prompts = [chat_prompt(self.tokenizer, payload, rows[0])]
        else:
            prompts = [completion_prompt(self.tokenizer, p, r) for p, r in zip(payload, rows)]
        t = self.table
        embeds = [encode_embeds(prompt_embeds(t, p), t.hidden_size, t.dtype) for p in prompts]
        body = req.upstream_body()
        body.pop("messages", None)
        body.pop("prompt", None)
        if "max_completion_tokens" in body:
            body["max_tokens"] = body.pop("max_completion_tokens")
        if kind == "chat" and body.get("max_tokens") is None:  # the chat route's default, not completions' 16
            body["max_tokens"] = self.default_max_tokens
        body["prompt_embeds"] = embeds[0] if len(embeds) == 1 else embeds
        return body

    def _transport_error(self, e: httpx.HTTPError) -> ProxyError:
        if isinstance(e, httpx.TimeoutException):
            return self._timeout(type(e).__name__)
        return ProxyError(502, f"the upstream at {self.name} is unreachable: {type(e).__name__}: {e}",
                          "upstream_error", code="upstream_unavailable")

    def _timeout(self, why: str) -> ProxyError:
        return ProxyError(504, f"the upstream at {self.name} did not answer within {self.timeout_s:g} s ({why})",
                          "timeout_error", code="upstream_timeout")

    def _bad(self, what: str) -> ProxyError:
        return ProxyError(502, f"the upstream at {self.name} {what}", "upstream_error", code="upstream_error")

    async def _raise_for_status(self, r: httpx.Response) -> None:
        if r.status_code < 400:
            return
        text = (await r.aread()).decode(errors="replace")
        err = _error_of(text)
        message = err["message"] if err else text[:300]
        if r.status_code in (401, 403):  # the proxy's own key: nothing the client can fix
            raise self._bad(f"refused the proxy's credentials ({r.status_code}: {message}); check "
                            "RAGPRESS_UPSTREAM_API_KEY")
        if r.status_code < 500 and err:  # the client's problem: relay status and body
            raise ProxyError(r.status_code, f"upstream: {message}", err["type"] or "invalid_request_error",
                             param=err["param"], code=err["code"])
        raise self._bad(f"answered {r.status_code}: {message}")

    async def _send(self, method: str, path: str, body: dict[str, Any] | None, stream: bool) -> httpx.Response:
        try:
            request = self.client.build_request(method, path, json=body)
            r = await self.client.send(request, stream=stream)
        except httpx.HTTPError as e:
            raise self._transport_error(e) from None
        try:
            await self._raise_for_status(r)
        except BaseException:
            await r.aclose()
            raise
        return r

    async def _json(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """One plain request, all of it within ``timeout_s`` (httpx's timeouts bound each read only)."""
        try:
            with anyio.fail_after(self.timeout_s):
                r = await self._send(method, path, body, stream=False)
        except TimeoutError:
            raise self._timeout("deadline") from None
        try:
            data = r.json()
        except ValueError:
            raise self._bad(f"sent a body that is not JSON: {r.text[:80]!r}") from None
        if not isinstance(data, dict):
            raise self._bad(f"sent a JSON {type(data).__name__} where an object belongs")
        return data

    async def complete(self, kind: Kind, req: Request, payload: list[Any], rows: Rows = None) -> dict[str, Any]:
        path = "chat/completions" if kind == "chat" and not rows else "completions"
        body = await anyio.to_thread.run_sync(self._body, kind, req, payload, rows)  # tokenizes, encodes tensors
        out = await self._json("POST", path, body | {"stream": False})
        return _chat_response(out) if kind == "chat" and rows else out

    async def stream(self, kind: Kind, req: Request, payload: list[Any],
                     rows: Rows = None) -> AsyncIterator[dict[str, Any]]:
        path = "chat/completions" if kind == "chat" and not rows else "completions"
        body = await anyio.to_thread.run_sync(self._body, kind, req, payload, rows)
        try:
            with anyio.fail_after(self.timeout_s):
                r = await self._send("POST", path, body, stream=True)
        except TimeoutError:
            raise self._timeout("deadline") from None
        return _chat_chunks(self._events(r)) if kind == "chat" and rows else self._events(r)

    async def _events(self, r: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        done = False
        try:
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    raise self._bad(f"sent a stream event that is not JSON: {data[:80]!r}") from None
                if not isinstance(event, dict):
                    raise self._bad(f"sent a stream event that is a JSON {type(event).__name__}, not an object")
                if "error" in event:
                    err = _error_of(json.dumps(event)) or {"message": str(event["error"]), "type": None, "code": None}
                    raise ProxyError(502, f"upstream: {err['message']}", err["type"] or "upstream_error",
                                     code=err["code"])
                yield event
            if not done:
                raise self._bad("ended the stream without [DONE]; the answer may be cut short")
        except httpx.TimeoutException as e:
            raise self._timeout(type(e).__name__) from None
        except httpx.HTTPError as e:
            raise self._bad(f"dropped the stream midway ({type(e).__name__}: {e})") from None
        finally:
            await r.aclose()

    async def models(self) -> list[dict[str, Any]]:
        data = (await self._json("GET", "models", None)).get("data", [])
        if not isinstance(data, list):
            raise self._bad("sent a model list whose data is not a list")
        return data


def _chat_response(out: dict[str, Any]) -> dict[str, Any]:
    """A text completion (what ``prompt_embeds`` is answered with) as the chat completion the client asked for."""
    choices = [{"index": c.get("index", i), "message": {"role": "assistant", "content": c.get("text", "")},
                "logprobs": None, "finish_reason": c.get("finish_reason")} for i, c in enumerate(out.get("choices", []))]
    return {**out, "id": _chat_id(out), "object": "chat.completion", "choices": choices}


def _chat_id(event: dict[str, Any]) -> str:
    return "chatcmpl-" + str(event.get("id", "")).removeprefix("cmpl-")


async def _chat_chunks(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """Text completion stream chunks as chat completion chunks, the assistant role announced first per choice."""
    started: set[int] = set()
    try:
        async for e in _converted(events, started):
            yield e
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def _converted(events: AsyncIterator[dict[str, Any]], started: set[int]) -> AsyncIterator[dict[str, Any]]:
    async for e in events:
        choices = []
        for i, c in enumerate(e.get("choices") or []):
            ci = c.get("index", i)
            delta: dict[str, Any] = {"content": c.get("text", "")}
            if ci not in started:
                started.add(ci)
                delta = {"role": "assistant", **delta}
            choices.append({"index": ci, "delta": delta, "logprobs": None, "finish_reason": c.get("finish_reason")})
        yield {**e, "id": _chat_id(e), "object": "chat.completion.chunk", "choices": choices}


def _error_of(text: str) -> dict[str, str | None] | None:
    """The OpenAI-shaped error in an upstream body, its fields as strings, or None if it holds none."""
    try:
        err = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(err, dict):
        return {"message": str(err), "type": None, "param": None, "code": None}

    def s(key: str) -> str | None:
        v = err.get(key)
        return None if v is None else str(v)

    return {"message": s("message") or "(no message)", "type": s("type"), "param": s("param"), "code": s("code")}


def _redact(url: str) -> str:
    """``url`` without a password (``http://user:secret@host`` -> ``http://user:***@host``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
