"""``xrag``: one soft row per document, from the retriever's own embedding through a trained bridge.

Paper: Cheng et al. 2024, "xRAG: Extreme Context Compression for Retrieval-augmented Generation with One
Token". A frozen sentence embedder (default MiniLM-L6, 384-d) gives each passage one unit-norm vector,
normally stored in a :class:`~compressor.retrieval.DocumentIndex` at index time; the bridge
(:class:`~compressor.xrag.projector.Bridge`) maps it to one ``[1, hidden]`` row in the frozen decoder's
input-embedding space, and the prompt builder splices it where the passage text would be (titles stay text).

Shapes: passages ``n`` -> vectors ``[n, 384]`` -> ``CompressedPassage.embeds`` ``[1, hidden]`` each, in
input (retrieval) order; ``tokens_out`` = 1 per passage, so the ratio is the passage length in tokens.

Trade-off: the most extreme ratio of all families (a 150-token passage becomes 1 row) and nearly free at
query time (no decoder pass, no re-encoding of indexed passages), but lossy: one 384-d vector cannot carry
every detail, so exact-span answers suffer more than with the text filters (``sentinel``, ``bm25``) or
``icae``'s several rows; it only works with the decoder and embedder the bridge was trained for (soft rows,
unlike text, do not transfer), and the budget cannot be tuned: it is one row per passage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..artifacts import read_artifact, resolve_base_model, write_artifact
from ..base import Budget, CompressedPassage, Compressor, Kept, Passage, TokenCounter
from ..errors import ArtifactError, ConfigError, InputError
from ..retrieval import DocumentIndex
from .config import FORMAT_VERSION, SHIPPED_ARTIFACT, XRAGConfig
from .projector import BRIDGE_KEYS, Bridge

__all__ = ["XRAGCompressor", "SHIPPED_ARTIFACT", "load_xrag"]


class XRAGCompressor(Compressor):
    """Soft compressor: one bridge row per passage. Build with :meth:`from_pretrained` (a trained bridge)
    or directly from a :class:`Bridge` (training, tests). ``index`` supplies stored passage vectors; a
    passage missing from it is embedded on the fly and counted in :attr:`encoded_on_the_fly`."""

    name = "xrag"
    kind = "soft"

    def __init__(self, counter: TokenCounter, config: XRAGConfig, bridge: Bridge, embedder: Any = None,
                 index: DocumentIndex | None = None, manifest: dict[str, Any] | None = None) -> None:
        super().__init__(counter)
        self.config, self.bridge, self.manifest = config, bridge.eval(), manifest or {}
        self._embedder = embedder
        self.index: DocumentIndex | None = None
        self.index_hits = 0
        self.encoded_on_the_fly = 0
        if index is not None:
            self.attach_index(index)

    @property
    def trained(self) -> bool:
        return bool(self.manifest.get("trained", False))

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from ..embed import get_embedder

            self._embedder = get_embedder(self.config.embedder)
        return self._embedder

    def run_stats(self) -> dict[str, Any]:
        return {"trained": self.trained, "index_hits": self.index_hits, "encoded_on_the_fly": self.encoded_on_the_fly}

    def attach_index(self, index: DocumentIndex) -> None:
        """Read passage vectors from ``index``; it must come from the bridge's embedder."""
        want = self.manifest.get("embedder")
        if want:
            index.check_embedder(want)
        if index.dim != self.bridge.in_dim:
            raise InputError(f"index vectors are {index.dim}-d; the bridge reads {self.bridge.in_dim}-d")
        self.index = index

    def passage_vectors(self, passages: list[Passage]) -> torch.Tensor:
        """``[n, in_dim]`` vectors: stored ones from the index, the rest embedded now (in one batch)."""
        texts = [p.text for p in passages]
        if self.index is not None:
            vecs, hits = self.index.lookup(texts)
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

    @torch.no_grad()
    def rows(self, vectors: torch.Tensor) -> torch.Tensor:
        """Bridge rows ``[n, hidden]`` (fp32) for retriever vectors ``[n, in_dim]``."""
        return self.bridge(vectors.float())

    def _compress(self, query: str, passages: list[Passage], budget: Budget) -> Kept:
        """One row per passage; a passage of one token passes as text. A target under one row per passage is
        rounded up (``granularity``), or refused when the budget is strict."""
        n_in = [self.counter.count(p.text) for p in passages]
        as_text = [n <= 1 for n in n_in]
        self.check_strict(budget, sum(n_in), len(passages), "granularity")
        soft = [i for i, t in enumerate(as_text) if not t]
        rows = self.rows(self.passage_vectors([passages[i] for i in soft])) if soft else None
        at = {i: k for k, i in enumerate(soft)}
        out = [CompressedPassage(index=i, title=p.title, text=p.text, spans=[(0, len(p.text))], tokens_in=n,
                                 tokens_out=n) if as_text[i] else
               CompressedPassage(index=i, title=p.title, embeds=rows[at[i]: at[i] + 1].clone(), tokens_in=n,
                                 tokens_out=1)
               for i, (p, n) in enumerate(zip(passages, n_in))]
        cap = budget.max_tokens(sum(n_in))
        over = cap is not None and len(passages) > cap
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
            "embedder": {"id": model_id(self.config.embedder), "sha256": model_fingerprint(self.config.embedder),
                         "dim": self.bridge.in_dim},
            "decoder": {"id": model_id(self.config.decoder), "sha256": model_fingerprint(self.config.decoder),
                        "hidden_size": self.bridge.out_dim},
            "config": self.config.model_dump(exclude={"embedder", "decoder"}),
            "bridge": {"in_dim": self.bridge.in_dim, "width": self.bridge.width, "out_dim": self.bridge.out_dim,
                       "activation": "gelu", "target_norm": self.manifest.get("bridge", {}).get("target_norm")},
            "training": training if training is not None else self.manifest.get("training"),
            "scores": scores if scores is not None else self.manifest.get("scores"),
        }
        tensors = {k: v.numpy() for k, v in self.bridge.tensors().items()}
        self.manifest = cfg
        return write_artifact(directory, cfg, tensors, card or _card(cfg))

    @classmethod
    def from_pretrained(cls, directory: str | Path, counter: TokenCounter, decoder: str | None = None,
                        embedder: str | None = None, index: DocumentIndex | None = None,
                        allow_untrained: bool = False, **overrides: Any) -> XRAGCompressor:
        """Load a bridge. ``decoder``/``embedder`` default to the named models it was trained with; models
        with other weights (by sha256) are refused. An untrained control needs ``allow_untrained=True``."""
        cfg, t = read_artifact(directory, "xrag", FORMAT_VERSION, set(BRIDGE_KEYS))
        if not cfg.get("trained") and not allow_untrained:
            raise ArtifactError(f"artifact {directory} holds an untrained bridge (a control, \"trained\": false); "
                                "load it explicitly (`--artifact PATH`, allow_untrained=True) or train one")
        chosen = {role: resolve_base_model(cfg, role, given, directory=directory)
                  for role, given in (("decoder", decoder), ("embedder", embedder))}
        b = cfg["bridge"]
        if tuple(t["fc1.weight"].shape) != (b["width"], b["in_dim"]) or tuple(t["fc2.weight"].shape) != (b["out_dim"], b["width"]):
            raise ArtifactError(f"artifact {directory}: bridge tensors do not match the recorded sizes {b}")
        config = XRAGConfig(**{**cfg["config"], **overrides, **chosen})
        if config.bridge_width != b["width"]:
            raise ConfigError("bridge_width is fixed by the trained bridge; retrain to change it")
        bridge = Bridge(b["in_dim"], b["width"], b["out_dim"])
        bridge.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in t.items()}, strict=True)
        return cls(counter, config, bridge, index=index, manifest=cfg)


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
        "One soft row per passage (Cheng et al. 2024, xRAG): the frozen embedder's vector of the passage goes",
        "through a two-layer GELU MLP into the frozen decoder's input-embedding space.",
        "",
        f"Embedder: `{cfg['embedder']['id']}` (sha256 `{cfg['embedder']['sha256']}`), {cfg['embedder']['dim']}-d.",
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
