"""The fair uncompressed baseline of the soft families: the decoder with a LoRA adapter fine-tuned on the same
records, with the same distillation targets, reading every passage as *text*.

A soft compressor trained with a decoder adapter (``icae`` with ``decoder_lora_r``) is compared with this, not
only with the frozen decoder: otherwise its gain could be the fine-tuning (short answers, ignoring distractors)
rather than the compression. The artifact is a self-describing folder (type ``decoder-lora``): the base model's
id and sha256, the ``peft.LoraConfig`` keyword arguments, the training data and report, and the adapter's
tensors (peft keys). :func:`load_decoder_adapter` gives the :class:`~compressor.base.DecoderAdapter` that any
backend applies (``backend.with_adapter``), refusing another base model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ._version import __version__
from .artifacts import read_artifact, resolve_base_model, write_artifact
from .base import DecoderAdapter
from .distill import distill_loss, teacher_targets
from .errors import ConfigError, InputError
from .prompt import PromptBuilder
from .training import QARecord, StagedRun, answer_ids, seeded_batch, target_logits, text_layout

__all__ = ["train_text_lora", "load_decoder_adapter", "lora_kwargs", "ARTIFACT_TYPE"]

ARTIFACT_TYPE = "decoder-lora"
_FORMAT_VERSION = 1


def lora_kwargs(r: int, targets: str) -> dict[str, Any]:
    """``peft.LoraConfig`` keyword arguments of a decoder adapter: rank ``r``, alpha 2r, ``targets`` being
    'all-linear' or a comma list of module names (shared with icae's decoder adapter)."""
    t: Any = targets if targets == "all-linear" else [x.strip() for x in targets.split(",") if x.strip()]
    return {"r": r, "lora_alpha": 2.0 * r, "lora_dropout": 0.0, "target_modules": t, "bias": "none",
            "task_type": "CAUSAL_LM"}


def attach_lora(model: Any, r: int, targets: str) -> Any:
    """Inject a fresh trainable LoRA (rank ``r``, :func:`lora_kwargs`) into ``model`` in place; the peft model."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(**lora_kwargs(r, targets)))


def lora_tensors(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter's peft state dict as fp32 CPU tensors (what checkpoints and artifacts store)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().float().contiguous().cpu() for k, v in get_peft_model_state_dict(peft_model).items()}


def load_lora_tensors(peft_model: Any, tensors: dict[str, Any]) -> None:
    """Set the adapter from stored arrays (peft keys), as a checkpoint holds them."""
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(peft_model, {k: torch.as_tensor(v.copy()) for k, v in tensors.items()})


def train_text_lora(qa: Sequence[QARecord], work_dir: str | Path, base: str, train: Any, r: int = 8,
                    targets: str = "all-linear", resume: bool = False, progress: bool = True,
                    log: Callable[[str], None] = print, accept: Callable[[str, QARecord], bool] | None = None,
                    teacher_cache: str | Path | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Fine-tune a decoder LoRA (rank ``r``) on ``qa`` read as text; ``train`` is an
    :class:`~compressor.icae.config.ICAETrainConfig` (its stage-2 settings: steps, batch, LR, targets, KL;
    ``stage1_steps`` must be 0). Returns (the adapter's peft state dict, the report)."""
    from .models import load_causal_lm, model_fingerprint

    if train.stage1_steps:
        raise ConfigError("the text baseline has no pretraining stage: set stage1_steps=0")
    if not qa:
        raise InputError("the text baseline needs question records (qa)")
    identity = {"base_sha256": model_fingerprint(base), "r": r, "targets": targets, "train": train.resume_key(),
                "data_sha256": _records_hash(qa)}
    run = StagedRun(work_dir, "decoder-lora-checkpoint", train, identity, resume, "ragpress train text-lora", log)
    run.check_fresh()
    model, tok = load_causal_lm(base, dtype="bfloat16" if train.precision == "bf16" else "float32",
                                device=train.device)
    torch.manual_seed(train.seed)
    model.requires_grad_(False)
    peft_model = attach_lora(model, r, targets)
    lm = peft_model.base_model.model
    builder = PromptBuilder(tok)
    ph = tok.pad_token_id if tok.pad_token_id is not None else 0
    tgt = None
    counts: dict[str, Any] = {}
    if train.stage2_targets == "distill":
        with peft_model.disable_adapter():
            tgt, counts = teacher_targets(lm, builder, qa, train.max_answer_tokens, train.distill_top_k,
                                          teacher_cache if teacher_cache is not None else Path(work_dir) / "teacher",
                                          f"{identity['base_sha256'][:16]}-{builder.style}", accept=accept,
                                          progress=progress, log=log)

    run.restore(lambda t: load_lora_tensors(peft_model, t))

    def step(stage: int, i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        batch = seeded_batch(len(qa), train.batch_size, i, train.seed, 2)
        seqs = [text_layout(builder, qa[j], answer_ids(builder, qa[j].answer, train.max_answer_tokens)
                            if tgt is None else tgt[j].ids) for j in batch]
        logits = target_logits(lm, seqs, ph, None)
        labels = torch.tensor([t for s in seqs for t in s.ids[s.n_prompt:]], device=logits.device)
        nll = torch.nn.functional.cross_entropy(logits, labels)
        kl = distill_loss(logits, [tgt[j] for j in batch], train.kl_temperature) if tgt is not None else nll * 0
        return nll + train.kl_weight * kl, {"nll": round(nll.item(), 5), "kl": round(kl.item(), 5),
                                            "prompt_tokens": sum(s.n_prompt for s in seqs)}

    peft_model.train()
    report = run.run([p for p in peft_model.parameters() if p.requires_grad], step,
                     lambda: {k: v.numpy() for k, v in lora_tensors(peft_model).items()}, {}, progress=progress, desc="text lora")
    if counts:
        report["distill_targets"] = counts
    return lora_tensors(peft_model), report


def _records_hash(qa: Sequence[QARecord]) -> str:
    import hashlib

    h = hashlib.sha256()
    for r in qa:
        h.update(json.dumps([r.question, r.answer, list(r.answers), list(r.evidence),
                             [[p.title, p.text] for p in r.passages]]).encode())
    return h.hexdigest()


def save_decoder_adapter(directory: str | Path, base: str, tensors: dict[str, torch.Tensor], r: int, targets: str,
                         training: dict[str, Any]) -> Path:
    """Write the adapter as a ``decoder-lora`` artifact."""
    from .models import model_fingerprint, model_id

    cfg = {"type": ARTIFACT_TYPE, "format_version": _FORMAT_VERSION, "library_version": __version__,
           "trained": bool(training.get("stage2_steps_done")),
           "base": {"id": model_id(base), "sha256": model_fingerprint(base)}, "lora": lora_kwargs(r, targets),
           "training": training}
    card = "\n".join([
        "# decoder LoRA: the fine-tuned uncompressed baseline",
        "",
        f"The decoder `{cfg['base']['id']}` (sha256 `{cfg['base']['sha256']}`) with a LoRA adapter (r={r}, "
        f"{targets}) fine-tuned on the soft families' training records read as full text, with the same targets.",
        "It is the fair baseline of a soft compressor trained with a decoder adapter.",
        f"Steps: {training.get('stage2_steps_done', 0)}"
        + ("" if training.get("complete", True) else " (an incomplete run)")
        + (f"; {training['cpu_hours_steps']} CPU hours of optimisation steps" if "cpu_hours_steps" in training else "")
        + ".",
        "Training data: " + json.dumps(training.get("data", "")),
        "",
    ])
    return write_artifact(directory, cfg, {k: v.numpy() for k, v in tensors.items()}, card)


def load_decoder_adapter(directory: str | Path, decoder: str | None = None) -> DecoderAdapter:
    """The adapter of a ``decoder-lora`` artifact, for ``decoder`` (default: the base it was trained on);
    another base model (by sha256) is refused."""
    cfg, t = read_artifact(directory, ARTIFACT_TYPE, _FORMAT_VERSION)
    resolve_base_model(cfg, "base", decoder, directory=directory)  # refuses another base model
    return DecoderAdapter(name=f"text-lora-{Path(directory).name}", lora=cfg["lora"],
                          tensors={k: torch.from_numpy(v.copy()) for k, v in t.items()})
