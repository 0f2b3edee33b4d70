"""The proxy's micro-batching of compression and of the in-process decoder (serving/batching.py), under real concurrency: a server on a
thread, clients on threads. Each client gets its own result (nothing reordered), a failing request fails alone,
a batch that fills does not wait, a lone request waits at most the bound, and a slow client holds nobody."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from adapters.decoders import FakeBackend, GenerationParams, GenerationStopped, HFBackend
from compressor import Budget, get_compressor
from compressor.prompt import Prompt
from serving.app import create_app, serve_in_thread
from serving.batching import CompressionBatcher, DecodeBatcher, DecodeTimeout
from serving.settings import ProxySettings

TOPICS = ["Lisbon", "Porto", "Madrid", "Paris", "Berlin", "Rome", "Vienna", "Prague", "Oslo", "Dublin"]


def docs_for(i: int) -> list[dict]:
    city = TOPICS[i % len(TOPICS)]
    return [{"title": city, "text": f"{city} is a city. {city} has {i + 3} bridges and {i * 7 % 11} museums. "
                                    f"The river in {city} is long. People in {city} like tea number {i}."},
            {"title": "Weather", "text": f"It rained {i} times on Monday. The sun came out on Tuesday. "
                                         "Clouds were grey. Wind was strong in the north."}]


def body(i: int, **compression) -> dict:
    return {"model": "fake", "max_tokens": 2, "messages": [{"role": "user", "content": f"How many bridges does "
            f"{TOPICS[i % len(TOPICS)]} have?"}], "documents": docs_for(i), "compression": {"ratio": 2, **compression}}


def serve(tokenizer, **settings):
    return serve_in_thread(create_app(ProxySettings(served_model_name="fake", method="bm25", **settings),
                                      backend=FakeBackend(tokenizer, model_name="fake")))


def post_all(base: str, bodies: list[dict]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(bodies))

    def one(b: dict) -> httpx.Response:
        with httpx.Client(timeout=60) as c:
            barrier.wait()  # all at once
            return c.post(base + "/v1/chat/completions", json=b)

    with ThreadPoolExecutor(len(bodies)) as ex:
        return list(ex.map(one, bodies))


def metric(base: str, name: str) -> int:
    return int(re.search(rf"^{name} (\d+)$", httpx.get(base + "/metrics").text, re.M).group(1))


def test_concurrent_requests_are_batched_and_each_gets_its_own_result(smol_tokenizer, counter):
    n = 8
    with serve(smol_tokenizer, batch_max_size=n, batch_max_wait_ms=300) as base:
        rs = post_all(base, [body(i) for i in range(n)])
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
        comp = get_compressor("bm25", counter=counter)
        for i, r in enumerate(rs):  # each client's block is its own documents' compression
            want = comp.compress(body(i)["messages"][0]["content"], docs_for(i), Budget(ratio=2))
            got = r.json()["compression"]
            assert (got["tokens_before"], got["tokens_after"]) == (want.tokens_in, want.tokens_out), i
        assert metric(base, "ragpress_compress_batched_requests_total") == n
        assert metric(base, "ragpress_compress_batches_total") <= 3  # gathered, not one call per request


def test_a_failing_request_fails_alone(smol_tokenizer):
    with serve(smol_tokenizer, batch_max_size=4, batch_max_wait_ms=300) as base:
        bodies = [body(0), body(1, ratio=1000, strict=True), body(2), body(3)]  # 1000x is unreachable
        rs = post_all(base, bodies)
        assert [r.status_code for r in rs] == [200, 400, 200, 200]
        assert rs[1].json()["error"]["code"] == "budget_unreachable"
        assert all(r.json()["compression"]["documents"] == 2 for r in (rs[0], rs[2], rs[3]))


def test_a_full_batch_does_not_wait_and_a_lone_request_waits_at_most_the_bound(smol_tokenizer):
    with serve(smol_tokenizer, batch_max_size=2, batch_max_wait_ms=1000) as base:
        httpx.post(base + "/v1/chat/completions", json=body(9), timeout=60)  # warm-up: loads the compressor
        t0 = time.perf_counter()
        rs = post_all(base, [body(0), body(1)])
        assert all(r.status_code == 200 for r in rs) and time.perf_counter() - t0 < 0.9  # full: no 1 s wait
    with serve(smol_tokenizer, batch_max_size=8, batch_max_wait_ms=250) as base:
        httpx.post(base + "/v1/chat/completions", json=body(9), timeout=60)
        t0 = time.perf_counter()
        r = httpx.post(base + "/v1/chat/completions", json=body(0), timeout=60)
        took = time.perf_counter() - t0
        assert r.status_code == 200 and 0.25 <= took < 2.0  # waited for company, then went alone
        assert r.json()["compression"]["compression_ms"] >= 250


def test_a_slow_client_holds_nobody(smol_tokenizer):
    with serve(smol_tokenizer, batch_max_size=8, batch_max_wait_ms=20) as base:
        host, port = base.removeprefix("http://").split(":")
        raw = b'{"model":"fake","messages":[{"role":"user","content":"q?"}],"documents":["A b. C d."]}'
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw[:10])  # then stalls
        try:
            t0 = time.perf_counter()
            r = httpx.post(base + "/v1/chat/completions", json=body(1), timeout=30)
            assert r.status_code == 200 and time.perf_counter() - t0 < 3.0
        finally:
            s.close()


def test_batching_off_and_bad_settings(smol_tokenizer):
    with serve(smol_tokenizer, batch_max_size=1) as base:
        rs = post_all(base, [body(i) for i in range(3)])
        assert all(r.status_code == 200 for r in rs)
        assert metric(base, "ragpress_compress_batches_total") == 3
    with pytest.raises(ValueError, match="max_batch 0"):
        CompressionBatcher(max_batch=0)
    with pytest.raises(ValueError):
        ProxySettings(batch_max_size=0)


# -- decoding together (the in-process decoder) --------------------------------------------------------------
def test_the_decode_batcher_keeps_order_isolates_a_failing_prompt_and_times_out(smol_tokenizer):
    class Picky(FakeBackend):
        def generate(self, prompts, params=None):
            if any(len(p) == 3 for p in prompts):
                raise RuntimeError("this prompt breaks the decoder")
            return super().generate(prompts, params)

    backend, params = Picky(smol_tokenizer, model_name="fake"), GenerationParams(max_new_tokens=8)
    batcher = DecodeBatcher(max_batch=4, max_wait_ms=200)

    async def run(deadline_s: float) -> list:
        return await asyncio.gather(*(batcher.decode(backend, Prompt(segments=[[7] * n]), params,
                                                     time.monotonic() + deadline_s) for n in (2, 3, 4, 5)),
                                    return_exceptions=True)

    out = asyncio.run(run(30))
    assert [o.text for o in (out[0], out[2], out[3])] == ["2 prompt rows", "4 prompt rows", "5 prompt rows"]
    assert isinstance(out[1], RuntimeError)  # alone: the batch failed, then each prompt ran on its own
    assert (batcher.batches, batcher.batched) == (3, 3)
    assert all(isinstance(o, DecodeTimeout) for o in asyncio.run(run(-1)))  # past its deadline: no decoder


@pytest.mark.real_model
def test_the_embedded_decoder_decodes_concurrent_requests_together_with_the_same_answers():
    backend = HFBackend.load("smollm2-135m-instruct", dtype="float32")  # batch == alone to float32 rounding
    questions = ["What is the capital of France?", "Name a colour of the sky.", "What is 2 + 2?",
                 "Who wrote Hamlet?", "What do bees make?", "Which planet is red?"]

    def chat(q: str, **kw) -> dict:
        return {"model": "smol", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": q}],
                "compression": {"enabled": False}, **kw}

    def text(r: httpx.Response) -> str:
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    settings = {"served_model_name": "smol", "method": "bm25"}
    with serve_in_thread(create_app(ProxySettings(batch_max_size=1, **settings), backend=backend)) as base:
        alone = [text(httpx.post(base + "/v1/chat/completions", json=chat(q), timeout=120)) for q in questions]
        seeded = text(httpx.post(base + "/v1/chat/completions", json=chat(questions[0], temperature=1, seed=3),
                                 timeout=120))
    with serve_in_thread(create_app(ProxySettings(batch_max_size=8, batch_max_wait_ms=500, **settings),
                                    backend=backend)) as base:
        rs = post_all(base, [chat(q) for q in questions] + [chat(questions[0], temperature=1, seed=3)])
        assert [text(r) for r in rs[:-1]] == alone  # each client its own answer, as if it had been alone
        assert text(rs[-1]) == seeded  # a seeded sample runs alone: its seed gives the same text
        assert metric(base, "ragpress_decode_batched_requests_total") == len(questions) + 1
        assert metric(base, "ragpress_decode_batches_total") <= len(questions)  # some were decoded together


def test_a_decode_past_its_deadline_stops_at_the_next_token(smol_tokenizer):
    class Endless(FakeBackend):  # a decode loop that runs until its caller's stop check says so
        def generate(self, prompts, params=None, stop=None):
            while not stop():
                time.sleep(0.005)
            raise GenerationStopped()

    batcher = DecodeBatcher(max_batch=2, max_wait_ms=1)
    t0 = time.monotonic()
    with pytest.raises(DecodeTimeout):
        asyncio.run(batcher.decode(Endless(smol_tokenizer), Prompt(segments=[[7, 7]]), GenerationParams(),
                                   time.monotonic() + 0.3))
    assert time.monotonic() - t0 < 2.0  # stopped at the deadline, the decoder's lock free again
    assert batcher.lock.acquire(timeout=0)


def test_the_transformers_backend_stops_when_asked(tiny_backend):
    calls = []
    with pytest.raises(GenerationStopped):
        tiny_backend.generate([Prompt(segments=[[5, 6, 7]])], GenerationParams(max_new_tokens=50),
                              stop=lambda: calls.append(1) or True)
    assert len(calls) == 1  # checked after the first new token
