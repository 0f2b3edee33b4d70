"""Training the xRAG bridge from plain records (the CLI does the data loading).

Cheng et al. 2024 (xRAG) train only the projector, in two stages, with retriever and decoder frozen:

1. Paraphrase pretraining: the prompt holds one soft row (the passage's vector through the bridge) inside
   one of several instructions ("... can you restate it?"); the decoder must regenerate the passage text.
   NLL on the (truncated) passage tokens.
2. Context-aware tuning: the exact evaluation prompt (:class:`~compressor.prompt.PromptBuilder`, one row per
   passage) + question -> answer. NLL on the answer plus ``kl_weight`` x KL(teacher || student), where the
   teacher is the same decoder reading the passages as text in the same prompt (self-distillation).

Only the bridge has gradients: the decoder is ``requires_grad_(False)`` (it still back-propagates into its
inputs) and the bridge inputs (embedder vectors or the frozen decoder's pooled states) are computed once and
cached (with ``XRAGConfig.source_finetune`` the encoder's trainable part learns too, so its slots are read at
every step and the cached ones only standardise the bridge at the start). With ``XRAGConfig.decoder_lora_r`` > 0
a decoder LoRA (PISCO / COCOM) trains with the bridge; the
distillation teacher is read before it is injected, so the teacher stays the frozen decoder. Logits are computed
only at target positions. Data order and instruction choice are functions of (seed, stage, step), so ``resume``
continues exactly: the state (bridge, decoder LoRA, AdamW moments, step) is checkpointed every
``checkpoint_every`` steps as safetensors + JSON, never pickles.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..base import TokenCounter
from ..decoder_lora import attach_lora, load_lora_tensors, lora_tensors
from ..errors import InputError
from ..prompt import PromptBuilder
from ..retrieval import cached_index, text_key
from ..training import QARecord, Seq, StagedRun, qa_layouts
from ..training import seeded_batch as _batch
from ..training import target_logits as _target_logits
from .config import XRAGConfig, XRAGTrainConfig
from .model import DECODER_LORA, ENCODER, XRAGCompressor
from .projector import Bridge, embedding_row_norm

__all__ = ["QARecord", "PARAPHRASE_INSTRUCTIONS", "train_xrag"]

PARAPHRASE_INSTRUCTIONS = (
    "Background: {doc}\nRepeat the background text above.",
    "{doc}\nWrite out the text above again, word for word.",
    "Background: {doc} means the same as",
    "Here is a passage: {doc}\nCan you restate it in full?",
    "These two texts say the same thing:\n(1) {doc}\n(2)",
    "Read this document: {doc}\nNow reproduce the document.",
)
_MARK = "\x00XRAG_ROW\x00"
_CKPT_TYPE = "xrag-checkpoint"
BRIDGE = "bridge."


class _Layouts:
    """Token layouts of training sequences, in the decoder's tokenizer and the evaluation prompt style."""

    def __init__(self, tokenizer: Any, cfg: XRAGTrainConfig, hidden: int) -> None:
        self.tok, self.cfg, self.hidden = tokenizer, cfg, hidden
        self.builder = PromptBuilder(tokenizer)
        self.ph = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def _enc(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def paraphrase(self, text: str, instruction: str, rows: int = 1) -> Seq:
        body = instruction.format(doc=_MARK)
        if self.builder.style == "chat":
            rendered = self.tok.apply_chat_template([{"role": "user", "content": body}], tokenize=False,
                                                    add_generation_prompt=True)
            bos: list[int] = []
        else:
            rendered, bos = body + "\n", self.builder._bos()
        before, after = rendered.split(_MARK, 1)
        head = bos + self._enc(before)
        prompt = head + [self.ph] * rows + self._enc(after)
        target = self._enc(text)[: self.cfg.max_passage_tokens]
        return Seq(prompt + target, list(range(len(head), len(head) + rows)), len(prompt), len(target), [text])

    def qa(self, r: QARecord, rows: int = 1, target: Sequence[int] | None = None) -> tuple[Seq, Seq]:
        """(student with ``rows`` rows per passage, teacher reading the passages as text): same answer tokens."""
        return qa_layouts(self.builder, r, [rows] * len(r.passages), self.hidden, self.ph, self.cfg.max_answer_tokens,
                          target=target)


def _data_hash(texts: Sequence[str], qa: Sequence[QARecord]) -> str:
    """Identity of the training data, in order: resuming on other data would change every later batch."""
    h = hashlib.sha256()
    for t in texts:
        h.update(text_key(t).encode())
    for r in qa:
        h.update(json.dumps([r.question, r.answer, [text_key(p.text) for p in r.passages]]).encode())
    return h.hexdigest()


def _source_inputs(config: XRAGConfig, model: Any, tok: Any, passages: list[str], work: Path, train_dtype: str,
                   log: Callable[[str], None]) -> tuple[Callable[[Sequence[str]], torch.Tensor], int, dict[str, Any], Any]:
    """The bridge inputs of the training passages, computed once (and kept under ``work``): a lookup
    ``texts -> [n, m, in_dim]``, ``in_dim``, the source's identity for the checkpoint and the decoder source
    (None for the embedder), which the trained compressor keeps."""
    from ..cache import TensorCache
    from ..models import load_causal_lm, model_fingerprint

    t0 = time.perf_counter()
    if config.source == "embedder":
        index, _, built = cached_index("train", passages, config.embedder, root=work, batch_size=config.embed_batch_size)
        log(f"passage vectors: {len(index)} ({'embedded now' if built else 'cached'}, {time.perf_counter() - t0:.1f}s)")

        def lookup(texts: Sequence[str]) -> torch.Tensor:
            vecs, hits = index.lookup(list(texts))
            if not all(hits):  # cannot happen: every training passage was indexed above
                raise RuntimeError("a training passage is missing from the training index")
            return vecs[:, None]

        return lookup, index.dim, {"embedder_sha256": index.embedder["sha256"]}, None
    from .features import DecoderSource, load_encoder_source

    source: Any
    # source_finetune: the encoder as it starts, whose slots are cached here and standardise the bridge
    frozen = config.model_copy(update={"source_finetune": False})
    if config.source == "encoder":
        source = load_encoder_source(frozen)
        what = f"encoder {source.artifact_id[:12]} slots ({config.source_runs} runs, {config.rows} slots)"
    else:
        src_model = model if config.source_dtype == train_dtype else load_causal_lm(config.decoder,
                                                                                    dtype=config.source_dtype)[0]
        source = DecoderSource(src_model, tok, config.source_layer, config.rows, config.embed_batch_size)
        what = f"decoder states (layer {config.source_layer}, {config.rows} pieces)"
    key = [model_fingerprint(config.decoder), frozen.input_key()] + ([source.artifact_id] if config.source == "encoder" else [])
    ns = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]
    cache = TensorCache(work / "features", ns, tensor_name="inputs")
    got = {t: cache.get(t) for t in passages}
    miss = [t for t, v in got.items() if v is None]
    step = 256
    for i in range(0, len(miss), step):
        for t, v in zip(miss[i:i + step], source.encode(miss[i:i + step]), strict=True):
            cache.put(t, v)
            got[t] = v
    log(f"{what}: {len(passages)} passages, {len(miss)} computed now ({time.perf_counter() - t0:.1f}s)")

    def lookup(texts: Sequence[str]) -> torch.Tensor:
        return torch.stack([got[t] for t in texts])

    return lookup, source.dim, ({"encoder_sha256": source.artifact_id} if config.source == "encoder" else {}), source


def train_xrag(
    texts: Sequence[str],
    qa: Sequence[QARecord],
    work_dir: str | Path,
    config: XRAGConfig | None = None,
    train: XRAGTrainConfig | None = None,
    counter: TokenCounter | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    accept: Callable[[str, QARecord], bool] | None = None,
    teacher_cache: str | Path | None = None,
    val: Sequence[QARecord] = (),
    score: Callable[[str, QARecord], dict[str, float]] | None = None,
) -> tuple[XRAGCompressor, dict[str, Any]]:
    """Train (or resume) a bridge; return the compressor and a report. ``texts``: stage-1 passages;
    ``qa``: stage-2 records. ``work_dir`` keeps the bridge inputs of the training passages, ``checkpoint/``,
    ``train_log.jsonl`` (one line a step: stage, loss, nll, kl, lr, seconds; with the contrastive term also
    ``contrast`` and the gaps ``logp_gap`` / ``logp_gap_zeroed``) and, with ``val`` and ``score``, ``val_log.jsonl``
    (greedy answers of the validation records scored at every checkpoint: the learning curve, beside the controls
    ``other_*``, each record read with the next one's rows, and ``zeroed_*``, zeroed rows).
    With ``stage2_targets="distill"``, ``accept(answer, record)`` says whether a teacher answer may be a target
    and the targets are cached under ``teacher_cache`` (default ``work_dir/teacher``)."""
    from ..distill import contrast_loss, distill_loss, mean_logp, score_soft_answers, teacher_targets
    from ..models import load_causal_lm, model_fingerprint

    config, train = config or XRAGConfig(), train or XRAGTrainConfig()
    work = Path(work_dir)
    if train.stage1_steps and not texts:
        raise InputError("stage 1 needs passages (texts); pass some or set stage1_steps=0")
    if train.stage2_steps and not qa:
        raise InputError("stage 2 needs question records (qa); pass some or set stage2_steps=0")
    StagedRun(work, _CKPT_TYPE, train, {}, resume, "ragpress train xrag", log).check_fresh()

    dtype = "bfloat16" if train.precision == "bf16" else "float32"
    model, tok = load_causal_lm(config.decoder, dtype=dtype)
    model.requires_grad_(False)
    hidden = int(model.get_input_embeddings().weight.shape[1])
    counter = counter or TokenCounter.from_tokenizer(tok)
    passages = list(dict.fromkeys((list(texts) if train.stage1_steps else []) +
                                  [p.text for r in [*qa, *val] for p in r.passages]))
    if train.total_steps == 0:  # an untrained control only needs inputs to calibrate the output norm
        passages = passages[:512]
    inputs, in_dim, source_id, source = _source_inputs(config, model, tok, passages, work, dtype, log)

    torch.manual_seed(train.seed)
    k = config.rows
    bridge = Bridge(in_dim, config.bridge_width, hidden, per_input=k if config.source == "embedder" else 1,
                    residual=config.source == "encoder")
    sample = inputs(passages[: min(2048, len(passages))])
    if config.source != "embedder":
        bridge.standardise_(sample)
    target_norm = embedding_row_norm(model, seed=train.seed)
    if not bridge.residual:  # a residual bridge starts as the identity on rows the decoder already reads
        bridge.calibrate_(sample[:512].reshape(-1, in_dim), target_norm)
    identity = {"decoder_sha256": model_fingerprint(config.decoder), **source_id,
                "config": config.model_dump(exclude={"cache_dir"}), "train": train.resume_key(),
                "data_sha256": _data_hash(texts, qa)}
    run = StagedRun(work, _CKPT_TYPE, train, identity, resume, "ragpress train xrag", log)
    lay = _Layouts(tok, train, hidden)

    targets = None
    teacher_counts: dict[str, Any] = {}
    if train.stage2_steps and train.stage2_targets == "distill":  # the teacher is the frozen decoder: before any LoRA
        targets, teacher_counts = teacher_targets(
            model, lay.builder, qa, train.max_answer_tokens, train.distill_top_k,
            teacher_cache if teacher_cache is not None else work / "teacher",
            f"{identity['decoder_sha256'][:16]}-{lay.builder.style}", accept=accept, progress=progress, log=log)

    peft_model = None
    if config.decoder_lora_r:  # PISCO / COCOM: a decoder LoRA learns to read the rows, injected into ``model``
        peft_model = attach_lora(model, config.decoder_lora_r, config.decoder_lora_targets)
        if config.source == "decoder":
            source = None  # it shared ``model``; the compressor loads the frozen decoder again for its inputs

    def adapter_state() -> dict[str, torch.Tensor]:
        return lora_tensors(peft_model) if peft_model is not None else {}

    encoder = None
    if config.source_finetune:  # PISCO: the compressor itself learns, by the same loss as the bridge
        encoder = source.comp.encoder
        encoder.set_trainable(True, False)

    def restore(t: dict[str, Any]) -> None:
        bridge.load_state_dict({k_[len(BRIDGE):]: torch.from_numpy(v.copy()) for k_, v in t.items()
                                if k_.startswith(BRIDGE)})
        if peft_model is not None:
            load_lora_tensors(peft_model, {k_[len(DECODER_LORA):]: v for k_, v in t.items()
                                           if k_.startswith(DECODER_LORA)})
        if encoder is not None:
            encoder.load_trainable({k_[len(ENCODER):]: v for k_, v in t.items() if k_.startswith(ENCODER)}, ("encoder",))

    run.restore(restore)

    def encoder_state() -> dict[str, torch.Tensor]:
        return encoder.trainable_tensors(("encoder",)) if encoder is not None else {}

    def rows_of(seq_texts: Sequence[str], memo: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The rows of ``seq_texts``, concatenated; with a fine-tuned encoder its slots are read now (with
        autograd), each distinct passage once per ``memo``."""
        if encoder is None:
            return bridge.rows(inputs(seq_texts)).reshape(-1, hidden)
        memo = {} if memo is None else memo
        todo = [t for t in dict.fromkeys(seq_texts) if t not in memo]
        if todo:
            memo.update(zip(todo, bridge.rows(source.slots(todo)), strict=True))
        return torch.cat([memo[t] for t in seq_texts], 0)

    def step_fn(stage: int, i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        teach = mine = None
        memo: dict[str, torch.Tensor] = {}
        if stage == 1:
            idx = _batch(len(texts), train.batch_size, i, train.seed, 1)
            seqs = [lay.paraphrase(texts[j], random.Random(f"{train.seed}-1-{i}-{n}").choice(PARAPHRASE_INSTRUCTIONS), k)
                    for n, j in enumerate(idx)]
        else:
            idx = _batch(len(qa), train.batch_size, i, train.seed, 2)
            pairs = [lay.qa(qa[j], k, None if targets is None else targets[j].ids) for j in idx]
            seqs, teach = [p[0] for p in pairs], [p[1] for p in pairs]
            mine = None if targets is None else [targets[j] for j in idx]
        logits = _target_logits(model, seqs, lay.ph, rows_of([t for s in seqs for t in s.texts], memo))
        labels = torch.tensor([t for s in seqs for t in s.ids[s.n_prompt:]], device=logits.device)
        nll = torch.nn.functional.cross_entropy(logits, labels)
        kl = torch.zeros(())
        if mine is not None:
            kl = distill_loss(logits, mine, train.kl_temperature)
        elif teach is not None and train.kl_weight > 0:
            with torch.no_grad():
                t_logits = _target_logits(model, teach, lay.ph, None)
            T = train.kl_temperature
            kl = torch.nn.functional.kl_div(torch.log_softmax(logits / T, -1), torch.log_softmax(t_logits / T, -1),
                                            log_target=True, reduction="batchmean") * T * T
        loss = nll + (train.kl_weight * kl if stage == 2 else 0.0)
        extra: dict[str, Any] = {}
        if stage == 2 and train.contrast_weight > 0:
            n_t, negatives = [s.n_target for s in seqs], {}
            if train.contrast_negatives != "zeroed":  # batch_size >= 2 (the config checks it)
                # the same targets read with the next record's rows: the answer must be likelier under its own
                other = [seqs[(n + 1) % len(seqs)].texts or seqs[n].texts for n in range(len(seqs))]
                o_logits = _target_logits(model, seqs, lay.ph, rows_of(
                    [o[m % len(o)] for s, o in zip(seqs, other) for m in range(len(s.texts))], memo))
                negatives["other"] = mean_logp(o_logits, labels, n_t)
            if train.contrast_negatives != "other":
                # ... and likelier than with zeroed rows, a baseline training cannot move
                zero = torch.zeros(sum(len(s.rows) for s in seqs), hidden)
                with torch.no_grad():
                    z_logits = _target_logits(model, seqs, lay.ph, zero)
                negatives["zeroed"] = mean_logp(z_logits, labels, n_t)
            contrast, extra = contrast_loss(mean_logp(logits, labels, n_t), negatives, train.contrast_beta)
            loss = loss + train.contrast_weight * contrast
        return loss, {"nll": round(nll.item(), 5), "kl": round(kl.item(), 5), **extra,
                      "seq_len": max(len(s.ids) for s in seqs), "target_tokens": int(labels.numel())}

    val_log = work / "val_log.jsonl"
    zeroed: dict[str, Any] = {}

    @torch.no_grad()
    def validate(step: int) -> None:
        if not val or score is None:
            return
        bridge.eval()
        if encoder is not None:
            encoder.eval()
        row = {"step": step, **score_soft_answers(model, lay.builder, val, lambda r: rows_of([p.text for p in r.passages])
                                                  .split(k), score, train.max_answer_tokens, "xrag")}
        # The controls beside it: each question read with the rows of the next one's passages. Answer format
        # is learnt by both; only the gap between the two is information carried by the rows.
        nxt = {id(r): val[(n + 1) % len(val)] for n, r in enumerate(val)}
        other = score_soft_answers(model, lay.builder, val, lambda r: rows_of(
            [nxt[id(r)].passages[j % len(nxt[id(r)].passages)].text for j in range(len(r.passages))]).split(k),
            score, train.max_answer_tokens, "xrag")
        row.update({f"other_{key}": v for key, v in other.items() if key != "n"})
        # ... and with zeroed rows, the control no training term can make worse (a frozen decoder: scored once;
        # with a decoder LoRA at every checkpoint, since the adapter reads the zeroed rows too)
        if not zeroed or peft_model is not None:
            zeroed.update(score_soft_answers(model, lay.builder, val, lambda r: [torch.zeros(k, hidden)] * len(r.passages),
                                             score, train.max_answer_tokens, "xrag"))
        row.update({f"zeroed_{key}": v for key, v in zeroed.items() if key != "n"})
        bridge.train()
        if encoder is not None:
            encoder.train()
        with open(val_log, "a") as f:
            f.write(json.dumps(row) + "\n")
        log(f"validation at step {step}: {row}")

    bridge.train()
    if val and score is not None and run.step == 0:
        val_log.unlink(missing_ok=True)
        validate(0)
    params = [p for p in bridge.parameters() if p.requires_grad]
    if peft_model is not None:
        params += [p for p in peft_model.parameters() if p.requires_grad]
    if encoder is not None:
        encoder.train()
        params += [p for p in encoder.parameters() if p.requires_grad]
    report = run.run(params, step_fn,
                     lambda: {**{f"{BRIDGE}{k_}": v.numpy() for k_, v in bridge.tensors().items()},
                              **{f"{DECODER_LORA}{k_}": v.numpy() for k_, v in adapter_state().items()},
                              **{f"{ENCODER}{k_}": v.numpy() for k_, v in encoder_state().items()}},
                     {"target_norm": target_norm}, progress=progress, desc="xrag train", on_checkpoint=validate)
    if val_log.exists():
        report["validation"] = [json.loads(ln) for ln in val_log.read_text().splitlines() if ln.strip()]
    bridge.eval()
    manifest: dict[str, Any] = {"bridge": {"target_norm": round(target_norm, 5)}}
    if config.source == "encoder":
        manifest["encoder"] = {"sha256": source_id["encoder_sha256"], "trained_with": config.source_encoder}
    if encoder is not None:
        encoder.set_trainable(False, False)
        encoder.eval()
    comp = XRAGCompressor(counter, config, bridge, manifest=manifest, source=source, adapter=adapter_state() or None,
                          encoder_tensors=encoder_state() or None)
    report.update(n_stage1_passages=len(texts), n_stage2_records=len(qa), target_norm=round(target_norm, 5))
    if teacher_counts:
        report["distill_targets"] = teacher_counts
    return comp, report

