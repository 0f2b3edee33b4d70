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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..base import TokenCounter
from ..errors import InputError
from ..prompt import PromptBuilder
from ..training import QARecord, Seq, StagedRun, qa_layouts, seeded_batch, target_logits
from .config import ICAEConfig, ICAETrainConfig
from .model import ICAECompressor, ICAEEncoder

__all__ = ["train_icae", "pretrain_example"]

_CKPT_TYPE = "icae-checkpoint"
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
    if train.stage1_steps and not texts:
        raise InputError("stage 1 needs passages (texts); pass some or set stage1_steps=0")
    if train.stage2_steps and not qa:
        raise InputError("stage 2 needs question records (qa); pass some or set stage2_steps=0")
    identity = {"base_sha256": model_fingerprint(config.base),
                "config": config.model_dump(exclude={"cache_dir", "encode_batch_size"}), "train": train.resume_key(),
                "data_sha256": _data_hash(texts, qa)}
    run = StagedRun(work_dir, _CKPT_TYPE, train, identity, resume, "ragpress train icae", log)
    run.check_fresh()

    model, tok = load_causal_lm(config.base, dtype="bfloat16" if train.precision == "bf16" else "float32")
    torch.manual_seed(train.seed)
    enc = ICAEEncoder(model, config, seed=train.seed)
    enc_tokens = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    enc_tokens = [t for t in enc_tokens if len(t) >= _MIN_TOKENS]
    raw_norm = enc.calibrate_([t[: config.segment_tokens] for t in enc_tokens[:64]] or [[0] * 8])
    log(f"stage-1 passages: {len(enc_tokens)} (of {len(texts)}; under {_MIN_TOKENS} tokens dropped); "
        f"raw slot norm {raw_norm:.3f} before slot_proj")
    run.restore(enc.load_trainable)

    builder = PromptBuilder(tok)
    ph = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []

    def pretrain_step(i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        cap = train.segment_cap(i, config.segment_tokens)
        examples = [pretrain_example(enc_tokens[j], cap, random.Random(f"{train.seed}-1-{i}-{k}"), train.lm_fraction,
                                     train.lm_tokens)
                    for k, j in enumerate(seeded_batch(len(enc_tokens), train.batch_size, i, train.seed, 1))]
        slots = enc.encode([seg for _, seg, _ in examples])
        seqs, rows = [], []
        for (task, _, target), s in zip(examples, slots, strict=True):
            k = int(s.shape[0])
            tgt = target + eos if task == "ae" else target
            seqs.append(Seq([ph] * (k + 1) + tgt, list(range(k + 1)), k + 1, len(tgt)))
            rows += [s, (enc.ae_row if task == "ae" else enc.lm_row)[None]]
        rows_t = torch.cat(rows, 0)
        with enc.decoder():
            logits = target_logits(enc.lm, seqs, ph, rows_t)
        labels = torch.tensor([t for s in seqs for t in s.ids[s.n_prompt:]])
        nll = torch.nn.functional.cross_entropy(logits, labels)
        return nll, {"tasks": "".join("a" if t == "ae" else "l" for t, _, _ in examples), "nll": round(nll.item(), 5),
                     "segment_cap": cap, "target_tokens": int(labels.numel()),
                     "slot_norm": round(float(rows_t.detach().norm(dim=-1).mean()), 4)}

    def qa_step(i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        records = [qa[j] for j in seeded_batch(len(qa), train.batch_size, i, train.seed, 2)]
        p_tokens = [[list(tok(p.text, add_special_tokens=False)["input_ids"]) for p in r.passages] for r in records]
        pairs = [qa_layouts(builder, r, [config.rows_for(len(t)) for t in pt], enc.hidden, ph, train.max_answer_tokens)
                 for r, pt in zip(records, p_tokens, strict=True)]
        rows = torch.cat(enc.encode_passages([t for pt in p_tokens for t in pt], config.encode_batch_size), 0)
        kl = torch.zeros(())
        with enc.decoder():
            logits = target_logits(enc.lm, [p[0] for p in pairs], ph, rows)
            labels = torch.tensor([t for s, _ in pairs for t in s.ids[s.n_prompt:]])
            nll = torch.nn.functional.cross_entropy(logits, labels)
            if train.kl_weight > 0:
                with torch.no_grad():
                    t_logits = target_logits(enc.lm, [p[1] for p in pairs], ph, None)
                T = train.kl_temperature
                kl = torch.nn.functional.kl_div(torch.log_softmax(logits / T, -1), torch.log_softmax(t_logits / T, -1),
                                                log_target=True, reduction="batchmean") * T * T
        return nll + train.kl_weight * kl, {"nll": round(nll.item(), 5), "kl": round(kl.item(), 5),
                                            "target_tokens": int(labels.numel()),
                                            "slot_norm": round(float(rows.detach().norm(dim=-1).mean()), 4)}

    enc.train()
    report = run.run([p for p in enc.parameters() if p.requires_grad],
                     lambda stage, i: pretrain_step(i) if stage == 1 else qa_step(i),
                     lambda: {k: v.numpy() for k, v in enc.trainable_tensors().items()},
                     {"raw_slot_norm": raw_norm}, progress=progress, desc="icae train")
    enc.eval()
    comp = ICAECompressor(TokenCounter.from_tokenizer(tok), enc, tok, manifest={"raw_slot_norm": round(raw_norm, 5)})
    report.update(n_stage1_passages=len(enc_tokens), n_stage2_records=len(qa), raw_slot_norm=round(raw_norm, 5))
    return comp, report
