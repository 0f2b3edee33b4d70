"""``icae``: a LoRA-adapted copy of the decoder reads each passage and emits memory slots the frozen decoder
conditions on.

Paper: Ge et al. 2024, "In-context Autoencoder for Context Compression in a Large Language Model" (ICAE);
segment-wise summary accumulation after Chevalier et al. 2023 (AutoCompressors).

Encoder: the base model with a LoRA adapter. A passage (in the decoder's tokens) is split into segments of
at most ``segment_tokens``; after each segment of ``n`` tokens come ``k = ceil(n / ratio)`` learned memory
rows, and the last-layer hidden states at those positions, through a learned affine map ``slot_proj`` (fitted
at init so slots have the per-dimension mean and spread of the decoder's embedding rows), are the segment's
``k`` slots ``[k, hidden]``.
With ``accumulate`` the slots of earlier segments are prepended to the next segment's input.
Decoder: the same base model with the adapter switched off, so slots live in its input-embedding space.
Learned special rows: ``[AE]`` (regenerate the text the slots came from) and ``[LM]`` (continue it), used in
pretraining and by :meth:`ICAECompressor.reconstruct`; in QA the slots are spliced into the normal prompt.

Shapes: passage of ``n`` tokens -> ``CompressedPassage.embeds`` ``[rows_for(n), hidden]``, fp32; several
passages are compressed independently (so each can be cached), in input order, titles kept as text.

Trade-off: the ratio is fixed by training (default 4x); compression costs one encoder pass over the passage
(about one prefill of it), so the speed-up comes from compressing ahead of time: :class:`SlotCache` stores
slots keyed by (artifact id, passage sha256) and a hit never runs the encoder. Soft rows only work with the
base model they were trained for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._version import __version__
from ..artifacts import read_artifact, resolve_base_model, write_artifact
from ..base import Budget, CompressedPassage, Compressor, DecoderAdapter, Kept, Passage, TokenCounter
from ..cache import TensorCache
from ..errors import ArtifactError, ConfigError
from .config import FORMAT_VERSION, SHIPPED_ARTIFACT, ICAEConfig

__all__ = ["ICAEEncoder", "ICAECompressor", "SlotCache", "load_icae"]

_ROW_KEYS = ("memory", "ae_row", "lm_row", "slot_proj.weight", "slot_proj.bias")
_DEC = "decoder_lora."


def decoder_lora_kwargs(config: ICAEConfig) -> dict[str, Any]:
    """``peft.LoraConfig`` keyword arguments of the decoder-side adapter (``decoder_lora_r`` > 0)."""
    from ..decoder_lora import lora_kwargs

    return lora_kwargs(config.decoder_lora_r, config.lora_targets)


def _lora_config(config: ICAEConfig, decoder: bool = False) -> Any:
    from peft import LoraConfig

    kw = decoder_lora_kwargs(config)
    if not decoder:
        kw.update(r=config.lora_r, lora_alpha=config.lora_alpha)
    return LoraConfig(**kw)


class ICAEEncoder(nn.Module):
    """The trainable part: LoRA adapter (inside ``peft``), memory rows ``[max_slots, hidden]``, the [AE] and
    [LM] rows and ``slot_proj``. ``model`` (a HF causal LM) is frozen and wrapped in place; with the
    adapter disabled (:meth:`decoder`) it is the frozen decoder."""

    def __init__(self, model: Any, config: ICAEConfig, seed: int = 0) -> None:
        super().__init__()
        from peft import get_peft_model

        model.requires_grad_(False)
        self.config = config
        self.peft = get_peft_model(model, _lora_config(config))
        self.has_decoder_adapter = config.decoder_lora_r > 0
        if self.has_decoder_adapter:  # PISCO / COCOM: a second adapter, active only while decoding
            self.peft.add_adapter("decoder", _lora_config(config, decoder=True))
            self.peft.set_adapter("default")
        self._grad_parts = {"encoder": True, "decoder": True}
        emb = self.lm.get_input_embeddings()
        vocab, hidden = emb.weight.shape
        self.hidden = int(hidden)
        g = torch.Generator().manual_seed(seed)
        # Memory and special rows start as random rows of the embedding table (through the module, so an
        # input scaling such as Gemma's is included): in distribution for the frozen network from step 0.
        with torch.no_grad():
            init = emb(torch.randint(0, int(vocab), (config.max_slots + 2,), generator=g)).float()
        self.memory = nn.Parameter(init[: config.max_slots].clone())
        self.ae_row = nn.Parameter(init[-2].clone())
        self.lm_row = nn.Parameter(init[-1].clone())
        self.slot_proj = nn.Linear(self.hidden, self.hidden)  # fitted by calibrate_, then trained
        with torch.no_grad():
            self.slot_proj.weight.copy_(torch.eye(self.hidden))
            self.slot_proj.bias.zero_()

    @property
    def lm(self) -> Any:
        """The HF causal LM with LoRA layers injected (adapter state decides encoder vs decoder)."""
        return self.peft.base_model.model

    @contextmanager
    def decoder(self) -> Iterator[None]:
        """Context manager: inside it ``self.lm`` is the decoder that reads slots: the frozen base model, or
        the base with the decoder adapter when there is one."""
        if not self.has_decoder_adapter:
            with self.base():
                yield
            return
        self.peft.set_adapter("decoder")
        self._restore_grad()
        try:
            yield
        finally:
            self.peft.set_adapter("default")
            self._restore_grad()

    @contextmanager
    def base(self) -> Iterator[None]:
        """Context manager: inside it ``self.lm`` is the frozen base model (every adapter off): the
        distillation teacher reading text."""
        try:
            with self.peft.disable_adapter():
                yield
        finally:
            self._restore_grad()

    def set_trainable(self, encoder: bool, decoder: bool) -> None:
        """Which parts learn: the encoder (its LoRA, the memory and special rows, ``slot_proj``) and the
        decoder adapter. peft flips ``requires_grad`` when adapters switch; this choice is re-applied after
        every switch, so gradients reach both adapters of one step."""
        self._grad_parts = {"encoder": encoder, "decoder": decoder and self.has_decoder_adapter}
        self._restore_grad()

    def _restore_grad(self) -> None:
        for name, p in self.named_parameters():
            if ".lora_" in name:
                p.requires_grad_(self._grad_parts["decoder" if ".decoder." in name or name.endswith(".decoder")
                                                  else "encoder"])
            elif not name.startswith("peft."):
                p.requires_grad_(self._grad_parts["encoder"])

    def encode(self, segments: list[list[int]], prefixes: list[torch.Tensor | None] | None = None,
               slots: int | None = None) -> list[torch.Tensor]:
        """Slots ``[slots_for(len(seg)), hidden]`` (fp32) of each token segment, in one left-padded batch.
        ``prefixes[i]``: rows placed before segment i (earlier slots, for summary accumulation). ``slots``: read
        that many memory rows after every segment instead, whatever its length (the segment is then not held to
        ``segment_tokens``): the fixed-size summaries ``xrag`` reads with ``source="encoder"``."""
        lm = self.lm
        emb = lm.get_input_embeddings()
        dev, dt = emb.weight.device, emb.weight.dtype
        if slots is not None:
            if not 1 <= slots <= self.config.max_slots:
                raise ValueError(f"slots={slots}: this encoder has {self.config.max_slots} memory rows")
            ks = [slots] * len(segments)
        else:
            ks = [self.config.slots_for(len(s)) for s in segments]
            if any(len(s) > self.config.segment_tokens for s in segments):
                raise ValueError(f"a segment is longer than segment_tokens={self.config.segment_tokens}")
        seqs = []
        for i, seg in enumerate(segments):
            parts = []
            if prefixes is not None and prefixes[i] is not None and prefixes[i].shape[0]:
                parts.append(prefixes[i].to(device=dev, dtype=dt))
            parts.append(emb(torch.tensor(seg, dtype=torch.long, device=dev)))
            parts.append(self.memory[: ks[i]].to(dt))
            seqs.append(torch.cat(parts, 0))
        L = max(int(s.shape[0]) for s in seqs)
        x = torch.zeros(len(seqs), L, self.hidden, dtype=dt, device=dev)
        mask = torch.zeros(len(seqs), L, dtype=torch.long, device=dev)
        for b, s in enumerate(seqs):  # left padding: every sequence ends with its memory rows
            x[b, L - s.shape[0]:] = s
            mask[b, L - s.shape[0]:] = 1
        h = lm.base_model(inputs_embeds=x, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                          use_cache=False).last_hidden_state
        return [self.slot_proj(h[b, L - k:].float()) for b, k in enumerate(ks)]

    def encode_passages(self, token_lists: list[list[int]], batch_size: int = 16) -> list[torch.Tensor]:
        """Rows ``[rows_for(n), hidden]`` of each passage: its segments' slots, in order. Without accumulation
        all segments of all passages go through in batches of ``batch_size``; with it, segment j of every
        passage is encoded after segment j-1, with the earlier slots prepended."""
        cfg = self.config
        segs = [[ids[b:e] for b, e in cfg.segments_of(len(ids))] for ids in token_lists]
        out: list[list[torch.Tensor]] = [[] for _ in token_lists]
        if not cfg.accumulate:
            flat = [(p, s) for p, ss in enumerate(segs) for s in ss]
            for i in range(0, len(flat), batch_size):
                chunk = flat[i: i + batch_size]
                for (p, _), slots in zip(chunk, self.encode([s for _, s in chunk]), strict=True):
                    out[p].append(slots)
        else:
            for j in range(max((len(ss) for ss in segs), default=0)):
                live = [p for p, ss in enumerate(segs) if len(ss) > j]
                for i in range(0, len(live), batch_size):
                    chunk = live[i: i + batch_size]
                    prefixes = [torch.cat(out[p], 0) if out[p] else None for p in chunk]
                    for p, slots in zip(chunk, self.encode([segs[p][j] for p in chunk], prefixes), strict=True):
                        out[p].append(slots)
        return [torch.cat(o, 0) if o else torch.zeros(0, self.hidden) for o in out]

    @torch.no_grad()
    def calibrate_(self, token_lists: list[list[int]]) -> float:
        """Fit ``slot_proj`` (diagonal) so slots have the per-dimension mean and spread of the embedding rows of
        those tokens; return the mean slot norm before (for the record).

        Measured on SmolLM2: last-layer hidden states at memory positions are dominated by one shared vector
        (its norm is 90% of the row norm after a plain rescale; for embedding rows 28%), so a plain scalar
        leaves little room for content and autoencoding did not learn (loss 4.4 after 80 steps on 32-token
        segments); standardising per dimension removes the shared part."""
        self.slot_proj.weight.copy_(torch.eye(self.hidden))
        self.slot_proj.bias.zero_()
        emb = self.lm.get_input_embeddings()
        ids = torch.tensor([t for ids in token_lists for t in ids], dtype=torch.long, device=emb.weight.device)
        e = emb(ids).float()
        with self.base():  # the base model's own hidden states (LoRA B is zero at init anyway)
            h = torch.cat(self.encode_passages(token_lists), 0)
        scale = e.std(0) / h.std(0).clamp(min=1e-6)
        self.slot_proj.weight.copy_(torch.diag(scale))
        self.slot_proj.bias.copy_(e.mean(0) - scale * h.mean(0))
        return float(h.norm(dim=-1).mean())

    def trainable_tensors(self, parts: tuple[str, ...] = ("encoder", "decoder")) -> dict[str, torch.Tensor]:
        """Everything training changes, fp32 and contiguous: ``lora.<peft key>`` and the rows (``encoder``),
        ``decoder_lora.<peft key>`` (``decoder``, when there is a decoder adapter)."""
        from peft import get_peft_model_state_dict

        out: dict[str, torch.Tensor] = {}
        if "encoder" in parts:
            out.update({f"lora.{k}": v.detach().float().contiguous().cpu()
                        for k, v in get_peft_model_state_dict(self.peft).items()})
            for k in _ROW_KEYS:
                out[k] = self.get_parameter(k).detach().float().contiguous().cpu()
        if "decoder" in parts and self.has_decoder_adapter:
            out.update({f"{_DEC}{k}": v.detach().float().contiguous().cpu()
                        for k, v in get_peft_model_state_dict(self.peft, adapter_name="decoder").items()})
        return out

    def load_trainable(self, tensors: dict[str, Any], parts: tuple[str, ...] = ("encoder", "decoder")) -> None:
        """Inverse of :meth:`trainable_tensors` (numpy arrays or tensors); every key of ``parts`` must be
        present and no other."""
        from peft import set_peft_model_state_dict

        t = {k: torch.as_tensor(v.copy() if hasattr(v, "copy") else v) for k, v in tensors.items()}
        want = set(self.trainable_tensors(parts))
        if set(t) != want:
            raise ArtifactError(f"icae tensors differ from this LoRA shape (decoder_lora_r="
                                f"{self.config.decoder_lora_r}): missing {sorted(want - set(t))[:3]}, "
                                f"unexpected {sorted(set(t) - want)[:3]}")
        for prefix, adapter in (("lora.", "default"), (_DEC, "decoder")):
            lora = {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}
            if not lora:
                continue
            res = set_peft_model_state_dict(self.peft, lora, adapter_name=adapter)
            if getattr(res, "unexpected_keys", None):
                raise ArtifactError(f"LoRA tensors do not fit the base model: {res.unexpected_keys[:3]}")
        with torch.no_grad():
            for k in _ROW_KEYS if "encoder" in parts else ():
                p = self.get_parameter(k)
                if tuple(t[k].shape) != tuple(p.shape):
                    raise ArtifactError(f"{k} has shape {tuple(t[k].shape)}, expected {tuple(p.shape)}")
                p.copy_(t[k])

    def decoder_lora(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
        """The decoder adapter as (``peft.LoraConfig`` kwargs, peft state dict), or None without one."""
        if not self.has_decoder_adapter:
            return None
        t = self.trainable_tensors(("decoder",))
        return decoder_lora_kwargs(self.config), {k[len(_DEC):]: v for k, v in t.items()}


class SlotCache(TensorCache):
    """Slots on disk, one safetensors file per (artifact id, passage sha256): see :class:`TensorCache`."""

    def __init__(self, root: str | Path, artifact_id: str) -> None:
        super().__init__(root, artifact_id, tensor_name="slots")


class ICAECompressor(Compressor):
    """Soft compressor: memory slots per passage segment. Build with :meth:`from_pretrained` (a trained
    artifact) or from an :class:`ICAEEncoder` (training, tests)."""

    name = "icae"
    kind = "soft"

    def __init__(self, counter: TokenCounter, encoder: ICAEEncoder, tokenizer: Any,
                 manifest: dict[str, Any] | None = None, artifact_id: str = "unsaved") -> None:
        super().__init__(counter)
        self.encoder, self.tokenizer, self.manifest = encoder.eval(), tokenizer, manifest or {}
        self.config = encoder.config
        self.artifact_id = artifact_id
        self.cache = SlotCache(self.config.cache_dir, self._cache_id()) if self.config.cache_dir else None
        self.encoded_passages = 0

    @property
    def trained(self) -> bool:
        return bool(self.manifest.get("trained", False))

    def _cache_id(self) -> str:
        key = json.dumps([self.artifact_id, self.config.encoding_key()], sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:24]

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def passage_slots(self, texts: list[str]) -> list[torch.Tensor]:
        """Rows of each passage text: from the cache where present, the rest encoded now (and stored)."""
        memo = self._batch_rows or {}
        out: list[torch.Tensor | None] = [memo[t] if t in memo else self.cache.get(t) if self.cache else None
                                          for t in texts]
        miss = [i for i, o in enumerate(out) if o is None]
        if miss:
            fresh = self.encoder.encode_passages([self._tokens(texts[i]) for i in miss], self.config.encode_batch_size)
            self.encoded_passages += len(miss)
            for i, rows in zip(miss, fresh, strict=True):
                out[i] = rows
                if self.cache:
                    self.cache.put(texts[i], rows)
        return out  # type: ignore[return-value]

    def _index(self, passages: list[Passage]) -> tuple[int, int]:
        """Index time: each passage's memory slots into the slot cache, a batch at a time."""
        if self.cache is None:
            raise ConfigError("icae has no cache_dir: set cache_dir (the slot cache that compress reads) to index "
                              "passages")
        before, hits = self.encoded_passages, self.cache.hits
        step = max(1, self.config.encode_batch_size) * 8
        for i in range(0, len(passages), step):
            self.passage_slots([p.text for p in passages[i:i + step]])
        return self.encoded_passages - before, self.cache.hits - hits

    def decoder_adapter(self) -> DecoderAdapter | None:
        """The decoder LoRA this encoder was trained with (``decoder_lora_r`` > 0), or None: the frozen base
        reads the slots."""
        found = self.encoder.decoder_lora()
        if found is None:
            return None
        return DecoderAdapter(name=f"icae-{self.artifact_id[:12]}", lora=found[0], tensors=found[1])

    def caches(self) -> list[Any]:
        return [self.cache] if self.cache is not None else []

    def run_stats(self) -> dict[str, Any]:
        return {"trained": self.trained, "encoded_passages": self.encoded_passages,
                "slot_cache_hits": self.cache.hits if self.cache else None}

    _batch_rows: dict[str, torch.Tensor] | None = None

    def _compress_batch(self, items: list[tuple[str, list[Passage], Budget]]) -> list[Kept]:
        """Every passage of the batch that needs slots encoded together (``encode_batch_size`` at a time,
        repeats once), then each question assembled as :meth:`_compress` does."""
        texts = list(dict.fromkeys(p.text for _, ps, _ in items for p in ps
                                   if self.config.rows_for(n := len(self._tokens(p.text))) < n))
        try:
            self._batch_rows = dict(zip(texts, self.passage_slots(texts), strict=True)) if texts else {}
            return [self._compress(q, ps, b) for q, ps, b in items]
        finally:
            self._batch_rows = None

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> Kept:
        """Slots per passage, in order. A passage no longer than its slots would be (1 token) passes as text;
        the rest give every segment at least one slot, so a target the slots cannot reach is rounded up
        (``granularity``) or, with a strict budget, refused before any encoding."""
        n_in = [len(self._tokens(p.text)) for p in passages]
        n_out = [self.config.rows_for(n) for n in n_in]
        as_text = [k >= n for n, k in zip(n_in, n_out)]
        least = sum(min(n, k) for n, k in zip(n_in, n_out))
        self.check_strict(budget, sum(n_in), least, "passed through" if any(as_text) else "granularity")
        soft = [i for i, t in enumerate(as_text) if not t]
        rows = dict(zip(soft, self.passage_slots([passages[i].text for i in soft]), strict=True))
        out = [CompressedPassage(index=i, title=p.title, text=p.text, spans=[(0, len(p.text))], tokens_in=n_in[i],
                                 tokens_out=n_in[i]) if as_text[i] else
               CompressedPassage(index=i, title=p.title, embeds=rows[i], tokens_in=n_in[i], tokens_out=n_out[i])
               for i, p in enumerate(passages)]
        cap = budget.max_tokens(sum(n_in))
        over = cap is not None and least > cap
        why = ("passed_through" if any(as_text) else "granularity") if over else "budget"
        return Kept(out, stopped_by=why)

    @torch.no_grad()
    def reconstruct(self, text: str, max_new_tokens: int | None = None) -> str:
        """Autoencoding check: the frozen decoder regenerates ``text`` from its slots and the [AE] row,
        greedily, segment by segment; the pieces are joined."""
        enc = self.encoder
        ids = self._tokens(text)
        segs = [ids[b:e] for b, e in self.config.segments_of(len(ids))]
        pieces = []
        eos = self.tokenizer.eos_token_id
        for seg, slots in zip(segs, _per_segment(enc, segs, self.config), strict=True):
            x = torch.cat([slots, enc.ae_row[None].float()], 0)
            with enc.decoder():
                out = _greedy(enc.lm, x, max_new_tokens or len(seg) + 8, eos)
            pieces.append(self.tokenizer.decode(out, skip_special_tokens=True))
        return "".join(pieces)

    # -- artifact ---------------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path, trained: bool, training: dict[str, Any] | None = None,
                        scores: dict[str, Any] | None = None) -> Path:
        """Write the adapter and rows as a self-describing artifact. ``trained`` False marks a control."""
        from ..models import model_fingerprint, model_id

        cfg = {
            "type": "icae",
            "format_version": FORMAT_VERSION,
            "library_version": __version__,
            "trained": bool(trained),
            "base": {"id": model_id(self.config.base), "sha256": model_fingerprint(self.config.base),
                     "hidden_size": self.encoder.hidden},
            "config": self.config.model_dump(exclude={"base", "cache_dir", "encode_batch_size"}),
            "raw_slot_norm": self.manifest.get("raw_slot_norm"),
            "training": training if training is not None else self.manifest.get("training"),
            "scores": scores if scores is not None else self.manifest.get("scores"),
        }
        tensors = {k: v.numpy() for k, v in self.encoder.trainable_tensors().items()}
        self.manifest = cfg
        return write_artifact(directory, cfg, tensors, _card(cfg, tensors))

    @classmethod
    def from_pretrained(cls, directory: str | Path, counter: TokenCounter | None = None, base: str | None = None,
                        allow_untrained: bool = False, dtype: str = "bfloat16", **overrides: Any) -> ICAECompressor:
        """Load an encoder. ``base`` defaults to the named model it was trained on; a model with other weights
        (by sha256) is refused. An untrained control needs ``allow_untrained=True``."""
        from ..models import load_causal_lm

        cfg, t = read_artifact(directory, "icae", FORMAT_VERSION)
        if not cfg.get("trained") and not allow_untrained:
            raise ArtifactError(f"artifact {directory} holds an untrained encoder (a control, \"trained\": false); "
                                "load it explicitly (`--artifact PATH`, allow_untrained=True) or train one")
        name = resolve_base_model(cfg, "base", base, directory=directory)
        fixed = set(cfg["config"]) & set(overrides)
        if fixed:
            raise ConfigError(f"{sorted(fixed)} are fixed by the trained encoder; retrain to change them")
        config = ICAEConfig(**{**cfg["config"], **overrides, "base": name})
        model, tok = load_causal_lm(name, dtype=dtype)
        enc = ICAEEncoder(model, config)
        enc.load_trainable(t)
        h = hashlib.sha256()
        for k in sorted(t):
            h.update(k.encode())
            h.update(t[k].tobytes())
        return cls(counter or TokenCounter.from_tokenizer(tok), enc, tok, manifest=cfg, artifact_id=h.hexdigest()[:32])


def _per_segment(enc: ICAEEncoder, segs: list[list[int]], cfg: ICAEConfig) -> list[torch.Tensor]:
    """Slots of each segment of one passage (accumulating when configured)."""
    if not cfg.accumulate:
        return enc.encode(segs) if segs else []
    out: list[torch.Tensor] = []
    for s in segs:
        out += enc.encode([s], [torch.cat(out, 0) if out else None])
    return out


def _greedy(lm: Any, rows: torch.Tensor, max_new_tokens: int, eos: int | None) -> list[int]:
    """Greedy decoding from input rows ``[n, hidden]`` with a KV cache; stops at ``eos``."""
    emb = lm.get_input_embeddings()
    x = rows.to(dtype=emb.weight.dtype, device=emb.weight.device)[None]
    out = lm(inputs_embeds=x, use_cache=True)
    past, ids = out.past_key_values, []
    for _ in range(max_new_tokens):
        nxt = int(out.logits[0, -1].argmax())
        if eos is not None and nxt == eos:
            break
        ids.append(nxt)
        out = lm(input_ids=torch.tensor([[nxt]], device=x.device), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return ids


def load_icae(counter: TokenCounter, artifact: str | Path | None = None, decoder: str | None = None,
              **options: Any) -> ICAECompressor:
    """The shipped encoder (``artifact`` None; it must be trained) or an explicitly chosen artifact folder,
    which may be an untrained control. ``decoder`` is the base model (the decoder must be the base)."""
    if artifact is None:
        if not SHIPPED_ARTIFACT.is_dir():
            raise ArtifactError(f"no shipped icae encoder at {SHIPPED_ARTIFACT}; train one with `ragpress train icae "
                                "--out DIR` and pass `--artifact DIR`")
        return ICAECompressor.from_pretrained(SHIPPED_ARTIFACT, counter, base=decoder, **options)
    return ICAECompressor.from_pretrained(artifact, counter, base=decoder, allow_untrained=True, **options)


def _card(cfg: dict[str, Any], tensors: dict[str, Any]) -> str:
    c, tr = cfg["config"], cfg.get("training") or {}
    n = sum(int(v.size) for v in tensors.values())
    lines = [
        "# icae encoder" + ("" if cfg["trained"] else " (UNTRAINED CONTROL)"),
        "",
        "In-context autoencoder (Ge et al. 2024): a LoRA-adapted copy of the base model turns each segment of",
        f"{c['segment_tokens']} tokens into ceil(n / {c['ratio']:g}) memory slots; the base model with the adapter "
        "off is the decoder.",
        "",
        f"Base = decoder: `{cfg['base']['id']}` (sha256 `{cfg['base']['sha256']}`), hidden {cfg['base']['hidden_size']}.",
        ("Decoder: the base with its own LoRA adapter (r=" + str(c["decoder_lora_r"]) + ", trained with the encoder's "
         "slots; every backend that reads these slots applies it)." if c.get("decoder_lora_r") else
         "Decoder: the frozen base model."),
        f"LoRA r={c['lora_r']} alpha={c['lora_alpha']} on {c['lora_targets']}; accumulate={c['accumulate']}; "
        f"{n:,} trained parameters.",
        f"Trained: {'yes' if cfg['trained'] else 'no: random memory rows, zero LoRA, for use as a labelled control only'}.",
        "Training data: " + json.dumps(tr.get("data", "")),
        f"Steps: stage 1 {tr.get('stage1_steps_done', 0)}, stage 2 {tr.get('stage2_steps_done', 0)}"
        + ("" if tr.get("complete", True) else " (an incomplete run: resume it to finish the schedule)")
        + (f"; {tr['cpu_hours_steps']} CPU hours of optimisation steps" if "cpu_hours_steps" in tr else "") + ".",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in (cfg.get("scores") or {}).items() if not isinstance(v, (dict, list))]
    lines += ["", "Reproduce with `ragpress train icae`.", ""]
    return "\n".join(lines)
