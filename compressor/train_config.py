"""Settings shared by the trained soft families' two-stage training (no torch import here)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["StagedTrainConfig", "ContrastConfig"]


class StagedTrainConfig(BaseModel):
    """The optimiser and schedule settings every staged run has (see :class:`compressor.training.StagedRun`);
    families add their step counts, learning rates and losses. Learning rate: linear warm-up, then cosine to
    10% within each stage."""

    model_config = ConfigDict(extra="forbid")

    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    warmup_fraction: float = Field(default=0.03, ge=0.0, le=0.5, description="Share of a stage spent warming up.")
    grad_clip: float = Field(default=1.0, gt=0.0, le=1000.0, description="Gradient-norm clip.")
    kl_temperature: float = Field(default=1.0, gt=0.0, le=20.0, description="Softmax temperature of the KL.")
    max_answer_tokens: int = Field(default=24, ge=1, le=512, description="Stage 2 target: answer tokens at most.")
    checkpoint_every: int = Field(default=50, ge=1, le=10_000_000, description="Steps between checkpoints.")
    device: str = Field(default="cpu", description="Where the run computes: cpu, cuda, cuda:1 (checkpoints are "
                        "device-free: a run started on a GPU resumes on a CPU and back).")
    max_hours: float | None = Field(default=None, ge=0.0, le=1000.0,
                                    description="Stop this chunk after this many hours (checkpointed; the artifact "
                                    "holds the weights so far, marked incomplete); --resume continues exactly.")

    @property
    def total_steps(self) -> int:
        return self.stage1_steps + self.stage2_steps  # type: ignore[attr-defined]

    def resume_key(self) -> dict:
        """Fields that must match for ``--resume`` to continue the same run (the schedule depends on them)."""
        return self.model_dump(exclude={"checkpoint_every", "max_hours", "device"})

    def saved_key(self, saved: dict) -> dict:
        """A checkpoint's ``resume_key``, completed with the defaults of settings added after it was written
        (that run trained with them), so that adding a setting does not strand older runs."""
        fields = type(self).model_fields
        return {**{k: fields[k].default for k in self.resume_key() if k in fields}, **saved}


class ContrastConfig(BaseModel):
    """The stage-2 contrastive term of the trained soft families (a loss only the soft rows can lower): each
    record's target must be likelier (mean token log-probability) under its own rows than under negatives'
    rows, by a logistic loss on the difference (:func:`compressor.distill.contrast_loss`)."""

    contrast_weight: float = Field(
        default=0.0, ge=0.0, le=100.0, description="Stage 2: weight of a contrastive term: each record's target "
        "answer must be likelier (mean token log-probability) under its own rows than under contrast_negatives' "
        "rows; logistic loss on the difference times contrast_beta. 0: off (each negative adds a forward pass).")
    contrast_beta: float = Field(default=2.0, gt=0.0, le=100.0, description="Scale of the contrastive difference.")
    contrast_negatives: Literal["other", "zeroed", "both"] = Field(
        default="other", description="What the own rows are contrasted with: the next record's rows (other; "
        "training can also win by making those rows harmful), zeroed rows (zeroed; a fixed baseline, only "
        "information the own rows add counts), or both, the two terms averaged.")

    @model_validator(mode="after")
    def _check_contrast(self) -> ContrastConfig:
        # batch_size is the family config's own field (every family that mixes this in has one)
        if (self.contrast_weight > 0 and self.contrast_negatives != "zeroed"
                and getattr(self, "batch_size", 2) < 2):
            raise ValueError(f"contrast_negatives={self.contrast_negatives!r} reads the next record's rows in the "
                             "batch, and a batch of 1 has none: set batch_size to 2 or more, or contrast_negatives "
                             "to 'zeroed'")
        return self
