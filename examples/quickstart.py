"""Quickstart: answer a real HotpotQA question from a compressed context, two ways.

1. One call: ``RAGPipeline(...).answer(question, passages)``.
2. Wrapping a generate function you already have (here a transformers chat pipeline; an OpenAI client's
   ``client.chat.completions.create`` works the same): it gains a ``documents=`` keyword.

Run with ``make demo`` (sets everything up) or ``.venv/bin/python examples/quickstart.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from adapters import RAGPipeline, compress_messages
from adapters.datasets import load_dataset
from compressor import Budget, available_compressors

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "hotpotqa_train" / "hotpotqa_train_a.jsonl"
METHOD = os.environ.get("RAGPRESS_DEMO_METHOD", "sentinel" if "sentinel" in available_compressors() else "bm25")


def main() -> int:
    example = load_dataset("hotpotqa", DATA, limit=10)[9]
    print(f"question: {example.question}\ngold:     {example.answers[0]}\n")

    # 1. One call.
    full = RAGPipeline(decoder="smollm2-135m-instruct", method="none")
    # early_stop: sentinel stops below its min_score, keeping less than the 5x budget, which is what a 135M
    # decoder answers best from; a larger decoder reads the filled budget better (leave it out).
    budget = Budget(ratio=5, early_stop=True)
    pipe = RAGPipeline(decoder=full.backend, method=METHOD, budget=budget)
    for p in (full, pipe):
        a = p.answer(example.question, example.passages)
        ratio = f"{a.ratio:.1f}x" if a.ratio else "-"
        print(f"[{a.method:>8}] answer: {a.text!r}\n           context tokens {a.tokens_in} -> {a.tokens_out} ({ratio}); "
              f"compress {a.compress_s * 1000:.0f} ms, first token {a.ttft_s * 1000:.0f} ms, total {a.e2e_s * 1000:.0f} ms")
    kept = pipe.compress(example.question, example.passages)
    print(f"\nkept sentences (stopped by: {kept.stopped_by}):")
    for cp in kept.passages:
        print(f"  [{cp.title}] {cp.text}")

    # 2. Wrap an existing chat generate function.
    from transformers import GenerationConfig, pipeline

    chat = pipeline("text-generation", model=full.backend.model, tokenizer=full.backend.tokenizer)
    generate = compress_messages(chat, pipe.compressor, budget)
    greedy = GenerationConfig(max_new_tokens=24, do_sample=False)  # one config object, not loose arguments
    out = generate([{"role": "system", "content": "Answer with a few words."},
                    {"role": "user", "content": example.question}],
                   documents=example.passages, generation_config=greedy, clean_up_tokenization_spaces=False)
    print(f"\nwrapped transformers pipeline answer: {out[0]['generated_text'][-1]['content']!r} "
          f"(context {generate.last_context.tokens_in} -> {generate.last_context.tokens_out} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
