"""``xrag``: a few soft rows per document, from a vector kept at index time, through a trained bridge.

Paper: Cheng et al. 2024, "xRAG: Extreme Context Compression for Retrieval-augmented Generation with One
Token". The bridge (:class:`~compressor.xrag.projector.Bridge`, a two-layer GELU MLP) maps each passage's
vector(s) to ``rows`` rows in the frozen decoder's input-embedding space, and the prompt builder splices them
where the passage text would be (titles stay text). What the bridge reads is recorded in the artifact
(``source``):

* ``embedder``: the retriever's vector (default MiniLM-L6, 384-d, unit norm), normally stored in a
  :class:`~compressor.retrieval.DocumentIndex`; one vector gives all ``rows`` rows (xRAG proper: 1).
* ``decoder``: the frozen decoder's own hidden states of the passage after ``source_layer``, mean-pooled over
  ``rows`` equal runs of its tokens (:class:`~compressor.xrag.features.DecoderSource`); one vector per row.
* ``encoder``: a trained soft encoder's (``icae``) memory slots, ``rows / source_runs`` after each of
  ``source_runs`` runs of the passage (:class:`~compressor.xrag.features.EncoderSource`); one slot per row,
  through a residual bridge. The artifact records the encoder's hash and refuses another. With
  ``source_finetune`` the encoder's trainable part is trained with the bridge and carried in the artifact.

Shapes: passages ``n`` -> inputs ``[n, m, in_dim]`` -> ``CompressedPassage.embeds`` ``[rows, hidden]`` each, in
input order; ``tokens_out`` = ``rows`` per passage, so the ratio is the passage length over ``rows``. With
``cache_dir`` the rows of each passage are kept (``ragpress index --method xrag``) and read back.

Trade-off: the most extreme ratios of all families and nearly free at query time once indexed, but lossy: a
few vectors cannot carry every detail, so exact-span answers suffer more than with the text filters
(``sentinel``, ``bm25``); it only works with the decoder (and embedder) the bridge was trained for, and the
budget cannot be tuned: it is ``rows`` rows per passage.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..artifacts import read_artifact, resolve_base_model, write_artifact
from ..base import Budget, CompressedPassage, Compressor, DecoderAdapter, Kept, Passage, TokenCounter
from ..cache import TensorCache
from ..errors import ArtifactError, ConfigError, InputError
from ..retrieval import DocumentIndex
from .config import FORMAT_VERSION, SHIPPED_ARTIFACT, XRAGConfig
from .projector import BRIDGE_KEYS, INPUT_KEYS, Bridge

__all__ = ["XRAGCompressor", "SHIPPED_ARTIFACT", "load_xrag", "DECODER_LORA", "ENCODER"]

DECODER_LORA = "decoder_lora."  # artifact tensor prefix of the decoder adapter (decoder_lora_r > 0), peft keys after it
ENCODER = "encoder."  # ... of the fine-tuned encoder's trainable tensors (source_finetune), icae's keys after it


class XRAGCompressor(Compressor):
    """Soft compressor: ``config.rows`` bridge rows per passage. Build with :meth:`from_pretrained` (a trained
    bridge) or directly from a :class:`Bridge` (training, tests). With ``source="embedder"``, ``index``
    (:attr:`doc_index`) supplies stored passage vectors and a passage missing from it is embedded on the fly (counted in
    :attr:`encoded_on_the_fly`); with ``source="decoder"`` the frozen decoder reads the passage
    (:class:`~compressor.xrag.features.DecoderSource`). With ``config.cache_dir`` each passage's rows are kept
    (index time: :meth:`index`) and read back instead of computed."""

    name = "xrag"
    kind = "soft"

    def __init__(self, counter: TokenCounter, config: XRAGConfig, bridge: Bridge, embedder: Any = None,
                 index: DocumentIndex | None = None, manifest: dict[str, Any] | None = None,
                 source: Any = None, adapter: dict[str, torch.Tensor] | None = None,
                 encoder_tensors: dict[str, torch.Tensor] | None = None) -> None:
        super().__init__(counter)
        self.config, self.bridge, self.manifest = config, bridge.eval(), dict(manifest or {})
        if bool(config.decoder_lora_r) != bool(adapter):
            raise ConfigError(f"decoder_lora_r={config.decoder_lora_r} needs a decoder adapter's tensors exactly when "
                              "it is above 0")
        self.adapter = adapter
        if config.source_finetune != bool(encoder_tensors):
            raise ConfigError(f"source_finetune={config.source_finetune} but {len(encoder_tensors or {})} fine-tuned "
                              "encoder tensors given: pass encoder_tensors exactly when source_finetune is on")
        self.encoder_tensors = encoder_tensors
        if encoder_tensors:  # the rows (and so the row cache) depend on the fine-tuned encoder too
            digest = _update_with(hashlib.sha256(), encoder_tensors).hexdigest()
            enc = dict(self.manifest.get("encoder") or {})
            if enc.get("finetuned_sha256") not in (None, digest):
                raise ArtifactError("the fine-tuned encoder tensors do not match their recorded sha256 "
                                    f"{enc['finetuned_sha256'][:12]}: the artifact is damaged, train it again")
            self.manifest["encoder"] = {**enc, "finetuned_sha256": digest}
        if config.rows % bridge.per_input or (config.source != "embedder" and bridge.per_input != 1):
            raise ConfigError(f"rows={config.rows} does not fit this bridge ({bridge.per_input} rows per input vector, "
                              f"source {config.source})")
        self._embedder = embedder
        self._source = source
        self.doc_index: DocumentIndex | None = None
        self.index_hits = 0
        self.encoded_on_the_fly = 0
        if index is not None:
            self.attach_index(index)
        self.cache = TensorCache(config.cache_dir, self._cache_id(), tensor_name="rows") if config.cache_dir else None

    def _cache_id(self) -> str:
        h = hashlib.sha256(json.dumps([self.config.input_key(), self.config.rows, self.manifest.get("decoder"),
                                       self.manifest.get("embedder"), self.manifest.get("encoder")], sort_keys=True,
                                      default=str).encode())
        return _update_with(h, self.bridge.tensors()).hexdigest()[:24]

    @property
    def trained(self) -> bool:
        return bool(self.manifest.get("trained", False))

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from ..embed import get_embedder

            self._embedder = get_embedder(self.config.embedder)
        return self._embedder

    @property
    def source(self) -> Any:
        """The decoder or encoder source (``source`` "decoder" / "encoder"), loaded on first use (an encoder
        other than the one the bridge was trained on is refused)."""
        if self._source is None and self.config.source == "encoder":
            from .features import load_encoder_source

            self._source = load_encoder_source(self.config, (self.manifest.get("encoder") or {}).get("sha256"),
                                               self.encoder_tensors)
        if self._source is None:
            from ..models import load_causal_lm
            from .features import DecoderSource

            model, tok = load_causal_lm(self.config.decoder, dtype=self.config.source_dtype)
            self._source = DecoderSource(model.eval(), tok, self.config.source_layer, self.config.rows,
                                         self.config.embed_batch_size)
        return self._source

    def run_stats(self) -> dict[str, Any]:
        return {"trained": self.trained, "index_hits": self.index_hits, "encoded_on_the_fly": self.encoded_on_the_fly,
                "row_cache_hits": self.cache.hits if self.cache else None}

    def caches(self) -> list[Any]:
        return [self.cache] if self.cache is not None else []

    def decoder_adapter(self) -> DecoderAdapter | None:
        """The decoder LoRA trained with the bridge (``decoder_lora_r`` > 0), or None: the frozen decoder reads
        the rows."""
        if self.adapter is None:
            return None
        from ..decoder_lora import lora_kwargs

        return DecoderAdapter(name=f"xrag-{self._cache_id()[:12]}", tensors=self.adapter,
                              lora=lora_kwargs(self.config.decoder_lora_r, self.config.decoder_lora_targets))

    def attach_index(self, index: DocumentIndex) -> None:
        """Read passage vectors from ``index``; it must come from the bridge's embedder."""
        if self.config.source != "embedder":
            return  # this bridge reads the decoder's hidden states, not the retriever's vectors
        want = self.manifest.get("embedder")
        if want:
            index.check_embedder(want)
        if index.dim != self.bridge.in_dim:
            raise InputError(f"index vectors are {index.dim}-d; the bridge reads {self.bridge.in_dim}-d")
        self.doc_index = index

    def passage_vectors(self, passages: list[Passage]) -> torch.Tensor:
        """``[n, in_dim]`` embedder vectors: stored ones from the index, the rest embedded now (in one batch)."""
        texts = [p.text for p in passages]
        if self.doc_index is not None:
            vecs, hits = self.doc_index.lookup(texts)
        else:
            vecs, hits = torch.zeros(len(texts), self.bridge.in_dim), [False] * len(texts)
        miss = [i for i, h in enumerate(hits) if not h]
        if miss:
            fresh = self.embedder.encode([texts[i] for i in miss], batch_size=self.config.embed_batch_size)
            if fresh.shape[-1] != self.bridge.in_dim:
                raise InputError(f"embedder gives {fresh.shape[-1]}-d vectors; the bridge reads {self.bridge.in_dim}-d")
            vecs[miss] = fresh.float()
        self.index_hits += len(texts) - len(miss)
        self.encoded_on_the_fly += len(miss)
        return vecs

    def passage_inputs(self, passages: list[Passage]) -> torch.Tensor:
        """The bridge's inputs ``[n, m, in_dim]``: one embedder vector (m = 1), or ``rows`` pooled decoder states
        or encoder slots."""
        if self.config.source == "embedder":
            return self.passage_vectors(passages)[:, None]
        self.encoded_on_the_fly += len(passages)
        return self.source.encode([p.text for p in passages])

    @torch.no_grad()
    def rows(self, vectors: torch.Tensor) -> torch.Tensor:
        """Bridge rows (fp32): ``[n, in_dim]`` vectors -> ``[n * rows, hidden]``; ``[n, m, in_dim]`` -> ``[n, rows,
        hidden]``."""
        if vectors.dim() == 2:
            return self.bridge.rows(vectors.float()[:, None]).reshape(-1, self.bridge.out_dim)
        return self.bridge.rows(vectors.float())

    def passage_rows(self, passages: list[Passage]) -> list[torch.Tensor]:
        """``[rows, hidden]`` per passage: from the row cache where present, the rest computed now (and stored)."""
        memo = self._batch_rows or {}
        out: list[torch.Tensor | None] = [memo.get(p.text) if p.text in memo else
                                          self.cache.get(p.text) if self.cache else None for p in passages]
        miss = [i for i, o in enumerate(out) if o is None]
        if miss:
            fresh = self.rows(self.passage_inputs([passages[i] for i in miss]))
            for i, r in zip(miss, fresh, strict=True):
                out[i] = r.clone()
                if self.cache is not None:
                    self.cache.put(passages[i].text, out[i])
        return out  # type: ignore[return-value]

    _batch_rows: dict[str, torch.Tensor] | None = None

    def _soft(self, n_in: int) -> bool:
        return n_in > self.config.rows  # a passage no longer than its rows passes as text

    def _compress_batch(self, items: list[tuple[str, list[Passage], Budget]]) -> list[Kept]:
        """The rows of every passage of the batch computed together (repeats once), then each question."""
        todo = list({p.text: p for _, ps, _ in items for p in ps if self._soft(self.counter.count(p.text))}.values())
        try:
            self._batch_rows = dict(zip((p.text for p in todo), self.passage_rows(todo), strict=True)) if todo else {}
            return [self._compress(q, ps, b) for q, ps, b in items]
        finally:
            self._batch_rows = None

    def _index(self, passages: list[Passage]) -> tuple[int, int]:
        """Index time: each passage's rows into the row cache, a batch at a time."""
        if self.cache is None:
            raise ConfigError("xrag has no cache_dir: set cache_dir (the row cache that compress reads) to index "
                              "passages")
        before, hits = self.encoded_on_the_fly + self.index_hits, self.cache.hits
        step = max(1, self.config.embed_batch_size) * 4
        todo = [p for p in passages if self._soft(self.counter.count(p.text))]
        for i in range(0, len(todo), step):
            self.passage_rows(todo[i:i + step])
        return self.encoded_on_the_fly + self.index_hits - before, self.cache.hits - hits

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> Kept:
        """``rows`` rows per passage; a passage no longer than that passes as text. A target under that is
        rounded up (``granularity``), or refused when the budget is strict."""
        k = self.config.rows
        n_in = [self.counter.count(p.text) for p in passages]
        as_text = [not self._soft(n) for n in n_in]
        least = sum(n if t else k for n, t in zip(n_in, as_text))
        self.check_strict(budget, sum(n_in), least, "granularity")
        soft = [i for i, t in enumerate(as_text) if not t]
        rows = self.passage_rows([passages[i] for i in soft]) if soft else []
        at = {i: j for j, i in enumerate(soft)}
        out = [CompressedPassage(index=i, title=p.title, text=p.text, spans=[(0, len(p.text))], tokens_in=n,
                                 tokens_out=n) if as_text[i] else
               CompressedPassage(index=i, title=p.title, embeds=rows[at[i]], tokens_in=n, tokens_out=k)
               for i, (p, n) in enumerate(zip(passages, n_in))]
        cap = budget.max_tokens(sum(n_in))
        over = cap is not None and least > cap
        why = ("passed_through" if any(as_text) else "granularity") if over else "budget"
        return Kept(out, stopped_by=why)

    # -- artifact ---------------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path, trained: bool, training: dict[str, Any] | None = None,
                        scores: dict[str, Any] | None = None, card: str = "") -> Path:
        """Write the bridge as a self-describing artifact. ``trained`` False marks a control (untrained
        bridge): it loads only when asked for explicitly."""
        from ..models import model_fingerprint, model_id

        cfg = {
            "type": "xrag",
            "format_version": FORMAT_VERSION,
            "library_version": __version__,
            "trained": bool(trained),
            "source": self.config.input_key(),
            "rows": self.config.rows,
            "decoder": {"id": model_id(self.config.decoder), "sha256": model_fingerprint(self.config.decoder),
                        "hidden_size": self.bridge.out_dim},
            "config": self.config.model_dump(exclude={"embedder", "decoder", "cache_dir"}),
            "bridge": {"in_dim": self.bridge.in_dim, "width": self.bridge.width, "out_dim": self.bridge.out_dim,
                       "per_input": self.bridge.per_input, "activation": "gelu", "residual": self.bridge.residual,
                       "target_norm": self.manifest.get("bridge", {}).get("target_norm")},
            "training": training if training is not None else self.manifest.get("training"),
            "scores": scores if scores is not None else self.manifest.get("scores"),
        }
        if self.config.source == "embedder":
            cfg["embedder"] = {"id": model_id(self.config.embedder), "sha256": model_fingerprint(self.config.embedder),
                               "dim": self.bridge.in_dim}
        if self.config.source == "encoder":
            enc = self.manifest.get("encoder") or {}
            cfg["encoder"] = {**enc, "sha256": enc.get("sha256") or self.source.artifact_id}
        tensors = {k: v.numpy() for k, v in self.bridge.tensors().items()}
        tensors.update({DECODER_LORA + k: v.numpy() for k, v in (self.adapter or {}).items()})
        tensors.update({ENCODER + k: v.numpy() for k, v in (self.encoder_tensors or {}).items()})
        self.manifest = cfg
        return write_artifact(directory, cfg, tensors, card or _card(cfg))

    @classmethod
    def from_pretrained(cls, directory: str | Path, counter: TokenCounter, decoder: str | None = None,
                        embedder: str | None = None, index: DocumentIndex | None = None,
                        allow_untrained: bool = False, **overrides: Any) -> XRAGCompressor:
        """Load a bridge. ``decoder``/``embedder`` default to the named models it was trained with; models
        with other weights (by sha256) are refused. An untrained control needs ``allow_untrained=True``."""
        cfg, t = read_artifact(directory, "xrag", FORMAT_VERSION)
        adapter, enc = _take(t, DECODER_LORA), _take(t, ENCODER)
        if bool(enc) != bool(cfg["config"].get("source_finetune", False)):
            raise ArtifactError(f"artifact {directory}: source_finetune={cfg['config'].get('source_finetune', False)} "
                                f"but {len(enc)} fine-tuned encoder tensors; the artifact is damaged, train it again")
        if not BRIDGE_KEYS <= t.keys() or not t.keys() <= BRIDGE_KEYS | INPUT_KEYS:
            raise ArtifactError(f"artifact {directory}: tensors {sorted(t)}, expected {sorted(BRIDGE_KEYS | INPUT_KEYS)}")
        if bool(adapter) != bool(cfg["config"].get("decoder_lora_r", 0)):
            raise ArtifactError(f"artifact {directory}: decoder_lora_r={cfg['config'].get('decoder_lora_r', 0)} but "
                                f"{len(adapter)} decoder adapter tensors; the artifact is damaged, train it again")
        if not cfg.get("trained") and not allow_untrained:
            raise ArtifactError(f"artifact {directory} holds an untrained bridge (a control, \"trained\": false); "
                                "load it explicitly (`--artifact PATH`, allow_untrained=True) or train one")
        roles = [("decoder", decoder)] + ([("embedder", embedder)] if "embedder" in cfg else [])
        chosen = {role: resolve_base_model(cfg, role, given, directory=directory) for role, given in roles}
        b = cfg["bridge"]
        per = int(b.get("per_input", 1))  # format 1: one row per MiniLM vector
        if tuple(t["fc1.weight"].shape) != (b["width"], b["in_dim"]) or \
                tuple(t["fc2.weight"].shape) != (b["out_dim"] * per, b["width"]):
            raise ArtifactError(f"artifact {directory}: bridge tensors do not match the recorded sizes {b}")
        fixed = {k: cfg["config"][k] for k in ("source", "source_layer", "source_dtype", "source_runs", "rows",
                                               "decoder_lora_r", "decoder_lora_targets") if k in cfg["config"]}
        fixed["source_finetune"] = cfg["config"].get("source_finetune", False)  # artifacts before it: off
        changed = sorted(k for k in fixed if k in overrides and overrides[k] != fixed[k])
        if changed:
            raise ConfigError(f"{changed[0]} is fixed by the trained bridge ({fixed[changed[0]]!r}); retrain to change it")
        config = XRAGConfig(**{**cfg["config"], **overrides, **chosen})
        if config.bridge_width != b["width"]:
            raise ConfigError("bridge_width is fixed by the trained bridge; retrain to change it")
        bridge = Bridge(b["in_dim"], b["width"], b["out_dim"], per, residual=bool(b.get("residual", False)))
        bridge.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in t.items()}, strict=False)
        return cls(counter, config, bridge, index=index, manifest=cfg, adapter=adapter or None,
                   encoder_tensors=enc or None)


def _update_with(h: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """``h`` (a hashlib object) updated with each tensor's name and bytes, in name order; returns ``h``."""
    for k, v in sorted(tensors.items()):
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    return h


def _take(tensors: dict[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    """The artifact tensors under ``prefix``, removed from ``tensors``, with the prefix cut off."""
    return {k[len(prefix):]: torch.from_numpy(tensors.pop(k).copy()) for k in list(tensors) if k.startswith(prefix)}


def load_xrag(counter: TokenCounter, artifact: str | Path | None = None, decoder: str | None = None,
              index: DocumentIndex | None = None, **options: Any) -> XRAGCompressor:
    """The shipped bridge (``artifact`` None; it must be trained) or an explicitly chosen artifact folder,
    which may be an untrained control."""
    if artifact is None:
        if not SHIPPED_ARTIFACT.is_dir():
            raise ArtifactError(f"no shipped xrag bridge at {SHIPPED_ARTIFACT}; train one with `ragpress train xrag "
                                "--out DIR` and pass `--artifact DIR`")
        return XRAGCompressor.from_pretrained(SHIPPED_ARTIFACT, counter, decoder=decoder, index=index, **options)
    return XRAGCompressor.from_pretrained(artifact, counter, decoder=decoder, index=index, allow_untrained=True,
                                          **options)


def _card(cfg: dict[str, Any]) -> str:
    tr = cfg.get("training") or {}
    lines = [
        "# xrag bridge" + ("" if cfg["trained"] else " (UNTRAINED CONTROL)"),
        "",
        f"{cfg.get('rows', 1)} soft row(s) per passage (after Cheng et al. 2024, xRAG): " + (
            "the frozen embedder's vector of the passage goes" if "embedder" in cfg else
            f"the {'fine-tuned' if cfg['config'].get('source_finetune') else 'frozen'} soft encoder's memory slots "
            f"(icae encoder sha256 `{cfg['encoder']['sha256']}`"
            + (f", fine-tuned with the bridge: its tensors here, sha256 `{cfg['encoder'].get('finetuned_sha256')}`"
               if cfg["config"].get("source_finetune") else "") + "), "
            f"{cfg['rows'] // cfg['source']['runs']} after each of {cfg['source']['runs']} equal runs of the "
            "passage's tokens, go" if cfg["source"]["source"] == "encoder" else
            f"the frozen decoder's hidden states of the passage after layer {cfg['source']['layer']}, mean-pooled "
            f"over {cfg['source']['pieces']} equal runs of its tokens, go"),
        "through a two-layer GELU MLP" + (" added to them (residual)" if cfg["bridge"].get("residual") else "")
        + " into the decoder's input-embedding space.",
        *([f"Decoder LoRA: r={cfg['config']['decoder_lora_r']} ({cfg['config'].get('decoder_lora_targets')}), trained "
           "with the bridge; every backend that reads these rows applies it. The base weights stay frozen."]
          if cfg["config"].get("decoder_lora_r") else ["The decoder stays frozen."]),
        "",
        *([f"Embedder: `{cfg['embedder']['id']}` (sha256 `{cfg['embedder']['sha256']}`), {cfg['embedder']['dim']}-d."]
          if "embedder" in cfg else []),
        f"Decoder: `{cfg['decoder']['id']}` (sha256 `{cfg['decoder']['sha256']}`), hidden {cfg['decoder']['hidden_size']}.",
        f"Bridge: {cfg['bridge']['in_dim']} -> {cfg['bridge']['width']} -> {cfg['bridge']['out_dim']}, GELU; "
        f"output norm calibrated to {cfg['bridge'].get('target_norm')}.",
        "",
        f"Trained: {'yes' if cfg['trained'] else 'no: calibrated random init, for use as a labelled control only'}.",
        "Training data: " + str(tr.get("data", "")),
        f"Steps: stage 1 {tr.get('stage1_steps_done', 0)}, stage 2 {tr.get('stage2_steps_done', 0)}.",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in (cfg.get("scores") or {}).items() if not isinstance(v, (dict, list))]
    lines += ["", "Reproduce with `ragpress train xrag`.", ""]
    return "\n".join(lines)
