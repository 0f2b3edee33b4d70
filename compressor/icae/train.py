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
from ..distill import Target, contrast_loss, distill_loss, mean_logp, teacher_targets
from ..errors import ConfigError, InputError
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
        rec: list[Any] = [r.question, r.answer, [p.text for p in r.passages]]
        if r.evidence or r.answers:  # records without them hash as before
            rec += [list(r.evidence), list(r.answers), [p.title for p in r.passages]]
        h.update(json.dumps(rec).encode())
    return h.hexdigest()


def _init_weights(init_from: str, config: ICAEConfig) -> tuple[dict[str, Any], str]:
    """Trainable tensors of the artifact a run starts from, and their sha256; refused unless it was trained
    on the same base model with the same fixed settings."""
    from ..artifacts import check_base_model, read_artifact
    from ..models import model_fingerprint
    from .config import FORMAT_VERSION, SHIPPED_ARTIFACT

    path = SHIPPED_ARTIFACT if init_from == "shipped" else Path(init_from)
    cfg, t = read_artifact(path, "icae", FORMAT_VERSION)
    check_base_model(cfg, "base", config.base, model_fingerprint(config.base))
    mine = config.model_dump(exclude={"base", "cache_dir", "encode_batch_size", "decoder_lora_r"})
    diff = sorted(k for k in mine if cfg["config"].get(k) != mine[k])
    if cfg["config"].get("decoder_lora_r", 0) not in (0, config.decoder_lora_r):
        diff.append("decoder_lora_r")
    if diff:
        raise ConfigError(f"init_from {path}: its {diff} differ from this run's; use its settings or start fresh")
    h = hashlib.sha256()
    for k in sorted(t):
        h.update(k.encode())
        h.update(t[k].tobytes())
    return t, h.hexdigest()


def train_icae(
    texts: Sequence[str],
    qa: Sequence[QARecord],
    work_dir: str | Path,
    config: ICAEConfig | None = None,
    train: ICAETrainConfig | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    accept: Callable[[str, QARecord], bool] | None = None,
    teacher_cache: str | Path | None = None,
    val: Sequence[QARecord] = (),
    score: Callable[[str, QARecord], dict[str, float]] | None = None,
) -> tuple[ICAECompressor, dict[str, Any]]:
    """Train (or resume) an encoder; return the compressor and a report. ``texts``: stage-1 passages;
    ``qa``: stage-2 records. ``work_dir`` keeps ``checkpoint/`` and ``train_log.jsonl`` (one line a step:
    stage, task mix, loss, nll, kl, lr, seconds). With ``stage2_targets="distill"``: ``accept(answer, record)``
    says whether a teacher answer may be a target (default: every one that stops), and the teacher's targets
    are cached under ``teacher_cache`` (default ``work_dir/teacher``). ``val`` records are answered greedily
    at every checkpoint and ``score(answer, record)`` (for example accuracy and F1) averaged into
    ``val_log.jsonl``: the learning curve, on questions never trained on."""
    from ..models import load_causal_lm, model_fingerprint

    config, train = config or ICAEConfig(), train or ICAETrainConfig()
    if train.stage1_steps and not texts:
        raise InputError("stage 1 needs passages (texts); pass some or set stage1_steps=0")
    if train.stage2_steps and not qa:
        raise InputError("stage 2 needs question records (qa); pass some or set stage2_steps=0")
    if not train.train_encoder and not config.decoder_lora_r:
        raise ConfigError("train_encoder=False leaves nothing to train without a decoder adapter; set "
                          "decoder_lora_r (for example 8) or train the encoder")
    if not train.train_encoder and (train.stage1_steps or not train.init_from):
        raise ConfigError("train_encoder=False keeps the encoder as initialised: set init_from (a trained icae "
                          "artifact or 'shipped') and stage1_steps=0")
    identity = {"base_sha256": model_fingerprint(config.base),
                "config": config.model_dump(exclude={"cache_dir", "encode_batch_size"}), "train": train.resume_key(),
                "data_sha256": _data_hash(texts, qa)}
    init = _init_weights(train.init_from, config) if train.init_from else None
    if init is not None:
        identity["init_sha256"] = init[1]
    run = StagedRun(work_dir, _CKPT_TYPE, train, identity, resume, "ragpress train icae", log)
    run.check_fresh()

    model, tok = load_causal_lm(config.base, dtype="bfloat16" if train.precision == "bf16" else "float32")
    torch.manual_seed(train.seed)
    enc = ICAEEncoder(model, config, seed=train.seed).to(train.device)
    enc_tokens = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    enc_tokens = [t for t in enc_tokens if len(t) >= _MIN_TOKENS]
    if train.stage1_steps and not enc_tokens:
        raise InputError(f"stage 1 needs passages of at least {_MIN_TOKENS} tokens; all {len(texts)} are shorter: "
                         "pass longer texts or set stage1_steps=0")
    raw_norm = enc.calibrate_([t[: config.segment_tokens] for t in enc_tokens[:64]] or [[0] * 8])
    log(f"stage-1 passages: {len(enc_tokens)} (of {len(texts)}; under {_MIN_TOKENS} tokens dropped); "
        f"raw slot norm {raw_norm:.3f} before slot_proj")
    if init is not None:
        enc.load_trainable(init[0], parts=("encoder", "decoder") if any(k.startswith("decoder_lora.") for k in init[0])
                           else ("encoder",))
        log(f"starting from {train.init_from} (weights sha256 {init[1][:12]})")
    # With a frozen encoder the checkpoint holds the decoder adapter only (the encoder is init_from's).
    parts = ("encoder", "decoder") if train.train_encoder else ("decoder",)
    enc.set_trainable(encoder=train.train_encoder, decoder=True)
    run.restore(lambda t: enc.load_trainable(t, parts=parts))

    builder = PromptBuilder(tok)
    ph = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    targets: list[Target] | None = None
    teacher_counts: dict[str, Any] = {}
    if train.stage2_steps and train.stage2_targets == "distill":
        with enc.base():
            targets, teacher_counts = teacher_targets(
                enc.lm, builder, qa, train.max_answer_tokens, train.distill_top_k,
                teacher_cache if teacher_cache is not None else Path(work_dir) / "teacher",
                f"{identity['base_sha256'][:16]}-{builder.style}", accept=accept, progress=progress, log=log)

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
        labels = torch.tensor([t for s in seqs for t in s.ids[s.n_prompt:]], device=logits.device)
        nll = torch.nn.functional.cross_entropy(logits, labels)
        return nll, {"tasks": "".join("a" if t == "ae" else "l" for t, _, _ in examples), "nll": round(nll.item(), 5),
                     "segment_cap": cap, "target_tokens": int(labels.numel()),
                     "slot_norm": round(float(rows_t.detach().norm(dim=-1).mean()), 4)}

    def qa_step(i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        batch = seeded_batch(len(qa), train.batch_size, i, train.seed, 2)
        records = [qa[j] for j in batch]
        p_tokens = [[list(tok(p.text, add_special_tokens=False)["input_ids"]) for p in r.passages] for r in records]
        own_targets = [None if targets is None else targets[j].ids for j in batch]

        def layouts(recs: list[QARecord], toks: list[list[list[int]]]) -> list[tuple[Seq, Seq]]:
            return [qa_layouts(builder, r, [config.rows_for(len(t)) for t in pt], enc.hidden, ph, train.max_answer_tokens,
                               target=t_) for r, pt, t_ in zip(recs, toks, own_targets, strict=True)]

        pairs = layouts(records, p_tokens)
        rows = slots_of([p.text for r in records for p in r.passages], [t for pt in p_tokens for t in pt])
        kl = torch.zeros(())
        info: dict[str, Any] = {}
        with enc.decoder():
            logits = target_logits(enc.lm, [p[0] for p in pairs], ph, rows)
            labels = torch.tensor([t for s, _ in pairs for t in s.ids[s.n_prompt:]], device=logits.device)
            nll = torch.nn.functional.cross_entropy(logits, labels)
            if targets is not None:
                mine = [targets[j] for j in batch]
                kl = distill_loss(logits, mine, train.kl_temperature)
                info = {"teacher_targets": sum(t.source == "teacher" for t in mine),
                        "passages": sum(len(r.passages) for r in records), "slots": int(rows.shape[0])}
            elif train.kl_weight > 0:
                with torch.no_grad():
                    t_logits = target_logits(enc.lm, [p[1] for p in pairs], ph, None)
                T = train.kl_temperature
                kl = torch.nn.functional.kl_div(torch.log_softmax(logits / T, -1), torch.log_softmax(t_logits / T, -1),
                                                log_target=True, reduction="batchmean") * T * T
            loss = nll + train.kl_weight * kl
            if train.contrast_weight > 0:
                n_t, negatives = [s.n_target for s, _ in pairs], {}
                if train.contrast_negatives != "zeroed":  # batch_size >= 2 (the config checks it)
                    # the question and its target read with the next record's passages (their slots, titles and
                    # layout): the answer must be likelier from its own compressed context
                    nxt = [(n + 1) % len(records) for n in range(len(records))]
                    blocks = rows.split([sum(config.rows_for(len(t)) for t in pt) for pt in p_tokens])
                    o_pairs = layouts([QARecord(r.question, records[m].passages, r.answer, r.answers)
                                       for r, m in zip(records, nxt, strict=True)], [p_tokens[m] for m in nxt])
                    o_logits = target_logits(enc.lm, [p[0] for p in o_pairs], ph, torch.cat([blocks[m] for m in nxt]))
                    negatives["other"] = mean_logp(o_logits, labels, n_t)
                if train.contrast_negatives != "other":
                    # ... and likelier than with every slot zeroed, a baseline this term cannot push down
                    with torch.no_grad():
                        z_logits = target_logits(enc.lm, [p[0] for p in pairs], ph, torch.zeros_like(rows))
                    negatives["zeroed"] = mean_logp(z_logits, labels, n_t)
                contrast, extra = contrast_loss(mean_logp(logits, labels, n_t), negatives, train.contrast_beta)
                loss = loss + train.contrast_weight * contrast
                info.update(extra)
        return loss, {"nll": round(nll.item(), 5), "kl": round(kl.item(), 5), "target_tokens": int(labels.numel()),
                      **info, "slot_norm": round(float(rows.detach().norm(dim=-1).mean()), 4)}

    frozen_slots: dict[str, torch.Tensor] = {}

    def slots_of(texts_: list[str], tokens: list[list[int]]) -> torch.Tensor:
        """Rows of the passages, in order: with gradients, or (frozen encoder) computed once per passage."""
        if train.train_encoder:
            return torch.cat(enc.encode_passages(tokens, config.encode_batch_size), 0)
        miss = [i for i, t in enumerate(texts_) if t not in frozen_slots]
        if miss:
            with torch.no_grad():
                for i, rows_i in zip(miss, enc.encode_passages([tokens[i] for i in miss], config.encode_batch_size),
                                     strict=True):
                    frozen_slots[texts_[i]] = rows_i.detach()
        return torch.cat([frozen_slots[t] for t in texts_], 0)

    val_log = Path(work_dir) / "val_log.jsonl"

    def validate(step: int) -> None:
        if not val or score is None:
            return
        row = {"step": step, **validate_answers(enc, tok, builder, val, score, train.max_answer_tokens,
                                                None if train.train_encoder else slots_of)}
        with open(val_log, "a") as f:
            f.write(json.dumps(row) + "\n")
        log(f"validation at step {step}: {row}")

    enc.train()
    if val and score is not None and run.step == 0:
        val_log.unlink(missing_ok=True)
        validate(0)
    report = run.run([p for p in enc.parameters() if p.requires_grad],
                     lambda stage, i: pretrain_step(i) if stage == 1 else qa_step(i),
                     lambda: {k: v.numpy() for k, v in enc.trainable_tensors(parts).items()},
                     {"raw_slot_norm": raw_norm}, progress=progress, desc="icae train", on_checkpoint=validate)
    if val_log.exists():
        report["validation"] = [json.loads(ln) for ln in val_log.read_text().splitlines() if ln.strip()]
    enc.eval()
    comp = ICAECompressor(TokenCounter.from_tokenizer(tok), enc, tok, manifest={"raw_slot_norm": round(raw_norm, 5)})
    report.update(n_stage1_passages=len(enc_tokens), n_stage2_records=len(qa), raw_slot_norm=round(raw_norm, 5))
    if teacher_counts:
        report["distill_targets"] = teacher_counts
    if init is not None:
        report["init_from"] = {"artifact": train.init_from, "weights_sha256": init[1]}
    return comp, report


@torch.no_grad()
def validate_answers(enc: ICAEEncoder, tok: Any, builder: PromptBuilder, records: Sequence[QARecord],
                     score: Callable[[str, QARecord], dict[str, float]], max_new_tokens: int,
                     slots_of: Callable[[list[str], list[list[int]]], torch.Tensor] | None = None) -> dict[str, Any]:
    """Greedy answers of the decoder reading each record's slots (one record at a time), scored by ``score``
    and averaged; ``n`` records. ``slots_of(texts, tokens)``: the rows of the passages, concatenated (default:
    encoded now)."""
    from ..distill import score_soft_answers

    def rows_of(r: QARecord) -> list[torch.Tensor]:
        tokens = [list(tok(p.text, add_special_tokens=False)["input_ids"]) for p in r.passages]
        if slots_of is None:
            return enc.encode_passages(tokens, enc.config.encode_batch_size)
        return list(slots_of([p.text for p in r.passages], tokens).split([enc.config.rows_for(len(t)) for t in tokens]))

    was_training = enc.training
    enc.eval()
    try:
        return score_soft_answers(enc.lm, builder, records, rows_of, score, max_new_tokens, "icae", enc.decoder)
    finally:
        if was_training:
            enc.train()
