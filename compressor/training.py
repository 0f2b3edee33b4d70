"""Pieces shared by the trained soft families (``xrag``, ``icae``): token layouts with soft-row placeholders,
the right-padded forward that returns logits at target positions only, seeded batches and the LR schedule.

Every function is deterministic in its arguments, so a resumed run redoes exactly the batches it would have
done without the interruption.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .artifacts import write_artifact
from .base import CompressedContext, CompressedPassage, Passage
from .prompt import PromptBuilder

__all__ = ["Seq", "QARecord", "qa_layouts", "answer_ids", "target_logits", "seeded_batch", "cosine_lr",
           "save_checkpoint", "load_opt_state", "trim_log"]


@dataclass
class Seq:
    """One training sequence: ``ids`` (prompt + target) with a placeholder id at every soft-row position."""

    ids: list[int]
    rows: list[int]  # positions of soft rows, in the order the rows are given
    n_prompt: int
    n_target: int
    texts: list[str] = field(default_factory=list)  # passage text behind the rows (family-specific use)


@dataclass(frozen=True)
class QARecord:
    """A QA record: a question, the passages (in order) and one gold answer."""

    question: str
    passages: tuple[Passage, ...]
    answer: str


def answer_ids(builder: PromptBuilder, answer: str, max_tokens: int) -> list[int]:
    """Target tokens of an answer as the evaluation prompt expects it: chat style ends with EOS, plain style
    with the newline the builder stops on."""
    tok = builder.tokenizer
    if builder.style == "chat":
        eos = tok.eos_token_id
        return builder._encode(answer)[:max_tokens] + ([eos] if eos is not None else [])
    return builder._encode(" " + answer)[:max_tokens] + builder._encode("\n")


def qa_layouts(builder: PromptBuilder, record: QARecord, rows_per_passage: Sequence[int], hidden: int,
               placeholder: int, max_answer_tokens: int) -> tuple[Seq, Seq]:
    """(student: the evaluation prompt with ``rows_per_passage[i]`` soft rows for passage i; teacher: the same
    prompt with the passages as text). Both end in the same answer tokens."""
    soft = CompressedContext(
        method="soft", kind="soft", query=record.question, n_input_passages=len(record.passages), tokens_in=0,
        tokens_out=sum(rows_per_passage),
        passages=[CompressedPassage(index=i, title=p.title, embeds=torch.zeros(n, hidden), tokens_out=n)
                  for i, (p, n) in enumerate(zip(record.passages, rows_per_passage, strict=True))])
    ids: list[int] = []
    rows: list[int] = []
    for seg in builder.build(soft).segments:
        if isinstance(seg, list):
            ids += seg
        else:
            rows += range(len(ids), len(ids) + int(seg.shape[0]))
            ids += [placeholder] * int(seg.shape[0])
    text = CompressedContext(
        method="none", kind="text", query=record.question, n_input_passages=len(record.passages), tokens_in=0,
        tokens_out=0, passages=[CompressedPassage(index=i, title=p.title, text=p.text)
                                for i, p in enumerate(record.passages)])
    t_ids = builder.build(text).token_ids
    ans = answer_ids(builder, record.answer, max_answer_tokens)
    return (Seq(ids + ans, rows, len(ids), len(ans), [p.text for p in record.passages]),
            Seq(t_ids + ans, [], len(t_ids), len(ans)))


def target_logits(model: Any, seqs: Sequence[Seq], pad: int, rows: torch.Tensor | None) -> torch.Tensor:
    """Right-padded batch forward of a causal LM; ``rows`` ``[R, hidden]`` replace the placeholders of all
    sequences, in order. Returns the fp32 logits ``[sum n_target, vocab]`` that predict each target token."""
    emb = model.get_input_embeddings()
    dev = emb.weight.device
    L = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long, device=dev)
    mask = torch.zeros(len(seqs), L, dtype=torch.long, device=dev)
    for b, s in enumerate(seqs):
        ids[b, : len(s.ids)] = torch.tensor(s.ids, device=dev)
        mask[b, : len(s.ids)] = 1
    x = emb(ids)
    if rows is not None:
        rb = torch.tensor([b for b, s in enumerate(seqs) for _ in s.rows], device=dev)
        rp = torch.tensor([p for s in seqs for p in s.rows], device=dev)
        if rows.shape[0] != rb.numel():
            raise ValueError(f"{rows.shape[0]} soft rows for {rb.numel()} placeholders")
        x = x.index_put((rb, rp), rows.to(device=dev, dtype=x.dtype))
    h = model.base_model(inputs_embeds=x, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                         use_cache=False).last_hidden_state
    sb = torch.tensor([b for b, s in enumerate(seqs) for _ in range(s.n_target)], device=dev)
    sp = torch.tensor([s.n_prompt - 1 + k for s in seqs for k in range(s.n_target)], device=dev)
    logits = model.get_output_embeddings()(h[sb, sp]).float()
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def seeded_batch(n: int, size: int, step: int, seed: int, stage: int) -> list[int]:
    """Indices of ``step``'s batch: epochs of seeded permutations, a pure function of its arguments."""
    out, perms = [], {}
    for pos in range(step * size, (step + 1) * size):
        epoch, i = divmod(pos, n)
        if epoch not in perms:
            perms[epoch] = list(range(n))
            random.Random(f"{seed}-{stage}-{epoch}").shuffle(perms[epoch])
        out.append(perms[epoch][i])
    return out


def cosine_lr(i: int, n: int, peak: float, warmup_fraction: float) -> float:
    """Linear warm-up over ``warmup_fraction`` of ``n`` steps, then cosine down to 10% of ``peak``."""
    w = max(1, int(n * warmup_fraction))
    if i < w:
        return peak * (i + 1) / w
    t = (i - w) / max(1, n - w)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def save_checkpoint(path: Path, kind: str, version: int, tensors: dict[str, Any], opt: torch.optim.Optimizer,
                    state: dict[str, Any], card: str) -> None:
    """Write trainable ``tensors`` (numpy) plus AdamW moments as a safetensors artifact (never a pickle)."""
    tensors = dict(tensors)
    steps = {}
    for i, s in opt.state_dict()["state"].items():
        tensors[f"opt.{i}.exp_avg"] = s["exp_avg"].float().contiguous().numpy()
        tensors[f"opt.{i}.exp_avg_sq"] = s["exp_avg_sq"].float().contiguous().numpy()
        steps[str(i)] = float(s["step"])
    write_artifact(path, {"type": kind, "format_version": version, **state, "adam_steps": steps}, tensors, card)


def load_opt_state(opt: torch.optim.Optimizer, t: dict[str, Any], steps: dict[str, float]) -> None:
    """Restore the AdamW moments written by :func:`save_checkpoint`."""
    sd = opt.state_dict()
    sd["state"] = {int(i): {"step": torch.tensor(v), "exp_avg": torch.from_numpy(t[f"opt.{i}.exp_avg"].copy()),
                            "exp_avg_sq": torch.from_numpy(t[f"opt.{i}.exp_avg_sq"].copy())} for i, v in steps.items()}
    opt.load_state_dict(sd)


def trim_log(log_path: Path, step: int) -> None:
    """Drop log lines of steps at or after ``step`` (they are about to be redone after a resume)."""
    import json

    if log_path.exists():
        kept = [ln for ln in log_path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < step]
        log_path.write_text("".join(ln + "\n" for ln in kept))
