"""Proxy overhead per request, compression off: the openai client through ``ragpress serve`` (uvicorn on
loopback, in-process decoder) against calling the same loaded :class:`HFBackend` directly.

Both paths share one loaded model and the same chat, greedy, ``max_tokens`` 8. Calls alternate (direct,
proxy, direct, ...) so both see the same machine load; the overhead is the per-pair difference. A second
pass repeats this with :class:`FakeBackend` (the real tokenizer, no model): the decoder's own variance drops
out and what is left is the proxy's path alone (HTTP, JSON, chat template, worker thread).

    .venv/bin/python examples/proxy_overhead.py [--n 30] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import openai

from adapters import DecoderBackend, FakeBackend, GenerationParams, HFBackend
from compressor import Prompt
from serving.app import ProxySettings, create_app, serve_in_thread

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "In one sentence, what is a tragedy in theatre?"}]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def measure(backend: DecoderBackend, n: int, max_tokens: int, warmup: int) -> dict:
    tok = backend.tokenizer
    params = GenerationParams(max_new_tokens=max_tokens, temperature=0.0)

    def direct() -> tuple[float, str]:
        t0 = time.perf_counter()
        text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        g = backend.generate([Prompt(segments=[list(tok(text, add_special_tokens=False)["input_ids"])])], params)[0]
        return time.perf_counter() - t0, g.text

    with serve_in_thread(create_app(ProxySettings(served_model_name=MODEL), backend=backend)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

        def proxied() -> tuple[float, str]:
            t0 = time.perf_counter()
            r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=max_tokens,
                                               temperature=0, extra_body={"compression": {"enabled": False}})
            return time.perf_counter() - t0, r.choices[0].message.content

        for _ in range(warmup):
            direct(), proxied()
        d, p = [], []
        for _ in range(n):
            (td, a), (tp, b) = direct(), proxied()
            assert a == b, (a, b)  # same prompt, same greedy answer: the paths differ only in transport
            d.append(td)
            p.append(tp)
    diff = [y - x for x, y in zip(d, p)]
    return {"backend": type(backend).__name__, "n": n, "answer": a, **{
        name: {"p50": round(pct(xs, 0.5) * 1000, 2), "p95": round(pct(xs, 0.95) * 1000, 2),
               "mean": round(statistics.mean(xs) * 1000, 2)}
        for name, xs in (("direct_ms", d), ("proxy_ms", p), ("overhead_ms", diff))}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()

    hf = HFBackend.load(MODEL)
    for backend in (hf, FakeBackend(hf.tokenizer, model_name=MODEL)):
        print(json.dumps(measure(backend, args.n, args.max_tokens, args.warmup)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
