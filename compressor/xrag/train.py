"""Training the xRAG bridge from plain records (the CLI does the data loading).

Cheng et al. 2024 (xRAG) train only the projector, in two stages, with retriever and decoder frozen:

1. Paraphrase pretraining: the prompt holds one soft row (the passage's vector through the bridge) inside
   one of several instructions ("... can you restate it?"); the decoder must regenerate the passage text.
   NLL on the (truncated) passage tokens.
2. Context-aware tuning: the exact evaluation prompt (:class:`~compressor.prompt.PromptBuilder`, one row per
   passage) + question -> answer. NLL on the answer plus ``kl_weight`` x KL(teacher || student), where the
   teacher is the same decoder reading the passages as text in the same prompt (self-distillation).

Only the bridge has gradients: the decoder is ``requires_grad_(False)`` (it still back-propagates into its
inputs) and the embedder runs once, under ``inference_mode``, to fill a cached index of the passage vectors. Logits are computed only at target positions. Data order and instruction
choice are functions of (seed, stage, step), so ``resume`` continues exactly: the state (bridge, AdamW
moments, step) is checkpointed every ``checkpoint_every`` steps as safetensors + JSON, never pickles.
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
from ..training import QARecord, Seq, load_opt_state, qa_layouts, save_checkpoint, trim_log
from ..training import cosine_lr as _lr
from ..training import seeded_batch as _batch
from ..training import target_logits as _target_logits
from .config import XRAGConfig, XRAGTrainConfig
from .index import cached_index, text_key
from .model import XRAGCompressor
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
_CKPT_TYPE, _CKPT_VERSION = "xrag-checkpoint", 1


class _Layouts:
    """Token layouts of training sequences, in the decoder's tokenizer and the evaluation prompt style."""

    def __init__(self, tokenizer: Any, cfg: XRAGTrainConfig, hidden: int) -> None:
        self.tok, self.cfg, self.hidden = tokenizer, cfg, hidden
        self.builder = PromptBuilder(tokenizer)
        self.ph = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def _enc(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def paraphrase(self, text: str, instruction: str) -> Seq:
        body = instruction.format(doc=_MARK)
        if self.builder.style == "chat":
            rendered = self.tok.apply_chat_template([{"role": "user", "content": body}], tokenize=False,
                                                    add_generation_prompt=True)
            bos: list[int] = []
        else:
            rendered, bos = body + "\n", self.builder._bos()
        before, after = rendered.split(_MARK, 1)
        head = bos + self._enc(before)
        prompt = head + [self.ph] + self._enc(after)
        target = self._enc(text)[: self.cfg.max_passage_tokens]
        return Seq(prompt + target, [len(head)], len(prompt), len(target), [text])

    def qa(self, r: QARecord) -> tuple[Seq, Seq]:
        """(student with one row per passage, teacher reading the passages as text): same answer tokens."""
        return qa_layouts(self.builder, r, [1] * len(r.passages), self.hidden, self.ph, self.cfg.max_answer_tokens)


def _data_hash(texts: Sequence[str], qa: Sequence[QARecord]) -> str:
    """Identity of the training data, in order: resuming on other data would change every later batch."""
    h = hashlib.sha256()
    for t in texts:
        h.update(text_key(t).encode())
    for r in qa:
        h.update(json.dumps([r.question, r.answer, [text_key(p.text) for p in r.passages]]).encode())
    return h.hexdigest()


def _save_checkpoint(path: Path, bridge: Bridge, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    save_checkpoint(path, _CKPT_TYPE, _CKPT_VERSION, {f"bridge.{k}": v.numpy() for k, v in bridge.tensors().items()},
                    opt, state, "xrag training checkpoint (resume with `ragpress train xrag --resume`)\n")


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
) -> tuple[XRAGCompressor, dict[str, Any]]:
    """Train (or resume) a bridge; return the compressor and a report. ``texts``: stage-1 passages;
    ``qa``: stage-2 records. ``work_dir`` keeps the passage-vector cache, ``checkpoint/`` and
    ``train_log.jsonl`` (one line a step: stage, loss, nll, kl, lr, seconds)."""
    from ..models import load_causal_lm, model_fingerprint

    config, train = config or XRAGConfig(), train or XRAGTrainConfig()
    work = Path(work_dir)
    ckpt, log_path = work / "checkpoint", work / "train_log.jsonl"
    if train.stage1_steps and not texts:
        raise InputError("stage 1 needs passages (texts); pass some or set stage1_steps=0")
    if train.stage2_steps and not qa:
        raise InputError("stage 2 needs question records (qa); pass some or set stage2_steps=0")
    if (ckpt / "compressor_config.json").exists() and not resume:
        raise ConfigError(f"{ckpt} holds a checkpoint; pass --resume to continue it or choose another --work-dir")
    work.mkdir(parents=True, exist_ok=True)

    dtype = "bfloat16" if train.precision == "bf16" else "float32"
    model, tok = load_causal_lm(config.decoder, dtype=dtype)
    model.requires_grad_(False)
    hidden = int(model.get_input_embeddings().weight.shape[1])
    counter = counter or TokenCounter.from_tokenizer(tok)
    passages = list(dict.fromkeys(list(texts) + [p.text for r in qa for p in r.passages]))
    if train.total_steps == 0:  # an untrained control only needs vectors to calibrate the output norm
        passages = passages[:512]
    t0 = time.perf_counter()
    index, _, built = cached_index("train", passages, config.embedder, root=work, batch_size=config.embed_batch_size)
    log(f"passage vectors: {len(index)} ({'embedded now' if built else 'cached'}, {time.perf_counter() - t0:.1f}s)")

    torch.manual_seed(train.seed)
    bridge = Bridge(index.dim, config.bridge_width, hidden)
    target_norm = embedding_row_norm(model, seed=train.seed)
    bridge.calibrate_(index.vectors[: min(512, len(index))], target_norm)
    identity = {"decoder_sha256": model_fingerprint(config.decoder), "embedder_sha256": index.embedder["sha256"],
                "config": config.model_dump(), "train": train.resume_key(), "data_sha256": _data_hash(texts, qa)}
    step, t_ckpt = 0, None
    if resume and (ckpt / "compressor_config.json").exists():
        state, t_ckpt = read_artifact(ckpt, _CKPT_TYPE, _CKPT_VERSION)
        diff = sorted(k for k in identity if state.get("identity", {}).get(k) != identity[k])
        if diff:
            raise ConfigError(f"cannot resume {ckpt}: {diff} differ from the checkpoint; use the same settings and "
                              "data, or start a new --work-dir")
        bridge.load_state_dict({k[7:]: torch.from_numpy(v.copy()) for k, v in t_ckpt.items() if k.startswith("bridge.")})
        step = int(state["step"])
        log(f"resumed at step {step} of {train.total_steps}")
    elif resume:
        log(f"no checkpoint in {ckpt}: starting from step 0")
    trim_log(log_path, step)

    lay = _Layouts(tok, train, hidden)
    params = list(bridge.parameters())
    opt: torch.optim.Optimizer | None = None
    opt_stage = None
    history: dict[int, list[float]] = {1: [], 2: []}
    secs: dict[int, list[float]] = {1: [], 2: []}
    bar = tqdm(total=train.total_steps, initial=step, desc="xrag train", disable=not progress)
    bridge.train()
    while step < train.total_steps:
        stage = 1 if step < train.stage1_steps else 2
        i = step if stage == 1 else step - train.stage1_steps
        n_stage = train.stage1_steps if stage == 1 else train.stage2_steps
        if opt_stage != stage:  # a fresh AdamW per stage, restored from the checkpoint when resuming into it
            opt = torch.optim.AdamW(params, lr=0.0, weight_decay=train.weight_decay)
            if t_ckpt is not None and state.get("stage") == stage and state.get("adam_steps"):
                load_opt_state(opt, t_ckpt, state["adam_steps"])
            opt_stage = stage
        lr = _lr(i, n_stage, train.stage1_lr if stage == 1 else train.stage2_lr, train.warmup_fraction)
        for g in opt.param_groups:
            g["lr"] = lr
        ts, tc = time.perf_counter(), time.process_time()
        if stage == 1:
            idx = _batch(len(texts), train.batch_size, i, train.seed, 1)
            seqs = [lay.paraphrase(texts[j], random.Random(f"{train.seed}-1-{i}-{k}").choice(PARAPHRASE_INSTRUCTIONS))
                    for k, j in enumerate(idx)]
            teach = None
        else:
            idx = _batch(len(qa), train.batch_size, i, train.seed, 2)
            pairs = [lay.qa(qa[j]) for j in idx]
            seqs, teach = [p[0] for p in pairs], [p[1] for p in pairs]
        vecs, hits = index.lookup([t for s in seqs for t in s.texts])
        if not all(hits):  # cannot happen: every training passage was indexed above
            raise RuntimeError("a training passage is missing from the training index")
        logits = _target_logits(model, seqs, lay.ph, bridge(vecs))
        labels = torch.tensor([t for s in seqs for t in s.ids[s.n_prompt:]], device=logits.device)
        nll = torch.nn.functional.cross_entropy(logits, labels)
        kl = torch.zeros(())
        if teach is not None and train.kl_weight > 0:
            with torch.no_grad():
                t_logits = _target_logits(model, teach, lay.ph, None)
            T = train.kl_temperature
            kl = torch.nn.functional.kl_div(torch.log_softmax(logits / T, -1), torch.log_softmax(t_logits / T, -1),
                                            log_target=True, reduction="batchmean") * T * T
        loss = nll + (train.kl_weight * kl if teach is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
        opt.step()
        dt, cpu = time.perf_counter() - ts, time.process_time() - tc
        step += 1
        loss_v, nll_v, kl_v = float(loss.detach()), float(nll.detach()), float(kl.detach())
        history[stage].append(loss_v)
        secs[stage].append(dt)
        rec = {"step": step - 1, "stage": stage, "loss": round(loss_v, 5), "nll": round(nll_v, 5), "kl": round(kl_v, 5),
               "lr": lr, "s": round(dt, 3), "cpu_s": round(cpu, 3), "seq_len": max(len(s.ids) for s in seqs),
               "target_tokens": int(labels.numel())}
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        bar.update(1)
        bar.set_postfix(stage=stage, loss=f"{loss_v:.3f}")
        if step % train.checkpoint_every == 0 or step == train.total_steps:
            state = {"step": step, "stage": stage, "identity": identity, "target_norm": target_norm}
            _save_checkpoint(ckpt, bridge, opt, state)
            t_ckpt = None
    bar.close()
    bridge.eval()
    comp = XRAGCompressor(counter, config, bridge, manifest={"bridge": {"target_norm": round(target_norm, 5)}})
    report = {"stage1_steps_done": min(step, train.stage1_steps),
              "stage2_steps_done": max(0, step - train.stage1_steps), "train_config": train.model_dump(),
              "n_stage1_passages": len(texts), "n_stage2_records": len(qa), "target_norm": round(target_norm, 5),
              "log": str(log_path)}
    for s in (1, 2):
        h = history[s]
        if h:
            k = max(1, len(h) // 10)
            report[f"stage{s}_loss_first"] = round(sum(h[:k]) / k, 4)
            report[f"stage{s}_loss_last"] = round(sum(h[-k:]) / k, 4)
            report[f"stage{s}_s_per_step_median"] = round(statistics.median(secs[s]), 3)
    return comp, report
