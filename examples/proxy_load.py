"""The proxy under concurrent load, compression and decoding inside the timing: 1, 8 and 32 openai-client callers
against ``ragpress serve`` with its in-process decoder, with micro-batching on and off.

Each caller sends HotpotQA questions with their ten passages as ``documents`` (sentinel at ratio 5 by default,
greedy, ``max_tokens`` 32) one after another, as fast as answers come back; the questions are dealt out so every
setting answers the same ones. Reported per (callers, batching): requests/s, p50 / p95 latency seen by the
client, and how many requests each compression and decode batch carried (from ``/metrics``).

    .venv/bin/python examples/proxy_load.py [--callers 1 8 32] [--requests 48] [--method sentinel]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
from pathlib import Path

import httpx
import openai

from adapters import HFBackend
from adapters.datasets import load_dataset
from serving.app import ProxySettings, create_app, serve_in_thread

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "hotpotqa_train" / "hotpotqa_train_a.jsonl"
MODEL = "smollm2-135m-instruct"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def metric(base: str, name: str) -> int:
    found = re.search(rf"^{name} (\d+)$", httpx.get(base + "/metrics").text, re.M)
    return int(found.group(1)) if found else 0


def load(base: str, examples: list, callers: int, ratio: float, max_tokens: int) -> dict:
    """Every example once, ``callers`` at a time; latency per request as the client sees it."""
    todo, lock, lat, errors = list(reversed(examples)), threading.Lock(), [], []

    def caller() -> None:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)
        while True:
            with lock:
                if not todo:
                    return
                ex = todo.pop()
            t0 = time.perf_counter()
            try:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": ex.question}], max_tokens=max_tokens,
                    temperature=0, extra_body={"documents": [{"title": p.title, "text": p.text} for p in ex.passages],
                                               "compression": {"ratio": ratio}})
                with lock:
                    lat.append(time.perf_counter() - t0)
            except openai.OpenAIError as e:
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"requests": len(lat), "errors": len(errors), "wall_s": wall, "requests_per_s": len(lat) / wall,
            "p50_s": pct(lat, 0.5), "p95_s": pct(lat, 0.95), "mean_s": statistics.fmean(lat)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--callers", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=48, help="requests per setting (the same questions)")
    ap.add_argument("--method", default="sentinel")
    ap.add_argument("--ratio", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="--batch-max-size values (1: off)")
    ap.add_argument("--batch-wait-ms", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "proxy_load.json")
    args = ap.parse_args()

    examples = load_dataset("hotpotqa", DATA, limit=args.requests + 2)
    warm, examples = examples[:2], examples[2:]
    hf = HFBackend.load(MODEL)
    rows = []
    for batch in args.batch_sizes:
        settings = ProxySettings(served_model_name=MODEL, method=args.method, batch_max_size=batch,
                                 batch_max_wait_ms=args.batch_wait_ms)
        with serve_in_thread(create_app(settings, backend=hf)) as base:
            load(base, warm, 1, args.ratio, args.max_tokens)  # loads the compressor
            for callers in args.callers:
                before = {k: metric(base, f"ragpress_{k}_total") for k in
                          ("compress_batches", "compress_batched_requests", "decode_batches", "decode_batched_requests")}
                r = load(base, examples, callers, args.ratio, args.max_tokens)
                after = {k: metric(base, f"ragpress_{k}_total") - v for k, v in before.items()}
                r.update(callers=callers, batch_max_size=batch, method=args.method,
                         compress_batch_mean=after["compress_batched_requests"] / max(1, after["compress_batches"]),
                         decode_batch_mean=after["decode_batched_requests"] / max(1, after["decode_batches"]))
                rows.append(r)
                print(json.dumps(r), flush=True)

    print(f"\n{len(examples)} HotpotQA questions per setting, {args.method} at ratio {args.ratio:g}, embedded {MODEL} "
          f"(bf16, CPU), greedy, max_tokens {args.max_tokens}, batch wait {args.batch_wait_ms:g} ms\n")
    print("| callers | batching | requests/s | p50 s | p95 s | compress batch (mean) | decode batch (mean) | errors |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        on = "off" if r["batch_max_size"] == 1 else f"up to {r['batch_max_size']}"
        print(f"| {r['callers']} | {on} | {r['requests_per_s']:.2f} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | "
              f"{r['compress_batch_mean']:.1f} | {r['decode_batch_mean']:.1f} | {r['errors']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
