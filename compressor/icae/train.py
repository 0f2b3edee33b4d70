"""Training the ICAE encoder from plain records (the CLI does the data loading).

Ge et al. 2024 (ICAE) train a LoRA adapter and the memory-token embeddings; the decoder is the frozen base.

1. Pretraining on plain text: an example is one segment of a passage (a seeded window). Autoencoding:
   ``[slots][AE] -> segment + EOS``; language modelling: ``[slots][LM] -> the next lm_tokens tokens``.
   Curriculum: the segment length grows from ``curriculum_start_tokens`` to ``segment_tokens`` over the first
   ``curriculum_fraction`` of the stage, so early steps are cheap and teach the slots to carry tokens.
2. QA fine-tuning: the evaluation prompt (:class:`~compressor.prompt.PromptBuilder`) with each passage's
   slots spliced in -> answer; NLL + ``kl_weight`` x KL(teacher || student), the teacher being the frozen
   decoder reading the passages as text in the same prompt.

Gradients reach the LoRA weights, the memory rows, the [AE]/[LM] rows and ``slot_proj`` through the frozen
decoder. Data order and task choice are functions of (seed, stage, step, position), so ``resume`` redoes
exactly the batches it would have done; checkpoints (every ``checkpoint_every`` steps) are safetensors + JSON.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..artifacts import read_artifact
from ..base import TokenCounter
from ..errors import ConfigError, InputError
from ..prompt import PromptBuilder
from ..training import (QARecord, Seq, cosine_lr, load_opt_state, qa_layouts, save_checkpoint, seeded_batch,
                        target_logits, trim_log)
from .config import ICAEConfig, ICAETrainConfig
from .model import ICAECompressor, ICAEEncoder

__all__ = ["train_icae", "pretrain_example"]

_CKPT_TYPE, _CKPT_VERSION = "icae-checkpoint", 1
_MIN_TOKENS = 16


def pretrain_example(tokens: list[int], cap: int, rng: random.Random, lm_fraction: float,
                     lm_tokens: int) -> tuple[str, list[int], list[int]]:
    """(task, segment, target) of one stage-1 example: a window of at most ``cap`` tokens; ``lm`` (continue
    the text after it) with probability ``lm_fraction`` when at least 8 tokens follow, else ``ae``."""
    start = rng.randrange(0, max(1, len(tokens) - cap - 8))
    seg = tokens[start: start + cap]
    cont = tokens[start + cap: start + cap + lm_tokens]
    if len(cont) >= 8 and rng.random() < lm_fraction:
        return "lm", seg, cont
    return "ae", seg, seg


def _data_hash(texts: Sequence[str], qa: Sequence[QARecord]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    for r in qa:
        h.update(json.dumps([r.question, r.answer, [p.text for p in r.passages]]).encode())
    return h.hexdigest()


def train_icae(
    texts: Sequence[str],
    qa: Sequence[QARecord],
    work_dir: str | Path,
    config: ICAEConfig | None = None,
    train: ICAETrainConfig | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[ICAECompressor, dict[str, Any]]:
    """Train (or resume) an encoder; return the compressor and a report. ``texts``: stage-1 passages;
    ``qa``: stage-2 records. ``work_dir`` keeps ``checkpoint/`` and ``train_log.jsonl`` (one line a step:
    stage, task mix, loss, nll, kl, lr, seconds)."""
    from ..models import load_causal_lm, model_fingerprint

    config, train = config or ICAEConfig(), train or ICAETrainConfig()
    work = Path(work_dir)
    ckpt, log_path = work / "checkpoint", work / "train_log.jsonl"
    if train.stage1_steps and not texts:
        raise InputError("stage 1 needs passages (texts); pass some or set stage1_steps=0")
    if train.stage2_steps and not qa:
        raise InputError("stage 2 needs question records (qa); pass some or set stage2_steps=0")
    if (ckpt / "compressor_config.json").exists() and not resume:
        raise ConfigError(f"{ckpt} holds a checkpoint; pass --resume to continue it or choose another --work-dir")
    work.mkdir(parents=True, exist_ok=True)

    model, tok = load_causal_lm(config.base, dtype="bfloat16" if train.precision == "bf16" else "float32")
    torch.manual_seed(train.seed)
    enc = ICAEEncoder(model, config, seed=train.seed)
    enc_tokens = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    keep = [i for i, t in enumerate(enc_tokens) if len(t) >= _MIN_TOKENS]
    enc_tokens = [enc_tokens[i] for i in keep]
    scale0 = enc.calibrate_([t[: config.segment_tokens] for t in enc_tokens[:64]] or [[0] * 8])
    log(f"stage-1 passages: {len(enc_tokens)} (of {len(texts)}; under {_MIN_TOKENS} tokens dropped); "
        f"raw slot norm {scale0:.3f} before slot_proj")
    identity = {"base_sha256": model_fingerprint(config.base), "config": config.model_dump(exclude={"cache_dir",
                "encode_batch_size"}), "train": train.resume_key(), "data_sha256": _data_hash(texts, qa)}
    step, t_ckpt, state = 0, None, {}
    if resume and (ckpt / "compressor_config.json").exists():
        state, t_ckpt = read_artifact(ckpt, _CKPT_TYPE, _CKPT_VERSION)
        diff = sorted(k for k in identity if state.get("identity", {}).get(k) != identity[k])
        if diff:
            raise ConfigError(f"cannot resume {ckpt}: {diff} differ from the checkpoint; use the same settings and "
                              "data, or start a new --work-dir")
        enc.load_trainable({k: v for k, v in t_ckpt.items() if not k.startswith("opt.")})
        step = int(state["step"])
        log(f"resumed at step {step} of {train.total_steps}")
    elif resume:
        log(f"no checkpoint in {ckpt}: starting from step 0")
    trim_log(log_path, step)

    builder = PromptBuilder(tok)
    ph = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    params = [p for p in enc.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer | None = None
    opt_stage = None
    history: dict[int, list[float]] = {1: [], 2: []}
    secs: dict[int, list[float]] = {1: [], 2: []}
    bar = tqdm(total=train.total_steps, initial=step, desc="icae train", disable=not progress)
    enc.train()
    while step < train.total_steps:
        stage = 1 if step < train.stage1_steps else 2
        i = step if stage == 1 else step - train.stage1_steps
        if opt_stage != stage:  # a fresh AdamW per stage, restored from the checkpoint when resuming into it
            opt = torch.optim.AdamW(params, lr=0.0, weight_decay=train.weight_decay)
            if t_ckpt is not None and state.get("stage") == stage and state.get("adam_steps"):
                load_opt_state(opt, t_ckpt, state["adam_steps"])
            opt_stage = stage
        lr = cosine_lr(i, train.stage1_steps if stage == 1 else train.stage2_steps,
                       train.stage1_lr if stage == 1 else train.stage2_lr, train.warmup_fraction)
        for g in opt.param_groups:
            g["lr"] = lr
        ts, tc = time.perf_counter(), time.process_time()
        kl = torch.zeros(())
        tasks = ""
        if stage == 1:
            cap = train.segment_cap(i, config.segment_tokens)
            examples = [pretrain_example(enc_tokens[j], cap, random.Random(f"{train.seed}-1-{i}-{k}"),
                                         train.lm_fraction, train.lm_tokens)
                        for k, j in enumerate(seeded_batch(len(enc_tokens), train.batch_size, i, train.seed, 1))]
            slots = enc.encode([seg for _, seg, _ in examples])
            seqs, rows = [], []
            for (task, _, target), s in zip(examples, slots, strict=True):
                k = int(s.shape[0])
                tgt = target + eos if task == "ae" else target
                seqs.append(Seq([ph] * (k + 1) + tgt, list(range(k + 1)), k + 1, len(tgt)))
                rows += [s, (enc.ae_row if task == "ae" else enc.lm_row)[None]]
            tasks = "".join("a" if t == "ae" else "l" for t, _, _ in examples)
            with enc.decoder():
                logits = target_logits(enc.lm, seqs, ph, torch.cat(rows, 0))
            labels = torch.tensor([t for s in seqs for t in s.ids[s.n_prompt:]])
            nll = torch.nn.functional.cross_entropy(logits, labels)
            loss = nll
        else:
            records = [qa[j] for j in seeded_batch(len(qa), train.batch_size, i, train.seed, 2)]
            p_tokens = [[list(tok(p.text, add_special_tokens=False)["input_ids"]) for p in r.passages] for r in records]
            pairs = [qa_layouts(builder, r, [config.rows_for(len(t)) for t in pt], enc.hidden, ph,
                                train.max_answer_tokens) for r, pt in zip(records, p_tokens, strict=True)]
            rows = torch.cat(enc.encode_passages([t for pt in p_tokens for t in pt], config.encode_batch_size), 0)
            with enc.decoder():
                logits = target_logits(enc.lm, [p[0] for p in pairs], ph, rows)
                labels = torch.tensor([t for s, _ in pairs for t in s.ids[s.n_prompt:]])
                nll = torch.nn.functional.cross_entropy(logits, labels)
                loss = nll
                if train.kl_weight > 0:
                    with torch.no_grad():
                        t_logits = target_logits(enc.lm, [p[1] for p in pairs], ph, None)
                    T = train.kl_temperature
                    kl = torch.nn.functional.kl_div(torch.log_softmax(logits / T, -1),
                                                    torch.log_softmax(t_logits / T, -1), log_target=True,
                                                    reduction="batchmean") * T * T
                    loss = nll + train.kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
        opt.step()
        dt, cpu = time.perf_counter() - ts, time.process_time() - tc
        step += 1
        loss_v = float(loss.detach())
        history[stage].append(loss_v)
        secs[stage].append(dt)
        rec = {"step": step - 1, "stage": stage, "tasks": tasks, "loss": round(loss_v, 5),
               "nll": round(float(nll.detach()), 5), "kl": round(float(kl.detach()), 5), "lr": lr, "s": round(dt, 3),
               "cpu_s": round(cpu, 3), "target_tokens": int(labels.numel()),
               "slot_norm": round(float(torch.cat(rows if stage == 1 else [rows], 0).detach().norm(dim=-1).mean()), 4)}
        if stage == 1:
            rec["segment_cap"] = cap
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        bar.update(1)
        bar.set_postfix(stage=stage, loss=f"{loss_v:.3f}")
        if step % train.checkpoint_every == 0 or step == train.total_steps:
            state = {"step": step, "stage": stage, "identity": identity, "raw_slot_norm": scale0}
            save_checkpoint(ckpt, _CKPT_TYPE, _CKPT_VERSION,
                            {k: v.numpy() for k, v in enc.trainable_tensors().items()}, opt, state,
                            "icae training checkpoint (resume with `ragpress train icae --resume`)\n")
            t_ckpt = None
    bar.close()
    enc.eval()
    comp = ICAECompressor(TokenCounter.from_tokenizer(tok), enc, tok, manifest={"raw_slot_norm": round(scale0, 5)})
    report: dict[str, Any] = {
        "stage1_steps_done": min(step, train.stage1_steps), "stage2_steps_done": max(0, step - train.stage1_steps),
        "train_config": train.model_dump(), "n_stage1_passages": len(enc_tokens), "n_stage2_records": len(qa),
        "raw_slot_norm": round(scale0, 5), "log": str(log_path)}
    for s in (1, 2):
        h = history[s]
        if h:
            k = max(1, len(h) // 10)
            report[f"stage{s}_loss_first"] = round(sum(h[:k]) / k, 4)
            report[f"stage{s}_loss_last"] = round(sum(h[-k:]) / k, 4)
            report[f"stage{s}_s_per_step_median"] = round(statistics.median(secs[s]), 3)
    return comp, report
