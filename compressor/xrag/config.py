"""Configuration of the ``xrag`` family and of its training (no torch import here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..train_config import ContrastConfig, StagedTrainConfig

__all__ = ["XRAGConfig", "XRAGTrainConfig", "FORMAT_VERSION", "SHIPPED_ARTIFACT"]

# 1: a MiniLM vector, one row. 2: the bridge input is a choice (``source``) and a passage may get several rows.
FORMAT_VERSION = 2
# The shipped bridge: ``xrag`` builds from it when no artifact is given (none ships yet).
SHIPPED_ARTIFACT = Path(__file__).resolve().parents[1] / "artifacts" / "xrag-minilm-smollm2"


class XRAGConfig(BaseModel):
    """What a bridge is: which frozen embedder it reads, which frozen decoder it writes for, and its width.

    The bridge is ``Linear(embedder_dim, bridge_width) -> GELU -> Linear(bridge_width, decoder_hidden)``
    (xRAG's ``mlp2x_gelu`` projector); the two outer sizes come from the models and are recorded in the
    artifact, ``bridge_width`` is the only free choice. With ``decoder_lora_r`` > 0 the artifact also carries a
    decoder LoRA trained with the bridge; the base weights stay frozen and are checked by hash."""

    model_config = ConfigDict(extra="forbid")

    embedder: str = Field(default="minilm-l6", description="Frozen retriever embedder: named model or HF folder.")
    decoder: str = Field(default="smollm2-135m-instruct", description="Frozen decoder: named model or HF folder.")
    source: Literal["embedder", "decoder", "encoder"] = Field(
        default="embedder", description="What the bridge reads: the retriever embedder's vector of the passage "
        "(xRAG's choice); the frozen decoder's own hidden states of the passage at source_layer, mean-pooled "
        "over `rows` equal runs of its tokens (one vector per row); or the frozen soft encoder's memory slots "
        "(source_encoder: an icae artifact), rows / source_runs of them after each of source_runs equal runs of "
        "the passage's tokens (one slot per row; the bridge is then residual, starting as the identity).")
    source_encoder: str = Field(default="shipped", description="source=encoder: the icae artifact folder whose "
                                "encoder reads the passages ('shipped': the shipped one); it must be trained on "
                                "the same decoder, and the bridge records its hash.")
    source_runs: int = Field(default=1, ge=1, le=64, description="source=encoder: equal runs of the passage's "
                             "tokens, each read by the encoder on its own; rows must be a multiple of it.")
    source_finetune: bool = Field(default=False, description="source=encoder: the encoder's own trainable part "
                                  "(its LoRA, memory rows and slot projection) trains with the bridge, by the same "
                                  "loss, for these rows a passage (PISCO: the compressor is fine-tuned, not frozen); "
                                  "the artifact carries it and still refuses another base encoder.")
    source_layer: int = Field(default=15, ge=0, le=512, description="source=decoder: the hidden-state layer read "
                              "(0: the input embeddings; the decoder's layers are numbered from 1).")
    source_dtype: Literal["bfloat16", "float32"] = Field(default="bfloat16", description="source=decoder or "
                                                         "encoder: the dtype the passage is read in (as trained).")
    rows: int = Field(default=1, ge=1, le=64, description="Soft rows per passage (1: xRAG proper).")
    bridge_width: int = Field(default=1536, ge=8, le=16384, description="Hidden width of the two-layer bridge.")
    decoder_lora_r: int = Field(default=0, ge=0, le=1024, description="Rank of a decoder LoRA trained together "
                                "with the bridge (PISCO / COCOM: the decoder learns to read the rows; alpha 2r). "
                                "0: the decoder stays frozen. Every backend that reads the rows applies it.")
    decoder_lora_targets: str = Field(default="all-linear", description="decoder_lora_r > 0: peft target_modules, "
                                      "'all-linear' or a comma list of module names.")
    embed_batch_size: int = Field(default=64, ge=1, le=4096, description="Passages embedded per batch on a miss.")
    cache_dir: str | None = Field(default=None, description="Where each passage's rows are kept (index time, "
                                  "`ragpress index --method xrag`): a folder or an fsspec URL; None keeps none.")

    @model_validator(mode="after")
    def _check_runs(self) -> XRAGConfig:
        if self.source == "encoder" and self.rows % self.source_runs:
            raise ValueError(f"rows={self.rows} is not a multiple of source_runs={self.source_runs}: each run of "
                             "the passage gives rows / source_runs slots")
        if self.source_finetune and self.source != "encoder":
            raise ValueError(f"source_finetune=True fine-tunes the soft encoder, but source={self.source!r}: set "
                             "source='encoder' or leave source_finetune off")
        return self

    def input_key(self) -> dict:
        """What a passage's bridge input depends on besides the models' weights (and, for the encoder source,
        the encoder's hash, kept in the artifact)."""
        if self.source == "embedder":
            return {"source": "embedder"}
        if self.source == "encoder":
            return {"source": "encoder", "runs": self.source_runs, "slots": self.rows, "dtype": self.source_dtype,
                    **({"finetuned": True} if self.source_finetune else {})}
        return {"source": "decoder", "layer": self.source_layer, "pieces": self.rows, "dtype": self.source_dtype}


class XRAGTrainConfig(ContrastConfig, StagedTrainConfig):
    """Two-stage training of the bridge (and of the decoder LoRA, when ``XRAGConfig.decoder_lora_r`` > 0; the base
    weights and the embedder stay frozen), after Cheng et al. 2024.

    Stage 1 (paraphrase pretraining): from the one row the decoder regenerates the passage, NLL.
    Stage 2 (context-aware tuning): question + row -> answer, NLL + ``kl_weight`` x KL to the same decoder
    reading the passage as text. Learning rate: linear warm-up, then cosine to 10% within each stage."""

    # Defaults: about 2 epochs of the ~3.3k stage-1 passages and ~2.4 of the ~1.3k stage-2 records at batch 8.
    stage1_steps: int = Field(default=800, ge=0, le=10_000_000, description="Paraphrase pretraining steps.")
    stage2_steps: int = Field(default=400, ge=0, le=10_000_000, description="Context-aware tuning steps.")
    batch_size: int = Field(default=8, ge=1, le=4096, description="Examples per optimiser step.")
    stage1_lr: float = Field(default=1e-3, gt=0.0, le=1.0, description="Peak AdamW learning rate, stage 1.")
    stage2_lr: float = Field(default=2e-4, gt=0.0, le=1.0, description="Peak AdamW learning rate, stage 2.")
    kl_weight: float = Field(default=2.0, ge=0.0, le=100.0,
                             description="Weight of the self-distillation KL in stage 2 (xRAG uses 2.0).")
    stage2_targets: Literal["text", "distill"] = Field(
        default="text", description="Stage 2 targets: the gold answer + KL to the decoder reading the passages "
        "as text in the same prompt (text, xRAG), or the cached answers and top-K distributions of the frozen "
        "decoder reading the evidence passages (distill, compressor.distill; needs records with evidence).")
    distill_top_k: int = Field(default=32, ge=1, le=1024, description="distill: teacher tokens kept per position.")
    max_passage_tokens: int = Field(default=128, ge=4, le=4096,
                                    description="Stage 1 target: passage tokens regenerated (longer ones are cut).")
    # Measured here (2 shared cores with AMX, batch 4, CPU-seconds a step): stage 1 bf16 14.1 / fp32 11.0,
    # stage 2 bf16 15.9 / fp32 19.6: a tie overall, so bf16, the dtype the decoder is served in.
    precision: Literal["bf16", "fp32"] = Field(
        default="bf16", description="Decoder weights in bf16 (as at inference; bridge and losses stay fp32) or fp32.")
    seed: int = Field(default=0, description="Seed of data order, instruction choice and bridge init.")
