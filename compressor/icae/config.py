"""Configuration of the ``icae`` family and of its training (no torch import here)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..train_config import ContrastConfig, StagedTrainConfig

__all__ = ["ICAEConfig", "ICAETrainConfig", "FORMAT_VERSION", "SHIPPED_ARTIFACT"]

FORMAT_VERSION = 1
# The shipped encoder: ``icae`` builds from it when no artifact is given.
SHIPPED_ARTIFACT = Path(__file__).resolve().parents[1] / "artifacts" / "icae-smollm2-135m"


class ICAEConfig(BaseModel):
    """What an encoder is: the base model it adapts (which is also the frozen decoder), the compression ratio,
    the segment length and the LoRA shape. Everything except ``encode_batch_size`` and ``cache_dir`` is fixed
    by a trained artifact."""

    model_config = ConfigDict(extra="forbid")

    base: str = Field(default="smollm2-135m-instruct", description="Base = frozen decoder: named model or HF folder.")
    ratio: float = Field(default=4.0, ge=1.0, le=256.0,
                         description="Segment tokens per memory slot: a segment of n tokens gives ceil(n / ratio) slots.")
    segment_tokens: int = Field(default=64, ge=4, le=8192,
                                description="Longest segment the encoder reads at once; longer passages are split.")
    accumulate: bool = Field(
        default=False,
        description="AutoCompressor-style: the slots of a passage's earlier segments are prepended when encoding "
                    "its next segment (summary accumulation). Off: each segment is encoded on its own.")
    lora_r: int = Field(default=16, ge=1, le=1024, description="LoRA rank of the encoder adapter.")
    lora_alpha: float = Field(default=32.0, gt=0.0, le=4096.0, description="LoRA alpha (scale = alpha / r).")
    lora_targets: str = Field(default="all-linear", description="peft target_modules: 'all-linear' or a comma list.")
    decoder_lora_r: int = Field(
        default=0, ge=0, le=1024,
        description="Rank of a second LoRA adapter on the decoder side (PISCO / COCOM), same targets, alpha 2r; "
                    "0: the decoder is the frozen base model. With one, a backend must apply it to read the slots.")
    encode_batch_size: int = Field(default=16, ge=1, le=4096, description="Segments encoded per forward pass.")
    cache_dir: str | None = Field(default=None,
                                  description="Slot cache folder (compressed passages reused across calls); None: off.")

    @property
    def max_slots(self) -> int:
        """Learned memory rows: the slots of a full segment."""
        return self.slots_for(self.segment_tokens)

    def slots_for(self, n_tokens: int) -> int:
        """Slots of a segment of ``n_tokens`` tokens (0 for an empty one)."""
        return math.ceil(n_tokens / self.ratio) if n_tokens > 0 else 0

    def segments_of(self, n_tokens: int) -> list[tuple[int, int]]:
        """``[start, end)`` token ranges of the segments of a passage of ``n_tokens`` tokens."""
        s = self.segment_tokens
        return [(i, min(i + s, n_tokens)) for i in range(0, n_tokens, s)]

    def rows_for(self, n_tokens: int) -> int:
        """Soft rows a passage of ``n_tokens`` tokens becomes."""
        return sum(self.slots_for(e - b) for b, e in self.segments_of(n_tokens))

    def encoding_key(self) -> dict:
        """Fields that change the slots a passage gets (part of the cache key)."""
        return self.model_dump(include={"ratio", "segment_tokens", "accumulate"})


class ICAETrainConfig(ContrastConfig, StagedTrainConfig):
    """Two-stage training of the LoRA adapter, the memory rows and the special rows (the base stays frozen).

    Stage 1 (pretraining on plain text, Ge et al. 2024): each example is one segment; with probability
    ``1 - lm_fraction`` the decoder regenerates it from its slots and the learned [AE] row (autoencoding),
    otherwise it continues the text after it from the slots and the [LM] row (language modelling). Segment
    length grows from ``curriculum_start_tokens`` to ``segment_tokens`` over the first ``curriculum_fraction``
    of the stage (short segments first: cheap steps that teach the slots to carry tokens).
    Stage 2 (QA): the evaluation prompt with the passages' slots spliced in -> answer; NLL + ``kl_weight`` x
    KL to the same frozen decoder reading the passages as text (``stage2_targets="text"``), or to the frozen
    decoder reading only the evidence passages (``"distill"``, :mod:`compressor.distill`); with
    ``contrast_weight`` > 0, plus the contrastive term (:class:`~compressor.train_config.ContrastConfig`): the
    target likelier from the record's own slots than from the next record's passages or from zeroed slots."""

    stage1_steps: int = Field(default=1400, ge=0, le=10_000_000, description="Pretraining steps (AE + LM).")
    stage2_steps: int = Field(default=200, ge=0, le=10_000_000, description="QA fine-tuning steps.")
    batch_size: int = Field(default=4, ge=1, le=4096, description="Examples per optimiser step.")
    stage1_lr: float = Field(default=5e-4, gt=0.0, le=1.0, description="Peak AdamW learning rate, stage 1.")
    stage2_lr: float = Field(default=2e-4, gt=0.0, le=1.0, description="Peak AdamW learning rate, stage 2.")
    lm_fraction: float = Field(default=0.25, ge=0.0, le=1.0,
                               description="Stage 1: share of examples trained on continuation instead of autoencoding.")
    lm_tokens: int = Field(default=64, ge=1, le=4096, description="Stage 1: continuation tokens predicted at most.")
    curriculum_start_tokens: int = Field(default=32, ge=4, le=8192, description="Stage 1: first segment length.")
    curriculum_fraction: float = Field(default=0.3, ge=0.0, le=1.0,
                                       description="Stage 1: share of steps over which segments grow to full length.")
    kl_weight: float = Field(default=1.0, ge=0.0, le=100.0, description="Stage 2: weight of the KL to the text teacher.")
    stage2_targets: Literal["text", "distill"] = Field(
        default="text",
        description="Stage 2 targets. text: the gold answer, KL to the decoder reading the same passages as text. "
                    "distill: the frozen decoder reading only the evidence passages answers once (cached); its "
                    "answer and top-K distribution are the targets where it contains a gold answer, else the gold "
                    "answer (PISCO-style sequence-level distillation).")
    distill_top_k: int = Field(default=32, ge=1, le=4096, description="distill: teacher tokens kept per position.")
    train_encoder: bool = Field(default=True, description="Stage 2: train the encoder (LoRA, memory rows, slot_proj). "
                                "Off: the encoder stays as initialised (init_from) and its slots are computed once "
                                "per passage without gradients; only the decoder adapter learns (needs decoder_lora_r).")
    init_from: str | None = Field(default=None, description="Start from this trained icae artifact's weights (a "
                                  "folder, or 'shipped'); memory rows and slot_proj come with it (no calibration).")
    precision: Literal["bf16", "fp32"] = Field(
        default="bf16", description="Base weights in bf16 (as served; LoRA, memory rows and losses stay fp32) or fp32.")
    seed: int = Field(default=0, description="Seed of data order, task choice and memory-row init.")

    def segment_cap(self, step: int, segment_tokens: int) -> int:
        """Stage-1 segment length at ``step`` (the curriculum)."""
        n = max(1, int(self.stage1_steps * self.curriculum_fraction))
        start = min(self.curriculum_start_tokens, segment_tokens)
        if step >= n:
            return segment_tokens
        return int(start + (segment_tokens - start) * step / n)
