"""Evaluation: every method measured the same way on the same questions with the same decoder."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from tqdm.auto import tqdm

from compressor.base import Budget, Compressor

from .decoders import DecoderBackend, GenerationParams
from .datasets import QAExample
from .metrics import abstained, abstention_rate, accuracy, evidence_recall, exact_match, f1_score

__all__ = ["evaluate", "summarize"]


def evaluate(
    examples: Sequence[QAExample],
    backend: DecoderBackend,
    compressor: Compressor,
    budget: Budget | None = None,
    params: GenerationParams | None = None,
    progress: bool = True,
    on_sample: Callable[[dict], None] | None = None,
    generate: bool = True,
) -> list[dict[str, Any]]:
    """Run one method over ``examples`` one question at a time (so timings are per question); return one
    record per example. ``generate=False`` only compresses: evidence recall, sizes and compression time, with
    the answer metrics left None (``backend`` may then be None)."""
    params = params or GenerationParams()
    budget = budget or Budget()
    records = []
    for ex in tqdm(examples, desc=f"eval {compressor.name}", disable=not progress, leave=False):
        ctx = compressor.compress(ex.question, ex.passages, budget)
        if not generate:
            rec = {"id": ex.id, "question": ex.question, "answers": ex.answers, "prediction": None, "em": None,
                   "f1": None, "accuracy": None, "evidence_recall": evidence_recall(ctx, ex.passages),
                   "tokens_in": ctx.tokens_in, "tokens_out": ctx.tokens_out, "prompt_tokens": None,
                   "compress_s": ctx.compress_s, "ttft_s": None, "e2e_s": ctx.compress_s, "new_tokens": 0}
            records.append(rec)
            if on_sample:
                on_sample(rec)
            continue
        prompt = backend.prompt_builder().build(ctx)
        gen = backend.generate([prompt], params)[0]
        pred = gen.text.strip()
        rec = {
            "id": ex.id,
            "question": ex.question,
            "answers": ex.answers,
            "prediction": pred,
            "em": exact_match(pred, ex.answers),
            "f1": f1_score(pred, ex.answers),
            # an unanswerable question (no gold answer) is answered correctly by abstaining
            "accuracy": accuracy(pred, ex.answers) if ex.answers else float(abstained(pred)),
            "abstained": abstained(pred),
            "evidence_recall": evidence_recall(ctx, ex.passages),
            "tokens_in": ctx.tokens_in,
            "tokens_out": ctx.tokens_out,
            "prompt_tokens": gen.prompt_tokens,
            "compress_s": ctx.compress_s,
            "ttft_s": gen.ttft_s,
            "e2e_s": gen.e2e_s + ctx.compress_s,
            "new_tokens": len(gen.token_ids),
        }
        records.append(rec)
        if on_sample:
            on_sample(rec)
    return records


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarize(records: list[dict], method: str, ratio_requested: float | None, **extra: Any) -> dict[str, Any]:
    """The eval JSON: means over the records; ``ratio`` is measured: total tokens in / total tokens out."""
    tin = sum(r["tokens_in"] for r in records)
    tout = sum(r["tokens_out"] for r in records)
    return {
        "n": len(records),
        "method": method,
        "ratio_requested": ratio_requested,
        **extra,
        "em": _mean([r["em"] for r in records]),
        "f1": _mean([r["f1"] for r in records]),
        "accuracy": _mean([r["accuracy"] for r in records]),
        "evidence_recall": _mean([r["evidence_recall"] for r in records]),
        "abstention": abstention_rate(records),
        "tokens_in_mean": tin / len(records) if records else None,
        "tokens_out_mean": tout / len(records) if records else None,
        "ratio": (tin / tout) if tout else None,
        "compress_s_mean": _mean([r["compress_s"] for r in records]),
        "ttft_s_mean": _mean([r["ttft_s"] for r in records]),
        "e2e_s_mean": _mean([r["e2e_s"] for r in records]),
    }
