"""The fault matrix: the proxy (remote-upstream mode) in front of :class:`~serving.harden.stub.StubUpstream`,
one scenario per upstream fault.

Each scenario sets the fault, sends one request (with documents, so compression runs too) and checks: the
status and error code the proxy promises, an OpenAI-shaped error body (for streams: an error event, then
``[DONE]``), an answer within ``timeout_s + 2`` s (no hang); then heals the upstream and checks that the very
next request succeeds (recovery, on the same pooled client).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from ..app import ProxySettings, create_app, serve_in_thread
from .stub import StubUpstream

__all__ = ["Scenario", "FaultResult", "FaultEnv", "SCENARIOS", "fault_env", "run_scenario", "run_fault_matrix"]

ERROR_KEYS = {"message", "type", "param", "code"}
DOCS = ["Hamlet is a tragedy by William Shakespeare. It is set in Denmark. The prince is called Hamlet.",
        {"title": "Cats", "text": "Cats sleep a lot. They purr when content. Some cats like water."}]


@dataclass(frozen=True)
class Scenario:
    name: str
    mode: str  # a stub mode, or "down" (the stub is stopped)
    stream: bool
    status: int  # the HTTP status the client must get (200 for a stream that fails after its start)
    code: str  # the error code, in the body or in the stream's error event


SCENARIOS = [
    Scenario("upstream down", "down", False, 502, "upstream_unavailable"),
    Scenario("upstream down, streamed", "down", True, 502, "upstream_unavailable"),
    Scenario("slow: no answer in time", "slow", False, 504, "upstream_timeout"),
    Scenario("slow: stream never starts", "slow", True, 504, "upstream_timeout"),
    Scenario("slow: body trickles past the deadline", "drip", False, 504, "upstream_timeout"),
    Scenario("500 with an OpenAI error", "error_500", False, 502, "upstream_error"),
    Scenario("500 before a stream", "error_500", True, 502, "upstream_error"),
    Scenario("503 with an HTML page", "html_503", False, 502, "upstream_error"),
    Scenario("upstream refuses the proxy's key", "bad_key", False, 502, "upstream_error"),
    Scenario("upstream 400 is relayed", "bad_request", False, 400, "invalid_value"),
    Scenario("body is not JSON", "malformed", False, 502, "upstream_error"),
    Scenario("body is a JSON list", "not_object", False, 502, "upstream_error"),
    Scenario("stream closed before [DONE]", "stream_closed", True, 200, "upstream_error"),
    Scenario("stream dropped mid-chunk", "stream_cut", True, 200, "upstream_error"),
    Scenario("stream event is not JSON", "stream_garbage", True, 200, "upstream_error"),
]


@dataclass
class FaultResult:
    name: str
    expected: str
    got: str
    seconds: float
    answered_right: bool
    recovered: bool
    detail: str = ""

    @property
    def survived(self) -> bool:
        return self.answered_right and self.recovered


@dataclass
class FaultEnv:
    stub: StubUpstream
    base: str
    client: httpx.Client
    timeout_s: float


@contextlib.contextmanager
def fault_env(tokenizer: Any, timeout_s: float = 1.0) -> Iterator[FaultEnv]:
    """The stub and the proxy in front of it, both on 127.0.0.1, and one client for both phases."""
    from adapters.decoders import FakeBackend

    with StubUpstream(delay_s=timeout_s * 3) as stub:
        settings = ProxySettings(upstream=stub.url, timeout_s=timeout_s, method="bm25", ratio=2.0)
        app = create_app(settings, backend=FakeBackend(tokenizer))  # the backend only lends its tokenizer
        with serve_in_thread(app) as base, httpx.Client(timeout=timeout_s + 10) as client:
            yield FaultEnv(stub, base, client, timeout_s)


def _request(env: FaultEnv, stream: bool) -> tuple[int, dict[str, Any] | None, list[str]]:
    """(status, JSON body or None, stream events' data) of one chat request with documents."""
    body = {"model": env.stub.model, "messages": [{"role": "user", "content": "Who wrote Hamlet?"}],
            "documents": DOCS, "max_tokens": 8, "stream": stream}
    with env.client.stream("POST", f"{env.base}/v1/chat/completions", json=body) as r:
        raw = r.read().decode()
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            events = [e[len("data: "):] for e in raw.split("\n\n") if e.startswith("data: ")]
            return r.status_code, None, events
        try:
            return r.status_code, json.loads(raw), []
        except ValueError:
            return r.status_code, None, [raw]


def _error_of(body: dict[str, Any] | None) -> dict[str, Any] | None:
    if isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], dict) \
            and set(body["error"]) == ERROR_KEYS and isinstance(body["error"]["message"], str):
        return body["error"]
    return None


def _judge(sc: Scenario, status: int, body: dict[str, Any] | None, events: list[str]) -> tuple[bool, str]:
    if status != sc.status:
        return False, f"{status} {json.dumps(body)[:200] if body else events[:2]}"
    if status != 200:
        err = _error_of(body)
        if err is None:
            return False, f"{status} with a body that is not an OpenAI error: {json.dumps(body)[:200]}"
        return err["code"] == sc.code, f"{status} {err['code']}: {err['message'][:120]}"
    if not events or events[-1] != "[DONE]":
        return False, f"stream did not end with [DONE]: {events[-2:]}"
    errs = [_error_of(json.loads(e)) for e in events[:-1] if e.startswith("{") and '"error"' in e]
    errs = [e for e in errs if e is not None]
    if not errs:
        return False, "stream ended without an error event: the client would take a cut answer as whole"
    return errs[-1]["code"] == sc.code, f"200 + error event {errs[-1]['code']}: {errs[-1]['message'][:120]}"


def _healthy(status: int, body: dict[str, Any] | None, events: list[str], stream: bool) -> bool:
    if status != 200:
        return False
    if stream:
        return bool(events) and events[-1] == "[DONE]" and not any('"error"' in e for e in events)
    return isinstance(body, dict) and "choices" in body and "compression" in body


def run_scenario(env: FaultEnv, sc: Scenario) -> FaultResult:
    """Break the upstream as ``sc`` says, check the proxy's answer, heal it, check the next request."""
    expected = f"{sc.status} {sc.code}" if sc.status != 200 else f"200 + error event {sc.code}"
    if sc.mode == "down":
        env.stub.stop()
    else:
        env.stub.mode = sc.mode
    t0 = time.perf_counter()
    try:
        status, body, events = _request(env, sc.stream)
        right, got = _judge(sc, status, body, events)
    except httpx.HTTPError as e:  # the proxy hung (client timeout) or dropped the connection
        right, got = False, f"client error {type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    if seconds > env.timeout_s + 2.0:
        right, got = False, f"{got} (took {seconds:.1f} s: the proxy must answer within timeout + 2 s)"
    if sc.mode == "down":
        env.stub.start()
    env.stub.mode = "ok"
    try:
        recovered = _healthy(*_request(env, sc.stream), sc.stream)
    except httpx.HTTPError:
        recovered = False
    return FaultResult(sc.name, expected, got, round(seconds, 3), right, recovered)


def run_fault_matrix(tokenizer: Any, timeout_s: float = 1.0,
                     scenarios: list[Scenario] | None = None) -> list[FaultResult]:
    """Every scenario, in order, against one proxy (so recovery is tested on a client that saw the fault)."""
    with fault_env(tokenizer, timeout_s) as env:
        return [run_scenario(env, sc) for sc in scenarios or SCENARIOS]
