"""A bounded loopback load test of the proxy.

The proxy runs in a child process (so its memory is measured alone, and the clients do not share its GIL),
on 127.0.0.1, in front of one of:

* ``fake``: the in-process upstream with :class:`~adapters.decoders.FakeBackend` (no model: what the proxy
  itself costs, compression included);
* ``stub``: the remote upstream against :class:`~serving.harden.stub.StubUpstream` (the HTTP client path);
* ``embedded``: the real in-process decoder (the default model, a few new tokens per request).

``concurrency`` clients send ``requests`` chat requests in all (every fourth one streamed), each with
documents to compress, after a warm-up; the run stops by itself after that many, or at ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["LoadReport", "run_load", "MODES"]

MODES = ("fake", "stub", "embedded")
_SENTENCES = [
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "It was designed by the engineering company of Gustave Eiffel.",
    "The tower is 330 metres tall and was the tallest structure in the world until 1930.",
    "Millions of people visit it every year.",
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "The play is set in Denmark and follows Prince Hamlet.",
    "Cats sleep for most of the day and purr when they are content.",
    "Some breeds of cat enjoy water, which is unusual.",
    "The Danube flows through ten countries before reaching the Black Sea.",
    "Vienna and Budapest both lie on its banks.",
]
_QUESTIONS = ["When was the Eiffel Tower completed?", "Who wrote Hamlet?", "Which sea does the Danube reach?"]


@dataclass
class LoadReport:
    mode: str
    requests: int  # sent
    served: int  # answered 200 with a well-formed body
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    rss_before_mb: float
    rss_after_mb: float
    concurrency: int
    first_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _body(i: int, model: str) -> dict[str, Any]:
    docs = [" ".join(_SENTENCES[(i + k + j) % len(_SENTENCES)] for j in range(4)) for k in range(3)]
    return {"model": model, "messages": [{"role": "user", "content": _QUESTIONS[i % len(_QUESTIONS)]}],
            "documents": docs, "max_tokens": 4, "temperature": 0, "stream": i % 4 == 3,
            "compression": {"method": "bm25", "ratio": 2}}


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _serve(mode: str, model: str) -> None:
    """The child process: build the app for ``mode``, serve it, print its URL, run until stdin closes."""
    from adapters.decoders import FakeBackend, HFBackend
    from compressor.models import load_tokenizer
    from serving.app import ProxySettings, create_app, serve_in_thread

    from .stub import StubUpstream

    stub = None
    if mode == "embedded":
        app = create_app(ProxySettings(served_model_name="load"), backend=HFBackend.load(model))
    elif mode == "stub":
        stub = StubUpstream(model="load").start()
        app = create_app(ProxySettings(upstream=stub.url, timeout_s=30), backend=FakeBackend(load_tokenizer(model)))
    else:
        app = create_app(ProxySettings(served_model_name="load"), backend=FakeBackend(load_tokenizer(model)))
    with serve_in_thread(app) as base:
        print(f"URL {base}", flush=True)
        sys.stdin.read()  # the parent closes our stdin to stop us (or dies, which closes it too)
    if stub is not None:
        stub.stop()


def _start_child(mode: str, model: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "serving.harden.load", "--serve", mode, "--model", model],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, cwd=root, text=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if line.startswith("URL "):
                return proc, line.split()[1]
    _stop_child(proc)
    err.seek(0)
    tail = err.read().decode(errors="replace")[-1500:]
    raise RuntimeError(f"the proxy for mode {mode!r} did not start within {timeout_s:g} s: {tail}")


def _stop_child(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
        proc.wait(15)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait(5)


async def _drive(base: str, start: int, n: int, concurrency: int, deadline: float,
                 latencies: list[float], errors: list[str]) -> int:
    sent = 0
    nxt = iter(range(start, start + n))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def one(i: int) -> None:
            body = _body(i, "load")
            t0 = time.perf_counter()
            try:
                r = await client.post("/v1/chat/completions", json=body)
                text = r.text
                ok = r.status_code == 200 and (text.rstrip().endswith("data: [DONE]") and '"error"' not in text
                                               if body["stream"] else '"compression"' in text)
                if not ok:
                    errors.append(f"{r.status_code} {text[:200]}")
            except httpx.HTTPError as e:
                errors.append(f"{type(e).__name__}: {e}")
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t0)

        async def worker() -> None:
            nonlocal sent
            for i in nxt:
                if time.monotonic() > deadline:
                    return
                sent += 1
                await one(i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sent


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def run_load(mode: str = "fake", requests: int = 400, concurrency: int = 8, warmup: int = 20,
             max_seconds: float = 120.0, model: str = "smollm2-135m-instruct",
             start_timeout_s: float = 180.0) -> LoadReport:
    """Start the proxy for ``mode`` in a child process, warm it up, send ``requests`` requests from
    ``concurrency`` clients (stopping at ``max_seconds``), and report; the child is always stopped."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    proc, base = _start_child(mode, model, start_timeout_s)
    try:
        warm_lat: list[float] = []
        warm_err: list[str] = []
        asyncio.run(_drive(base, 10_000, warmup, min(concurrency, warmup), time.monotonic() + max_seconds,
                           warm_lat, warm_err))
        rss_before = _rss_mb(proc.pid)
        latencies: list[float] = []
        errors: list[str] = []
        t0 = time.perf_counter()
        sent = asyncio.run(_drive(base, 0, requests, concurrency, time.monotonic() + max_seconds, latencies, errors))
        seconds = time.perf_counter() - t0
        rss_after = _rss_mb(proc.pid)
    finally:
        _stop_child(proc)
    return LoadReport(mode=mode, requests=sent, served=len(latencies), errors=len(errors), seconds=round(seconds, 2),
                      rps=round(len(latencies) / seconds, 1) if seconds else 0.0,
                      p50_ms=round(_pct(latencies, 0.50), 1), p95_ms=round(_pct(latencies, 0.95), 1),
                      p99_ms=round(_pct(latencies, 0.99), 1), rss_before_mb=round(rss_before, 1),
                      rss_after_mb=round(rss_after, 1), concurrency=concurrency,
                      first_error=errors[0] if errors else "")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="the proxy process of run_load (not for direct use)")
    ap.add_argument("--serve", choices=MODES, required=True)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    a = ap.parse_args()
    _serve(a.serve, a.model)
