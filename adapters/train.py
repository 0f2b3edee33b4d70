"""``ragpress train`` as library calls: the shared data folder in, a self-describing artifact folder out.

The families' trainers (``compressor/<family>/train.py``) take plain records; this module reads the records from
``../shared/data`` (:mod:`adapters.training_data`, held-out questions excluded), runs the trainer and writes the
artifact with the training data and report recorded in its config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SentinelTraining", "SoftData", "train_sentinel_artifact", "train_soft"]


class SoftData(BaseModel):
    """Which records a soft family trains on (see :func:`adapters.training_data.xrag_records`)."""

    model_config = ConfigDict(extra="forbid")

    data: Path = Field(default=Path("../shared/data"), description="The shared data folder.")
    distractors: int = Field(default=0, ge=0, le=50, description="Stage 2: K BM25 passages around each NQ gold one "
                             "(with multi_passage: the most, k drawn from 0..K per question).")
    multi_passage: bool = Field(default=False, description="Stage 2 on contexts shaped like the benchmark's: NQ and "
                                "SQuAD with 0..K distractors, HotpotQA with its 10 paragraphs, order shuffled, gold "
                                "passages marked for the distillation teacher (adapters.training_data.distill_records).")
    n_hotpot: int | None = Field(default=200, ge=0, description="multi_passage: HotpotQA training questions at most.")
    n_val: int = Field(default=50, ge=0, le=400, description="NQ validation questions (held out, not the "
                       "benchmark's) answered at every checkpoint: the learning curve in val_log.jsonl; past 100 the "
                       "last NQ training questions are kept back for it (adapters.training_data.val_tail).")
    teacher_cache: Path | None = Field(default=None, description="Where distillation targets are cached (default: "
                                       "<work dir>/teacher); reused by any run on the same base model and prompts.")
    n_stage1: int | None = Field(default=None, ge=0, description="Use at most this many stage-1 passages.")
    n_nq: int | None = Field(default=None, ge=0, description="Use at most this many NQ training questions.")
    n_squad: int | None = Field(default=None, ge=0, description="Use at most this many SQuAD training questions.")
    squad_train: Path | None = Field(default=None, description="A SQuAD-format train file whose answerable questions "
                                     "join stage 2 (training/data/squad_v2_train_first10articles.json.gz: 4,371 "
                                     "questions of SQuAD v2 train, provenance in training/data/README.md).")
    n_squad_train: int | None = Field(default=None, ge=0, description="Use at most this many of --squad-train's "
                                      "questions.")

    def more_questions(self) -> dict[str, Any]:
        """The ``--squad-train`` keywords of the record builders (:mod:`adapters.training_data`)."""
        return {"squad_train_file": self.squad_train, "n_squad_train": self.n_squad_train}


def train_soft(family: str, config: Any, train: Any, data: SoftData, out: str | Path, work_dir: str | Path | None = None,
               resume: bool = False) -> tuple[Path, dict[str, Any]]:
    """Train ``family`` (``icae``, ``xrag``, or ``text-lora``: :func:`train_text_lora_artifact`) with its ``config`` and ``train`` settings, resumably in
    ``work_dir`` (default ``runs/<family>-train/<out name>``); write the artifact to ``out``. A run of zero
    steps writes an untrained control (``"trained": false``). Returns (artifact folder, training report)."""
    from .metrics import accuracy, f1_score
    from .training_data import distill_records, distill_val_records, xrag_records

    if family == "text-lora":
        return train_text_lora_artifact(config, train.model_copy(update={"stage1_steps": 0}),
                                        data.model_copy(update={"multi_passage": config.records == "icae"}), out,
                                        work_dir, resume)
    if family == "icae":
        from compressor.icae.train import train_icae as trainer
    elif family == "xrag":
        from compressor.xrag.train import train_xrag as trainer
    else:
        raise ValueError(f"train_soft trains icae or xrag, not {family!r}")
    extra: dict[str, Any] = {
        "accept": lambda text, r: accuracy(text, r.answers or (r.answer,)) > 0, "teacher_cache": data.teacher_cache,
        "score": lambda text, r: {"accuracy": accuracy(text, r.answers), "f1": f1_score(text, r.answers)}}
    out = Path(out)
    n_val = data.n_val if data.multi_passage or family == "xrag" else 0
    more = data.more_questions()
    texts, qa, provenance = xrag_records(data.data, data.n_stage1, data.n_nq, data.n_squad,
                                         0 if data.multi_passage else data.distractors, seed=train.seed, n_val=n_val,
                                         **more)
    if data.multi_passage:
        qa, multi = distill_records(data.data, data.distractors or 9, data.n_nq, data.n_squad, data.n_hotpot,
                                    seed=train.seed, n_val=n_val, **more)
        provenance = {**provenance, **multi}
    if n_val:
        extra["val"], provenance["validation"] = distill_val_records(
            data.data, n_val, distractors=(data.distractors or 9) if data.multi_passage else data.distractors,
            seed=train.seed)
    work = Path(work_dir) if work_dir else Path("runs") / f"{family}-train" / out.name
    comp, report = trainer(texts, qa, work, config, train, resume=resume, **extra)
    trained = report["stage1_steps_done"] + report["stage2_steps_done"] > 0
    path = comp.save_pretrained(out, trained=trained,
                                training={"data": provenance, **{k: v for k, v in report.items() if k != "log"}})
    return Path(path), report


class TextLoRA(BaseModel):
    """The fine-tuned uncompressed baseline (``ragpress train text-lora``): a decoder LoRA trained on the
    multi-passage records read as text, with the distillation targets of ``icae``."""

    model_config = ConfigDict(extra="forbid")

    base: str = Field(default="smollm2-135m-instruct", description="The decoder: named model or HF folder.")
    decoder_lora_r: int = Field(default=8, ge=1, le=1024, description="LoRA rank (alpha 2r), as icae's decoder "
                                "adapter.")
    lora_targets: str = Field(default="all-linear", description="peft target_modules: 'all-linear' or a comma list.")
    records: Literal["icae", "xrag"] = Field(default="icae", description="Whose training records it reads: icae's "
                                             "multi-passage ones, or xrag's (each question with its gold passage).")


def train_text_lora_artifact(cfg: TextLoRA, train: Any, data: SoftData, out: str | Path,
                             work_dir: str | Path | None = None, resume: bool = False) -> tuple[Path, dict[str, Any]]:
    """Train the text baseline on the records ``cfg.records`` trains on (icae's: ``data.multi_passage`` is
    implied) and write its ``decoder-lora`` artifact to ``out``. Returns (artifact folder, report)."""
    from compressor.decoder_lora import save_decoder_adapter, train_text_lora

    from .metrics import accuracy
    from .training_data import distill_records, xrag_records

    if cfg.records == "xrag":  # the soft run's training records, with the same questions kept back for validation
        _, qa, provenance = xrag_records(data.data, 0, data.n_nq, data.n_squad, data.distractors, seed=train.seed,
                                         n_val=data.n_val, **data.more_questions())
    else:
        qa, provenance = distill_records(data.data, data.distractors or 9, data.n_nq, data.n_squad, data.n_hotpot,
                                         seed=train.seed, n_val=data.n_val, **data.more_questions())
    work = Path(work_dir) if work_dir else Path("runs") / "text-lora-train" / Path(out).name
    tensors, report = train_text_lora(qa, work, cfg.base, train, r=cfg.decoder_lora_r, targets=cfg.lora_targets,
                                      resume=resume, teacher_cache=data.teacher_cache,
                                      accept=lambda text, r: accuracy(text, r.answers or (r.answer,)) > 0)
    path = save_decoder_adapter(out, cfg.base, tensors, cfg.decoder_lora_r, cfg.lora_targets,
                                {"data": provenance, **{k: v for k, v in report.items() if k != "log"}})
    return Path(path), report


class SentinelTraining(BaseModel):
    """How the attention probe is trained (``ragpress train sentinel``); the defaults plus ``layers=4``,
    ``min_score=1.5`` and ``complete_links`` reproduce the shipped artifact."""

    model_config = ConfigDict(extra="forbid")

    data: Path = Field(default=Path("../shared/data"), description="The shared data folder.")
    proxy: str = Field(default="smollm2-135m-instruct", description="The proxy LLM whose attention is read.")
    embedder: str = Field(default="minilm-l6", description="Sentence embedder of the embed_* features.")
    hotpotqa: int = Field(default=200, ge=0, description="HotpotQA training questions.")
    nq: int = Field(default=150, ge=0, description="NQ training questions.")
    squad: int = Field(default=150, ge=0, description="SQuAD training questions.")
    seed: int = 0
    features_cache: Path | None = Field(default=None, description="npz cache of extracted features (reused if present).")
    layers: int | None = Field(default=None, ge=1, description="Force the early-exit depth (default: chosen by "
                               "cross-validation).")
    min_score: float | None = Field(default=None, description="Probe score below which sentences are dropped even "
                                    "when the budget has room (chosen with research/choose_min_score.py; default: "
                                    "fill the budget).")
    rerank: Literal["auto", "yes", "no"] = Field(default="auto", description="Second stage (multi-hop re-scoring): "
                                                 "auto keeps it when its cross-validated recall@20% beats the probe.")
    complete_links: bool = Field(default=False, description="Store complete_links=True: a kept sentence naming "
                                 "another passage's title brings that passage's best sentence.")


def train_sentinel_artifact(out: str | Path, t: SentinelTraining) -> tuple[Path, dict[str, Any]]:
    """Train the attention probe on the training questions and write its artifact to ``out``."""
    from compressor.base import TokenCounter
    from compressor.models import load_tokenizer
    from compressor.sentinel.train import train_sentinel

    from .training_data import sentinel_records

    records, provenance = sentinel_records(t.data, t.hotpotqa, t.nq, t.squad, seed=t.seed)
    counter = TokenCounter.from_tokenizer(load_tokenizer(t.proxy))
    comp, report = train_sentinel(records, counter, proxy=t.proxy, embedder=t.embedder, seed=t.seed,
                                  features_cache=t.features_cache, layers=t.layers, min_score=t.min_score,
                                  rerank={"auto": None, "yes": True, "no": False}[t.rerank],
                                  complete_links=t.complete_links)
    training = {"data": provenance, **{k: v for k, v in report.items()
                                       if k not in ("chosen", "grid", "layout_ablation", "rerank")}}
    if t.min_score is not None:
        training["min_score"] = (f"{t.min_score:g}: best mean answer F1 (SmolLM2-135M and Gemma 3 270M, ratio 5) "
                                 "on the validation questions, by research/choose_min_score.py")
    if t.complete_links:
        training["complete_links"] = ("on: paired answer F1 on the HotpotQA training questions scored out of fold, "
                                      "by research/link_completion.py (see docs/experiments/sentinel.md)")
    scores = {**report["chosen"], "rerank": report["rerank"], "layout_ablation": report["layout_ablation"],
              "grid": report["grid"]}
    return Path(comp.save_pretrained(out, training=training, scores=scores)), report
