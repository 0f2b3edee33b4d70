"""Sequence-level distillation targets for the trained soft families (PISCO, Louis et al. 2025; COCOM).

The teacher is the frozen decoder reading only a record's *evidence* passages as text (the gold passage, or
HotpotQA's supporting paragraphs), in the evaluation prompt. It answers greedily once per record; its answer
tokens and, at each of them, its top-K next-token log-probabilities are the student's targets. The student
(the decoder reading the slots of *all* passages, distractors included) is trained towards them, so it learns
to answer as if it had been handed the evidence alone.

A teacher answer is used only when the teacher stopped within ``max_answer_tokens`` and the caller's
``accept(text, record)`` (for example "contains a gold answer") agrees; otherwise the target is the gold
answer with no distribution (plain NLL). Targets are cached on disk once per (base model, prompt, settings)
in a :class:`~compressor.cache.TensorCache`, so every run, resumed or new, reads the same targets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .cache import TensorCache
from .prompt import PromptBuilder
from .training import QARecord, answer_ids, text_prompt

__all__ = ["Target", "teacher_targets", "stop_ids", "distill_loss", "mean_logp", "contrast_loss", "soft_answer",
           "score_soft_answers"]


@dataclass(frozen=True)
class Target:
    """What the student is trained to produce for one record."""

    ids: list[int]  # answer tokens, ending with the stop token
    topk_ids: torch.Tensor | None  # [len(ids), K] teacher's top-K next-token ids at each target position
    topk_logp: torch.Tensor | None  # [len(ids), K] their log-probabilities (None: a gold-answer target)
    source: str  # "teacher" or "gold"


def stop_ids(builder: PromptBuilder) -> set[int]:
    """Tokens that end an answer in ``builder``'s prompt style (EOS for chat, the newline for plain)."""
    tok = builder.tokenizer
    if builder.style == "chat":
        return {tok.eos_token_id} if tok.eos_token_id is not None else set()
    return set(builder._encode("\n")[-1:])


@torch.no_grad()
def _greedy_with_logits(model: Any, prompts: list[list[int]], max_new: int, stop: set[int],
                        pad: int) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy answer tokens of each prompt (one left-padded batch) and the fp32 logits that predicted each."""
    dev = model.get_input_embeddings().weight.device
    B, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, L), pad, dtype=torch.long, device=dev)
    mask = torch.zeros(B, L, dtype=torch.long, device=dev)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p, device=dev)
        mask[b, L - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    gen: list[list[int]] = [[] for _ in prompts]
    logits: list[list[torch.Tensor]] = [[] for _ in prompts]
    done = [False] * B
    while True:
        step = out.logits[:, -1].float()
        nxt = step.argmax(-1)
        for b in range(B):
            if not done[b]:
                logits[b].append(step[b])
                gen[b].append(int(nxt[b]))
                done[b] = gen[b][-1] in stop or len(gen[b]) >= max_new
        if all(done):
            return [(g, torch.stack(lg)) for g, lg in zip(gen, logits, strict=True)]
        mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                    past_key_values=out.past_key_values, use_cache=True)


def teacher_targets(model: Any, builder: PromptBuilder, records: Sequence[QARecord], max_answer_tokens: int,
                    top_k: int, cache_dir: str | Path | None, namespace: str,
                    accept: Callable[[str, QARecord], bool] | None = None, progress: bool = True,
                    log: Callable[[str], None] = print, batch_size: int = 16) -> tuple[list[Target], dict[str, Any]]:
    """One :class:`Target` per record (in order) and counts (teacher / gold targets, cache hits). ``model``
    is the frozen decoder; ``namespace`` names everything the targets depend on besides the prompt (the base
    model's hash): targets under another namespace are never reused. Missing targets are generated
    ``batch_size`` records at a time (left-padded), each stored as soon as its batch ends."""
    from tqdm.auto import tqdm

    model.eval()
    stop = stop_ids(builder)
    cache = TensorCache(cache_dir, namespace) if cache_dir is not None else None
    out: list[Target] = []
    counts = {"teacher": 0, "gold": 0, "teacher_no_stop": 0, "teacher_rejected": 0, "cached": 0}
    prompts = [text_prompt(builder, r.evidence_only()) for r in records]
    keys = [json.dumps([p, max_answer_tokens, top_k]) for p in prompts]
    found: list[dict[str, torch.Tensor] | None] = [cache.get_tensors(k) if cache is not None else None for k in keys]
    counts["cached"] = sum(f is not None for f in found)
    miss = [i for i, f in enumerate(found) if f is None]
    pad = builder.tokenizer.pad_token_id if builder.tokenizer.pad_token_id is not None else 0
    bar = tqdm(total=len(miss), desc="teacher answers", disable=not progress)
    for c in range(0, len(miss), batch_size):
        chunk = miss[c: c + batch_size]
        for i, (gen, logits) in zip(chunk, _greedy_with_logits(model, [prompts[i] for i in chunk], max_answer_tokens,
                                                               stop, pad), strict=True):
            logp, idx = torch.log_softmax(logits, -1).topk(top_k, dim=-1)
            found[i] = {"ids": torch.tensor(gen, dtype=torch.int64), "topk_ids": idx.to(torch.int64),
                        "topk_logp": logp.float()}
            if cache is not None:
                cache.put_tensors(keys[i], found[i])
        bar.update(len(chunk))
    bar.close()
    for r, hit in zip(records, found, strict=True):
        gen = [int(t) for t in hit["ids"]]  # type: ignore[index]  (every miss was filled above)
        text = builder.tokenizer.decode(gen, skip_special_tokens=True).strip()
        if gen[-1] not in stop:
            counts["teacher_no_stop"] += 1
        elif accept is not None and not accept(text, r):
            counts["teacher_rejected"] += 1
        else:
            counts["teacher"] += 1
            out.append(Target(gen, hit["topk_ids"], hit["topk_logp"], "teacher"))
            continue
        counts["gold"] += 1
        out.append(Target(answer_ids(builder, r.answer, max_answer_tokens), None, None, "gold"))
    log(f"distillation targets: {counts['teacher']} teacher answers, {counts['gold']} gold answers "
        f"({counts['teacher_rejected']} teacher answers rejected, {counts['teacher_no_stop']} not stopped within "
        f"{max_answer_tokens} tokens); {counts['cached']} of {len(records)} read from the cache")
    return out, counts


def distill_loss(logits: torch.Tensor, targets: Sequence[Target], temperature: float) -> torch.Tensor:
    """KL(teacher || student) over the teacher's top-K tokens (renormalised), averaged over the target
    positions of teacher targets; ``logits`` ``[sum len(ids), vocab]`` in the order of ``targets``. Zero when
    no target carries a distribution."""
    parts, pos = [], 0
    for t in targets:
        n = len(t.ids)
        if t.topk_ids is not None:
            s = torch.log_softmax(logits[pos: pos + n] / temperature, -1).gather(-1, t.topk_ids.to(logits.device))
            p = torch.log_softmax(t.topk_logp.to(logits.device) / temperature, -1)
            parts.append((p.exp() * (p - s)).sum(-1))
        pos += n
    if not parts:
        return logits.new_zeros(())
    return torch.cat(parts).mean() * temperature * temperature


def mean_logp(logits: torch.Tensor, labels: torch.Tensor, n_targets: Sequence[int]) -> torch.Tensor:
    """Per sequence, the mean log-probability of its target tokens: ``[len(n_targets)]`` (``logits`` and
    ``labels`` are the targets of all sequences concatenated in order, ``n_targets[i]`` of them for sequence i,
    as :func:`~compressor.training.target_logits` returns them)."""
    lp = torch.log_softmax(logits.float(), -1).gather(1, labels[:, None])[:, 0]
    return torch.stack([part.mean() for part in lp.split(list(n_targets))])


def contrast_loss(own: torch.Tensor, negatives: dict[str, torch.Tensor], beta: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The contrastive term of the soft families (``ContrastConfig``): for each kind of negative, the mean over
    records of ``softplus(-beta * (own - negative))`` (own, negative: each record's mean target log-probability
    under its own rows and under the negative's), averaged over the kinds; and what the step log records (the
    term, and each gap: ``logp_gap`` for the other record's rows, ``logp_gap_<kind>`` for the rest)."""
    gaps = {kind: own - neg for kind, neg in negatives.items()}
    term = torch.stack([torch.nn.functional.softplus(-beta * gap).mean() for gap in gaps.values()]).mean()
    return term, {"contrast": round(term.item(), 5),
                  **{("logp_gap" if kind == "other" else f"logp_gap_{kind}"): round(gap.mean().item(), 5)
                     for kind, gap in gaps.items()}}


@torch.no_grad()
def soft_answer(model: Any, builder: PromptBuilder, ctx: Any, max_new_tokens: int) -> list[int]:
    """The decoder's greedy answer tokens (stop token excluded) to ``ctx`` (a compressed context, soft rows
    spliced in): the validation answers of the trained soft families' learning curves."""
    from .prompt import embed_prompt

    stop = stop_ids(builder)
    x = embed_prompt(model, builder.build(ctx))
    out = model(inputs_embeds=x[None].to(model.get_input_embeddings().weight.dtype), use_cache=True)
    ids: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        if nxt in stop:
            break
        ids.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]], device=x.device), past_key_values=out.past_key_values, use_cache=True)
    return ids


@torch.no_grad()
def score_soft_answers(model: Any, builder: PromptBuilder, records: Sequence[QARecord],
                       rows_of: Callable[[QARecord], Sequence[torch.Tensor]],
                       score: Callable[[str, QARecord], dict[str, float]], max_new_tokens: int, method: str,
                       decoder: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Greedy answers of the decoder reading each record's soft rows (``rows_of(record)``: one tensor per
    passage), one record at a time, inside ``decoder()`` (the context that switches a decoder adapter on)
    when given; ``score(answer, record)`` averaged over the ``n`` records."""
    import contextlib

    from .base import CompressedContext, CompressedPassage

    totals: dict[str, float] = {}
    for r in records:
        rows = list(rows_of(r))
        ctx = CompressedContext(
            method=method, kind="soft", query=r.question, n_input_passages=len(r.passages), tokens_in=0,
            tokens_out=sum(int(x.shape[0]) for x in rows),
            passages=[CompressedPassage(index=i, title=p.title, embeds=x, tokens_out=int(x.shape[0]))
                      for i, (p, x) in enumerate(zip(r.passages, rows, strict=True))])
        with decoder() if decoder is not None else contextlib.nullcontext():
            ids = soft_answer(model, builder, ctx, max_new_tokens)
        for k, v in score(builder.tokenizer.decode(ids, skip_special_tokens=True).strip(), r).items():
            totals[k] = totals.get(k, 0.0) + v
    return {"n": len(records), **{k: round(v / max(1, len(records)), 4) for k, v in totals.items()}}
