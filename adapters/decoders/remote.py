"""Remote vLLM backend: a separately started OpenAI-compatible vLLM server, over ``/v1/completions``.

Start the server with the prompt-embeddings input switched on (on a CPU build the ``vllm`` console command
looks for a package named ``vllm``, so use the module)::

    python -m vllm.entrypoints.openai.api_server --model <HF folder> --enable-prompt-embeds \\
        --dtype bfloat16 --enforce-eager --host 127.0.0.1 --port 8000

* Text prompts are sent as token ids (``"prompt": [ids]``), the ids the local HF tokenizer made, with
  ``add_special_tokens: false``: the server decodes exactly what the HF backend decodes.
* Soft prompts are sent as ``"prompt_embeds"``: base64 of ``torch.save`` of one dense ``[seq, hidden]`` tensor
  built locally (:func:`~adapters.decoders.vllm.prompt_embeds`), checked by
  :func:`~adapters.decoders.vllm.check_embeds` first (dense, contiguous, owning exactly its own storage).
* One streamed request per prompt, sent concurrently over one pooled ``httpx.Client`` (connection reuse,
  timeouts); ``ttft_s`` is the time to the first streamed chunk that carries tokens.

Errors (all :class:`~compressor.errors.BackendError`, each saying how to fix it): server down or timing out,
serving another model (checked against ``/v1/models``), started without ``--enable-prompt-embeds``,
rejecting a request (the server's OpenAI-shaped error message is passed on).
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from compressor.errors import BackendError, InputError
from compressor.models import load_tokenizer, resolve_model
from compressor.prompt import Prompt

from .base import DecoderBackend, Generation, GenerationParams
from .vllm import (
    EmbeddingTable,
    check_embeds,
    eos_token_ids,
    prompt_embeds,
    stops_for,
    strip_eos,
    vllm_cache_env,
)

__all__ = ["RemoteVLLMBackend", "encode_embeds", "decode_embeds", "completion_payload", "server_command",
           "server_env", "SERVER_HINT"]

SERVER_HINT = "python -m vllm.entrypoints.openai.api_server --model {model} --enable-prompt-embeds"


def server_command(
    model: str | os.PathLike, port: int, host: str = "127.0.0.1", dtype: str = "bfloat16",
    prompt_embeds: bool = True, python: str | None = None, extra: Sequence[str] = (),
) -> list[str]:
    """argv that starts vLLM's OpenAI server on a named model or HF folder, with the flags the in-process
    backend uses (eager mode, same dtype), so baseline and compressed runs are served alike. Run it with the
    environment of :func:`~adapters.decoders.vllm.configure_vllm_env` to keep caches in the project's."""
    argv = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(resolve_model(model)), "--host", host, "--port", str(port), "--dtype", dtype, "--enforce-eager"]
    if prompt_embeds:
        argv.append("--enable-prompt-embeds")
    return argv + list(extra)


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a server subprocess: ``base`` (default ``os.environ``) with the project's vLLM cache
    dirs, and without ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the async server needs its engine process)."""
    env = {**(os.environ if base is None else base), **vllm_cache_env()}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return env


def encode_embeds(t: Any, hidden_size: int, dtype: Any) -> str:
    """base64 of ``torch.save`` of the checked tensor: the ``prompt_embeds`` wire form vLLM expects."""
    import torch

    buf = io.BytesIO()
    torch.save(check_embeds(t, hidden_size, dtype), buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_embeds(data: str) -> Any:
    """Inverse of :func:`encode_embeds`, for tests and debugging of our own payloads only: it uses
    ``torch.load(weights_only=True)``; never call it on bytes a client sent (ragpress never does)."""
    import torch

    return torch.load(io.BytesIO(base64.b64decode(data, validate=True)), weights_only=True)


def completion_payload(
    model: str, prompt: Prompt, params: GenerationParams, table: EmbeddingTable | None, stream: bool = True
) -> dict[str, Any]:
    """The JSON body of one ``/v1/completions`` request for ``prompt``."""
    if len(prompt) == 0:
        raise InputError("a prompt is empty")
    body: dict[str, Any] = {"model": model}
    if prompt.has_soft:
        if table is None:
            raise InputError("a soft prompt needs the decoder's embedding table; build the backend with one")
        body["prompt_embeds"] = encode_embeds(prompt_embeds(table, prompt), table.hidden_size, table.dtype)
    else:
        body["prompt"] = prompt.token_ids
    greedy = params.temperature <= 0
    body.update(
        max_tokens=params.max_new_tokens,
        temperature=0.0 if greedy else params.temperature,
        top_p=1.0 if greedy else params.top_p,
        stop=stops_for(prompt, params),
        add_special_tokens=False,
        skip_special_tokens=True,
        include_stop_str_in_output=False,
        return_token_ids=True,
        stream=stream,
    )
    if not greedy and params.seed is not None:
        body["seed"] = params.seed
    return body


class RemoteVLLMBackend(DecoderBackend):
    """A vLLM server reached over HTTP. ``model`` is the local name or folder of the model the server serves
    (for the tokenizer and the embedding table); ``served_model`` is its id on the server (default: the
    resolved folder path, which is what ``--model <folder>`` serves it as).

    ``transport`` swaps the HTTP transport (an ``httpx.MockTransport`` in tests), as in httpx itself."""

    def __init__(
        self,
        base_url: str,
        model: str = "smollm2-135m-instruct",
        served_model: str | None = None,
        *,
        tokenizer: Any | None = None,
        table: EmbeddingTable | None = None,
        eos_ids: set[int] | None = None,
        dtype: str = "bfloat16",
        api_key: str | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        max_concurrency: int = 16,
        transport: httpx.BaseTransport | None = None,
        check: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise InputError(f"max_concurrency must be >= 1, got {max_concurrency}")
        folder = None if (tokenizer is not None and table is not None) else resolve_model(model)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        self.table = table if table is not None else EmbeddingTable.from_pretrained(folder, dtype)
        self.eos_ids = eos_ids if eos_ids is not None else (eos_token_ids(folder, self.tokenizer) if folder else set())
        self.served_model = served_model or str(folder if folder is not None else model)
        self.model_name = self.served_model
        self.base_url = base_url.rstrip("/")
        self.max_concurrency = max_concurrency
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=self.base_url, headers=headers, transport=transport,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        if check:
            self.check()

    @property
    def hidden_size(self) -> int:
        return self.table.hidden_size

    # -- HTTP ------------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.TimeoutException as e:
            raise BackendError(f"vLLM server at {self.base_url} timed out on {path} ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise BackendError(self._down_message(e)) from e
        if r.status_code >= 400:
            raise self._http_error(r.status_code, r.read().decode("utf-8", "replace"), path)
        return r

    def _down_message(self, e: Exception) -> str:
        return (f"cannot reach the vLLM server at {self.base_url} ({type(e).__name__}: {e}); start it with "
                f"`{SERVER_HINT.format(model=self.served_model)}` or fix base_url")

    def _http_error(self, status: int, body: str, path: str) -> BackendError:
        try:
            err = json.loads(body).get("error", {})
            msg = err.get("message", body) if isinstance(err, dict) else str(err)
        except (ValueError, AttributeError):
            msg = body
        msg = msg.strip()[:500]
        if "enable-prompt-embeds" in msg or "enable_prompt_embeds" in msg:
            return BackendError(f"the vLLM server at {self.base_url} does not accept prompt_embeds: restart it "
                                f"with --enable-prompt-embeds (`{SERVER_HINT.format(model=self.served_model)}`)")
        if status == 404 and "model" in msg.lower() and "does not exist" in msg.lower():
            return BackendError(f"the vLLM server at {self.base_url} does not serve {self.served_model!r}: {msg}")
        if status == 404:
            return BackendError(f"{self.base_url}{path} not found (HTTP 404): is this an OpenAI-compatible vLLM "
                                f"server? {msg}")
        return BackendError(f"vLLM server at {self.base_url} answered HTTP {status} on {path}: {msg}")

    def served_models(self) -> list[dict[str, Any]]:
        """The ``data`` list of ``GET /v1/models``."""
        try:
            data = self._request("GET", "/v1/models").json()["data"]
        except (ValueError, KeyError, TypeError) as e:
            raise BackendError(f"{self.base_url}/v1/models did not return an OpenAI model list ({e})") from e
        return list(data)

    def check(self) -> None:
        """Fail now, with a fix-it message, when the server is down or serves another model. (Whether it was
        started with --enable-prompt-embeds shows only on the first soft request, and is mapped then.)"""
        models = self.served_models()
        ids = [m.get("id") for m in models]
        roots = [m.get("root") for m in models]
        if self.served_model not in ids and self.served_model not in roots:
            raise BackendError(
                f"the vLLM server at {self.base_url} serves {ids}, not {self.served_model!r}; start it with "
                f"`{SERVER_HINT.format(model=self.served_model)}` or pass served_model= one of those ids")

    # -- generation ------------------------------------------------------------------------------------
    def _stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        try:
            with self.client.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code >= 400:
                    raise self._http_error(r.status_code, r.read().decode("utf-8", "replace"), "/v1/completions")
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:  # an error raised after the stream started
                        raise self._http_error(500, data, "/v1/completions")
                    yield chunk
        except httpx.TimeoutException as e:
            raise BackendError(f"vLLM server at {self.base_url} timed out on /v1/completions "
                               f"({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise BackendError(self._down_message(e)) from e

    def _one(self, prompt: Prompt, body: dict[str, Any], t0: float,
             on_delta: Callable[[str], None] | None = None) -> Generation:
        text, ids, reason, ttft = [], [], None, None
        for chunk in self._stream(body):
            for c in chunk.get("choices", []):
                if ttft is None and (c.get("text") or c.get("token_ids")):
                    ttft = time.perf_counter() - t0
                piece = c.get("text") or ""
                if on_delta is not None and piece:  # the server holds back a possible stop string itself
                    on_delta(piece)
                text.append(piece)
                ids.extend(c.get("token_ids") or [])
                reason = c.get("finish_reason") or reason
        e2e = time.perf_counter() - t0
        return Generation(text="".join(text), token_ids=strip_eos(ids, self.eos_ids), prompt_tokens=len(prompt),
                          finish_reason=reason or "length", ttft_s=ttft if ttft is not None else e2e, e2e_s=e2e)

    def generate(self, prompts: Sequence[Prompt], params: GenerationParams | None = None) -> list[Generation]:
        params = params or GenerationParams()
        if not prompts:
            return []
        bodies = [completion_payload(self.served_model, p, params, self.table) for p in prompts]
        t0 = time.perf_counter()
        workers = min(self.max_concurrency, len(prompts))
        if workers == 1:
            return [self._one(p, b, t0) for p, b in zip(prompts, bodies)]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ragpress-vllm") as pool:
            return list(pool.map(lambda pb: self._one(pb[0], pb[1], t0), zip(prompts, bodies)))

    def stream(self, prompt: Prompt, params: GenerationParams | None = None,
               on_delta: Callable[[str], None] | None = None) -> Generation:
        """One prompt, ``on_delta`` called with each streamed piece of text; an exception raised in it closes
        the connection, and vLLM aborts the request."""
        body = completion_payload(self.served_model, prompt, params or GenerationParams(), self.table)
        return self._one(prompt, body, time.perf_counter(), on_delta)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteVLLMBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
