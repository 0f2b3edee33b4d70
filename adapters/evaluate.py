"""Evaluation: every method measured the same way on the same questions with the same decoder.

:func:`run_eval` is ``ragpress eval`` as a library call: an :class:`EvalRequest` (dataset, method, budget,
decoder, options) in, an :class:`EvalResult` (one record per question and the summary) out.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tqdm.auto import tqdm

from compressor.base import Budget, CompressedContext, Compressor, TokenCounter
from compressor.errors import ConfigError
from compressor.registry import get_compressor, get_spec

from .datasets import DatasetSpec, QAExample, load_examples
from .decoders import DecoderBackend, GenerationParams
from .metrics import abstained, abstention_rate, accuracy, evidence_recall, exact_match, f1_score

__all__ = ["EvalRequest", "EvalResult", "build_method", "evaluate", "run_eval", "summarize", "write_eval"]


class EvalRequest(BaseModel):
    """One method on one dataset with one decoder (what ``ragpress eval`` asks for)."""

    model_config = ConfigDict(extra="forbid")

    dataset: DatasetSpec
    method: str = Field(description="A registered method (`ragpress methods`).")
    budget: Budget = Field(default_factory=Budget)
    limit: int | None = Field(default=None, ge=1, description="The first N questions of the file.")
    decoder: str = Field(default="smollm2-135m-instruct", description="Named model or local HF folder.")
    seed: int = Field(default=0, description="Seed of the distractor positions.")
    max_new_tokens: int = Field(default=32, ge=1, le=4096, description="Answer tokens at most.")
    options: dict[str, Any] = Field(default_factory=dict, description="The method's config options, "
                                    "`artifact` included; recorded in the summary.")
    generate: bool = Field(default=True, description="False: compress only (evidence recall, sizes, time).")
    fill_budget: bool = Field(default=False, description="Sentence filters: ignore min_score, fill the budget.")
    explain: bool = Field(default=False, description="Write, per question, what the method kept and why (per "
                          "passage and sentence: span, score, kept, reason, tokens; soft methods: slots and ratio) "
                          "into the per-question records (--out's .samples.jsonl, key 'explanation').")
    fail_fast: bool = Field(default=False, description="Stop at the first question whose compressor or decoder "
                            "raises; by default it is recorded in its sample line, scored as a miss and counted "
                            "(n_errors).")


@dataclass
class EvalResult:
    summary: dict[str, Any]
    records: list[dict[str, Any]]


def build_method(name: str, counter: TokenCounter, decoder: str, options: dict[str, Any] | None = None) -> Compressor:
    """The registered method ``name`` with ``options``. A soft family is built for ``decoder`` (its rows live
    in that model's embedding space; trained on another base it raises :class:`BaseModelMismatchError`); an
    option its config does not take is one :class:`ConfigError` line."""
    opts = dict(options or {})
    if get_spec(name).kind == "soft":
        opts.setdefault("decoder", decoder)
    try:
        return get_compressor(name, counter=counter, **opts)
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{name} does not take these options: {err['loc']} {err['msg']} (see `ragpress methods`)"
                          ) from None


def run_eval(req: EvalRequest, log: Callable[[str], None] | None = None, progress: bool = True) -> EvalResult:
    """Load the questions, build the decoder and the method, answer every question, summarise. ``log`` gets
    one-line notes (an untrained control is said so)."""
    from compressor.filters import SentenceFilter
    from compressor.models import load_tokenizer

    from .decoders import HFBackend, backend_for

    get_spec(req.method)  # an unknown name fails before any data or model loads
    data = load_examples(req.dataset, req.limit, req.seed)
    counter = TokenCounter.from_tokenizer(load_tokenizer(req.decoder))  # the decoder's tokens count the budget
    options = dict(req.options)
    comp = build_method(req.method, counter, req.decoder, options)
    if req.fill_budget:
        if not isinstance(comp, SentenceFilter):
            raise ConfigError(f"--fill-budget applies to sentence filters (bm25, minilm, sentinel), not {req.method}")
        comp.config = comp.config.model_copy(update={"min_score": None})
    if data.index is not None:
        comp.attach_index(data.index)
    backend = backend_for(HFBackend.load(req.decoder), comp) if req.generate else None  # compress-only: no decoder
    params = GenerationParams(max_new_tokens=req.max_new_tokens)
    records = evaluate(data.examples, backend, comp, req.budget, params, progress=progress, generate=req.generate,
                       fail_fast=req.fail_fast, explain=req.explain)
    stats = comp.run_stats()
    if stats.get("trained") is False and log:
        log(f"{req.method}: UNTRAINED weights (a control), from {options.get('artifact')}")
    extra: dict[str, Any] = {**data.info, **stats}
    if "artifact" in options:
        extra["artifact"] = options["artifact"]
    recorded = {k: v for k, v in options.items() if k != "artifact"}
    if recorded:
        extra["options"] = recorded
    if req.fill_budget:
        extra["fill_budget"] = True
    summary = summarize(records, req.method, req.budget.ratio, dataset=req.dataset.kind, decoder=req.decoder,
                        distractors=req.dataset.distractors, target_tokens=req.budget.target_tokens, **extra)
    return EvalResult(summary=summary, records=records)


def write_eval(result: EvalResult, out: str | Path) -> Path:
    """The summary JSON at ``out`` and the per-question records beside it (``.samples.jsonl``)."""
    import json

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.summary, indent=2) + "\n")
    with open(out.with_suffix(".samples.jsonl"), "w") as f:
        for r in result.records:
            f.write(json.dumps(r) + "\n")
    return out


def evaluate(
    examples: Sequence[QAExample],
    backend: DecoderBackend,
    compressor: Compressor,
    budget: Budget | None = None,
    params: GenerationParams | None = None,
    progress: bool = True,
    on_sample: Callable[[dict], None] | None = None,
    generate: bool = True,
    fail_fast: bool = False,
    control: SoftControl | None = None,
    explain: bool = False,
) -> list[dict[str, Any]]:
    """Run one method over ``examples`` one question at a time (so timings are per question); return one
    record per example. ``generate=False`` only compresses: evidence recall, sizes and compression time, with
    the answer metrics left None (``backend`` may then be None). A question whose compressor or decoder raises
    is recorded with its ``error`` (class and message) and scored as a miss; ``fail_fast`` raises instead.
    ``control`` (soft methods): ``zeroed`` replaces every soft row by zeros; ``other`` answers question i from
    the compressed context of question i+1's passages (cyclically): what a soft method scores without the
    information in its own slots. ``explain`` adds each record's ``explanation`` (:mod:`compressor.explain`)."""
    params = params or GenerationParams()
    budget = budget or Budget()
    records = []
    for i, ex in enumerate(tqdm(examples, desc=f"eval {compressor.name}", disable=not progress, leave=False)):
        donor = examples[(i + 1) % len(examples)] if control == "other" else None
        try:
            rec = _answer(ex, backend, compressor, budget, params, generate, control, donor, explain)
        except Exception as e:  # noqa: BLE001 - one question's failure is recorded, scored and counted
            if fail_fast:
                raise
            rec = _failed(ex, e, generate)
        records.append(rec)
        if on_sample:
            on_sample(rec)
    return records


SoftControl = Literal["zeroed", "other"]


def _controlled(ctx: CompressedContext, control: SoftControl | None, donor: CompressedContext | None,
                question: str) -> CompressedContext:
    """The context a soft control reads instead of ``ctx`` (sizes and timings stay those of ``ctx``)."""
    if control is None:
        return ctx
    if ctx.kind != "soft":
        raise ConfigError(f"the {control} control applies to soft methods; {ctx.method} returns text")
    if control == "zeroed":
        return ctx.model_copy(update={"passages": [p.model_copy(update={"embeds": p.embeds * 0})
                                                   if p.embeds is not None else p for p in ctx.passages]})
    if donor is None:
        raise ValueError("the other-question control needs the donor question's context")
    return donor.model_copy(update={"query": question})


def _answer(ex: QAExample, backend: DecoderBackend, compressor: Compressor, budget: Budget,
            params: GenerationParams, generate: bool, control: SoftControl | None = None,
            donor: QAExample | None = None, explain: bool = False) -> dict[str, Any]:
    ctx = compressor.compress(ex.question, ex.passages, budget, explain=explain)
    shown = _controlled(ctx, control, compressor.compress(donor.question, donor.passages, budget) if donor else None,
                        ex.question)
    rec = {"id": ex.id, "question": ex.question, "answers": ex.answers, "prediction": None, "em": None,
           "f1": None, "accuracy": None, "evidence_recall": evidence_recall(ctx, ex.passages),
           "tokens_in": ctx.tokens_in, "tokens_out": ctx.tokens_out, "asked_ratio": ctx.asked_ratio,
           "prompt_tokens": None, "compress_s": ctx.compress_s, "ttft_s": None, "e2e_s": ctx.compress_s,
           "new_tokens": 0, "stopped_by": ctx.stopped_by, "duplicates": ctx.duplicates, "error": None}
    if explain:
        rec["explanation"] = ctx.explain().model_dump(mode="json")
    if generate:
        gen = backend.generate([backend.prompt_builder().build(shown)], params)[0]
        pred = gen.text.strip()
        rec.update(
            prediction=pred, em=exact_match(pred, ex.answers), f1=f1_score(pred, ex.answers),
            # an unanswerable question (no gold answer) is answered correctly by abstaining
            accuracy=accuracy(pred, ex.answers) if ex.answers else float(abstained(pred)),
            abstained=abstained(pred), prompt_tokens=gen.prompt_tokens, ttft_s=gen.ttft_s,
            e2e_s=gen.e2e_s + ctx.compress_s, new_tokens=len(gen.token_ids))
    return rec


def _failed(ex: QAExample, e: Exception, generate: bool) -> dict[str, Any]:
    """The record of a question whose compressor or decoder raised: the error, scored as a miss (no answer,
    no evidence kept), left out of the size and time means."""
    miss = 0.0 if generate else None
    return {"id": ex.id, "question": ex.question, "answers": ex.answers, "prediction": None, "em": miss, "f1": miss,
            "accuracy": miss, "evidence_recall": 0.0 if any(p.evidence for p in ex.passages) else None,
            "tokens_in": None, "tokens_out": None, "asked_ratio": None, "prompt_tokens": None, "compress_s": None,
            "ttft_s": None, "e2e_s": None, "new_tokens": 0, "stopped_by": None, "duplicates": 0,
            "error": {"type": type(e).__name__, "message": str(e)}}


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarize(records: list[dict], method: str, ratio_requested: float | None, **extra: Any) -> dict[str, Any]:
    """The eval JSON: means over the records (a failed question scores as a miss); ``ratio`` is measured over
    the questions that did not fail: total tokens in / total tokens out. ``n_errors`` counts failed questions,
    ``n_rounded`` those whose budget target the method could not land on (``stopped_by`` granularity or
    passed_through: the reached ratio differs from the asked one)."""
    ok = [r for r in records if not r.get("error")]
    tin = sum(r["tokens_in"] for r in ok)
    tout = sum(r["tokens_out"] for r in ok)
    errors = Counter(r["error"]["type"] for r in records if r.get("error"))
    return {
        "n": len(records),
        "method": method,
        "ratio_requested": ratio_requested,
        **extra,
        "n_errors": sum(errors.values()),
        "errors": dict(sorted(errors.items())),
        "n_rounded": sum(r.get("stopped_by") in ("granularity", "passed_through") for r in ok),
        "em": _mean([r["em"] for r in records]),
        "f1": _mean([r["f1"] for r in records]),
        "accuracy": _mean([r["accuracy"] for r in records]),
        "evidence_recall": _mean([r["evidence_recall"] for r in records]),
        "abstention": abstention_rate(ok),
        "tokens_in_mean": tin / len(ok) if ok else None,
        "tokens_out_mean": tout / len(ok) if ok else None,
        "ratio": (tin / tout) if tout else None,
        "compress_s_mean": _mean([r["compress_s"] for r in ok]),
        "ttft_s_mean": _mean([r["ttft_s"] for r in ok]),
        "e2e_s_mean": _mean([r["e2e_s"] for r in ok]),
        # why each method kept what it kept, in questions: budget / min_score / threshold / input / granularity /
        # passed_through
        "stopped_by": dict(sorted(Counter(r.get("stopped_by") for r in ok if r.get("stopped_by")).items())),
        "duplicates": sum(r.get("duplicates", 0) for r in records),
    }
