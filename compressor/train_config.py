"""Settings shared by the trained soft families' two-stage training (no torch import here)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["StagedTrainConfig"]


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
