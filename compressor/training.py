"""Pieces shared by the trained soft families (``xrag``, ``icae``): token layouts with soft-row placeholders,
the right-padded forward that returns logits at target positions only, seeded batches and the LR schedule.

Every function is deterministic in its arguments, so a resumed run redoes exactly the batches it would have
done without the interruption.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .artifacts import write_artifact
from .base import CompressedContext, CompressedPassage, Passage
from .errors import ConfigError
from .prompt import PromptBuilder

__all__ = ["Seq", "QARecord", "qa_layouts", "text_layout", "text_prompt", "answer_ids", "shared_prefix", "target_logits", "seeded_batch", "cosine_lr",
           "save_checkpoint", "load_opt_state", "trim_log", "StagedRun"]


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
    """A QA record: a question, the passages (in order) and one gold answer. ``answers``: every gold answer
    (for judging a teacher's answer); ``evidence``: indices of the passages that hold the answer (the
    distillation teacher reads only those; empty: all)."""

    question: str
    passages: tuple[Passage, ...]
    answer: str
    answers: tuple[str, ...] = ()
    evidence: tuple[int, ...] = ()

    def evidence_only(self) -> QARecord:
        """The same question with only its evidence passages (all of them when none is marked)."""
        if not self.evidence:
            return self
        return QARecord(self.question, tuple(self.passages[i] for i in self.evidence), self.answer, self.answers)


def answer_ids(builder: PromptBuilder, answer: str, max_tokens: int) -> list[int]:
    """Target tokens of an answer as the evaluation prompt expects it: chat style ends with EOS, plain style
    with the newline the builder stops on."""
    tok = builder.tokenizer
    if builder.style == "chat":
        eos = tok.eos_token_id
        return builder._encode(answer)[:max_tokens] + ([eos] if eos is not None else [])
    return builder._encode(" " + answer)[:max_tokens] + builder._encode("\n")


def qa_layouts(builder: PromptBuilder, record: QARecord, rows_per_passage: Sequence[int], hidden: int,
               placeholder: int, max_answer_tokens: int, target: Sequence[int] | None = None) -> tuple[Seq, Seq]:
    """(student: the evaluation prompt with ``rows_per_passage[i]`` soft rows for passage i; teacher: the same
    prompt with the passages as text). Both end in the same answer tokens: ``target`` when given, else the
    gold answer's (:func:`answer_ids`)."""
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
    ans = list(target) if target is not None else answer_ids(builder, record.answer, max_answer_tokens)
    return (Seq(ids + ans, rows, len(ids), len(ans), [p.text for p in record.passages]),
            text_layout(builder, record, ans))


def text_prompt(builder: PromptBuilder, record: QARecord) -> list[int]:
    """The evaluation prompt's tokens with every passage of ``record`` as text."""
    text = CompressedContext(
        method="none", kind="text", query=record.question, n_input_passages=len(record.passages), tokens_in=0,
        tokens_out=0, passages=[CompressedPassage(index=i, title=p.title, text=p.text)
                                for i, p in enumerate(record.passages)])
    return builder.build(text).token_ids


def text_layout(builder: PromptBuilder, record: QARecord, answer: Sequence[int]) -> Seq:
    """The evaluation prompt with the passages as text, followed by the ``answer`` tokens."""
    t_ids = text_prompt(builder, record)
    return Seq(t_ids + list(answer), [], len(t_ids), len(answer))


def shared_prefix(seqs: Sequence[Seq]) -> int:
    """Length of the token prefix every sequence shares before its first soft row and before its last
    prompt token (the evaluation prompt's system turn and one-shot example: most of a short QA sequence)."""
    cap = min([s.n_prompt - 1 for s in seqs] + [min(s.rows) for s in seqs if s.rows])
    first, n = seqs[0].ids, 0
    while n < cap and all(s.ids[n] == first[n] for s in seqs):
        n += 1
    return n


_PREFIX_KV: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}


@torch.no_grad()
def _prefix_kv(model: Any, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The frozen model's keys and values of ``ids`` per layer, computed once per (model, prefix)."""
    key = (id(model), tuple(ids))
    if key not in _PREFIX_KV:
        if len(_PREFIX_KV) >= 4:
            _PREFIX_KV.pop(next(iter(_PREFIX_KV)))
        dev = model.get_input_embeddings().weight.device
        cache = model.base_model(input_ids=torch.tensor([ids], device=dev), use_cache=True).past_key_values
        _PREFIX_KV[key] = [(layer.keys, layer.values) for layer in cache.layers]
    return _PREFIX_KV[key]


def target_logits(model: Any, seqs: Sequence[Seq], pad: int, rows: torch.Tensor | None) -> torch.Tensor:
    """Right-padded batch forward of a causal LM; ``rows`` ``[R, hidden]`` replace the placeholders of all
    sequences, in order. Returns the fp32 logits ``[sum n_target, vocab]`` that predict each target token.

    When the model is frozen (no parameter requires grad), the prefix all sequences share
    (:func:`shared_prefix`) is run once and its keys/values reused by every later call with the same prefix:
    the same logits and gradients (the prefix depends on nothing trained), several times less compute on
    short QA sequences behind a long fixed prompt."""
    from transformers import DynamicCache

    emb = model.get_input_embeddings()
    dev = emb.weight.device
    frozen = not any(p.requires_grad for p in model.parameters())
    P = shared_prefix(seqs) if frozen else 0
    L = max(len(s.ids) for s in seqs) - P
    ids = torch.full((len(seqs), L), pad, dtype=torch.long, device=dev)
    mask = torch.zeros(len(seqs), P + L, dtype=torch.long, device=dev)
    mask[:, :P] = 1
    for b, s in enumerate(seqs):
        ids[b, : len(s.ids) - P] = torch.tensor(s.ids[P:], device=dev)
        mask[b, : len(s.ids)] = 1
    x = emb(ids)
    if rows is not None:
        rb = torch.tensor([b for b, s in enumerate(seqs) for _ in s.rows], device=dev)
        rp = torch.tensor([p - P for s in seqs for p in s.rows], device=dev)
        if rows.shape[0] != rb.numel():
            raise ValueError(f"{rows.shape[0]} soft rows for {rb.numel()} placeholders")
        x = x.index_put((rb, rp), rows.to(device=dev, dtype=x.dtype))
    past = None
    if P:
        B = len(seqs)
        past = DynamicCache([(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1))
                             for k, v in _prefix_kv(model, seqs[0].ids[:P])], config=model.config)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, P:]
    h = model.base_model(inputs_embeds=x, attention_mask=mask, position_ids=pos, past_key_values=past,
                         use_cache=P > 0).last_hidden_state
    sb = torch.tensor([b for b, s in enumerate(seqs) for _ in range(s.n_target)], device=dev)
    sp = torch.tensor([s.n_prompt - 1 - P + k for s in seqs for k in range(s.n_target)], device=dev)
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
    if log_path.exists():
        kept = [ln for ln in log_path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] < step]
        log_path.write_text("".join(ln + "\n" for ln in kept))


class StagedRun:
    """The resumable two-stage optimisation loop of the trained soft families.

    ``train`` is the family's train config (``stage1_steps``, ``stage2_steps``, ``stage{1,2}_lr``,
    ``warmup_fraction``, ``weight_decay``, ``grad_clip``, ``checkpoint_every``). A fresh AdamW per stage, LR by
    :func:`cosine_lr` within the stage, gradient clipping, one JSON line a step in ``train_log.jsonl``, and a
    checkpoint (trainable tensors + AdamW moments + ``identity``) every ``checkpoint_every`` steps. Resuming
    refuses a checkpoint whose ``identity`` (settings, data and model hashes) differs."""

    def __init__(self, work_dir: str | Path, kind: str, train: Any, identity: dict[str, Any], resume: bool,
                 command: str, log: Callable[[str], None] = print) -> None:
        self.work, self.kind, self.train, self.identity, self.log = Path(work_dir), kind, train, identity, log
        self.ckpt, self.log_path = self.work / "checkpoint", self.work / "train_log.jsonl"
        self.resume, self.command = resume, command
        self.step = 0
        self._state: dict[str, Any] = {}
        self._t: dict[str, Any] | None = None

    def check_fresh(self) -> None:
        """Refuse to overwrite a checkpoint unless resuming (call before any slow set-up)."""
        if (self.ckpt / "compressor_config.json").exists() and not self.resume:
            raise ConfigError(f"{self.ckpt} holds a checkpoint; pass --resume to continue it or choose another "
                              "--work-dir")
        self.work.mkdir(parents=True, exist_ok=True)

    def restore(self, load: Callable[[dict[str, Any]], None]) -> int:
        """Load the checkpoint's trainable tensors through ``load`` when resuming; return the step to run next."""
        from .artifacts import read_artifact

        if self.resume and (self.ckpt / "compressor_config.json").exists():
            self._state, self._t = read_artifact(self.ckpt, self.kind, 1)
            saved = dict(self._state.get("identity", {}))
            if isinstance(saved.get("train"), dict):
                saved["train"] = self.train.saved_key(saved["train"])
            diff = sorted(k for k in self.identity if saved.get(k) != self.identity[k])
            if diff:
                raise ConfigError(f"cannot resume {self.ckpt}: {diff} differ from the checkpoint; use the same "
                                  "settings and data, or start a new --work-dir")
            load({k: v for k, v in self._t.items() if not k.startswith("opt.")})
            self.step = int(self._state["step"])
            self.log(f"resumed at step {self.step} of {self.train.total_steps}")
        elif self.resume:
            self.log(f"no checkpoint in {self.ckpt}: starting from step 0")
        trim_log(self.log_path, self.step)
        return self.step

    def run(self, params: list[torch.nn.Parameter],
            step_fn: Callable[[int, int], tuple[torch.Tensor, dict[str, Any]]],
            tensors: Callable[[], dict[str, Any]], state: dict[str, Any], progress: bool = True,
            desc: str = "train", on_checkpoint: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Run the remaining steps. ``step_fn(stage, i)`` (``i`` counts within the stage) returns the loss and
        extra log fields; ``tensors()`` the trainable tensors (numpy) to checkpoint; ``state`` extra JSON to
        store with them; ``on_checkpoint(step)`` runs after each checkpoint (validation). Returns the report: steps done per stage, first/last loss, median seconds a step."""
        from tqdm.auto import tqdm

        tr = self.train
        opt: torch.optim.Optimizer | None = None
        opt_stage = None
        history: dict[int, list[float]] = {1: [], 2: []}
        secs: dict[int, list[float]] = {1: [], 2: []}
        bar = tqdm(total=tr.total_steps, initial=self.step, desc=desc, disable=not progress)
        deadline = None if tr.max_hours is None else time.monotonic() + tr.max_hours * 3600
        saved = self.step
        while self.step < tr.total_steps:
            if deadline is not None and time.monotonic() >= deadline:
                if self.step != saved and opt is not None:  # end the chunk on a checkpoint
                    self._state = {"step": self.step, "stage": opt_stage, "identity": self.identity, **state}
                    save_checkpoint(self.ckpt, self.kind, 1, tensors(), opt, self._state,
                                    f"{self.kind} (resume with `{self.command} --resume`)\n")
                self.log(f"max_hours reached at step {self.step} of {tr.total_steps}: resume with --resume")
                break
            stage = 1 if self.step < tr.stage1_steps else 2
            i = self.step if stage == 1 else self.step - tr.stage1_steps
            if opt_stage != stage:  # a fresh AdamW per stage, restored from the checkpoint when resuming into it
                opt = torch.optim.AdamW(params, lr=0.0, weight_decay=tr.weight_decay)
                if self._t is not None and self._state.get("stage") == stage and self._state.get("adam_steps"):
                    load_opt_state(opt, self._t, self._state["adam_steps"])
                opt_stage = stage
            lr = cosine_lr(i, tr.stage1_steps if stage == 1 else tr.stage2_steps,
                           tr.stage1_lr if stage == 1 else tr.stage2_lr, tr.warmup_fraction)
            for g in opt.param_groups:
                g["lr"] = lr
            ts, tc = time.perf_counter(), time.process_time()
            loss, extra = step_fn(stage, i)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, tr.grad_clip)
            opt.step()
            dt, cpu = time.perf_counter() - ts, time.process_time() - tc
            self.step += 1
            loss_v = float(loss.detach())
            history[stage].append(loss_v)
            secs[stage].append(dt)
            rec = {"step": self.step - 1, "stage": stage, "loss": round(loss_v, 5), **extra, "lr": lr,
                   "s": round(dt, 3), "cpu_s": round(cpu, 3)}
            with open(self.log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            bar.update(1)
            bar.set_postfix(stage=stage, loss=f"{loss_v:.3f}")
            if self.step % tr.checkpoint_every == 0 or self.step == tr.total_steps:
                self._state = {"step": self.step, "stage": stage, "identity": self.identity, **state}
                save_checkpoint(self.ckpt, self.kind, 1, tensors(), opt, self._state,
                                f"{self.kind} (resume with `{self.command} --resume`)\n")
                self._t = None
                saved = self.step
                if on_checkpoint is not None:
                    on_checkpoint(self.step)
        bar.close()
        report: dict[str, Any] = {"complete": self.step >= tr.total_steps,
                                  "stage1_steps_done": min(self.step, tr.stage1_steps),
                                  "stage2_steps_done": max(0, self.step - tr.stage1_steps),
                                  "train_config": tr.model_dump(), "log": str(self.log_path)}
        if self.log_path.exists():  # every chunk of the run so far (a resume keeps the earlier steps' lines)
            lines = [json.loads(ln) for ln in self.log_path.read_text().splitlines() if ln.strip()]
            report["cpu_hours_steps"] = round(sum(r.get("cpu_s", 0.0) for r in lines) / 3600, 4)
            report["wall_hours_steps"] = round(sum(r.get("s", 0.0) for r in lines) / 3600, 4)
        for s in (1, 2):
            h = history[s]
            if h:
                k = max(1, len(h) // 10)
                report[f"stage{s}_loss_first"] = round(sum(h[:k]) / k, 4)
                report[f"stage{s}_loss_last"] = round(sum(h[-k:]) / k, 4)
                report[f"stage{s}_s_per_step_median"] = round(statistics.median(secs[s]), 3)
        return report
