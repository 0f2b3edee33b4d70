"""``sentinel``: sentence filtering by a trained probe on a proxy LLM's attention.

Paper: Zhang et al., 2025, "Sentinel: Attention Probing of Proxy Models for LLM Context Compression".
A proxy LLM (default SmolLM2-135M-Instruct) reads context + question once (optionally only its first
``layers`` layers); per sentence, the attention from the final prompt positions, pooled per (layer, head),
goes through a standardised logistic-regression probe; the best sentences within the token budget are
kept as text, in their original order.

Trade-off: text out, so any decoder can read it (unlike ``icae``/``xrag`` soft prompts); it is
query-aware and sees the whole context in one pass (unlike the sentence-at-a-time ``bm25``/``minilm``), at
the price of a proxy forward pass per question.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..artifacts import read_artifact, resolve_base_model, write_artifact
from ..base import Passage, TokenCounter
from ..errors import ArtifactError, ConfigError
from ..filters.base import Sentence, SentenceFilter
from .config import DEFAULT_LAYOUT, FORMAT_VERSION, FeatureLayout, SentinelConfig
from .rerank import RERANK_FEATURES, HopReranker, zscore

__all__ = ["SentinelProbe", "SentinelCompressor", "SHIPPED_ARTIFACT", "DEEP_ARTIFACT", "SHALLOW_ARTIFACT"]

# The default probe reads 2 proxy layers (since 2026-12-06: the same answers as 4 within noise on both decoders,
# about a third less compression time); the 4-layer probe stays as ``sentinel_l4``.
DEEP_ARTIFACT = Path(__file__).resolve().parents[1] / "artifacts" / "sentinel-smollm2-135m"
SHIPPED_ARTIFACT = DEEP_ARTIFACT.with_name("sentinel-smollm2-135m-l2")
# The 1-layer probe (``sentinel_l1``): the cheapest, where compression time matters most
# (docs/experiments/sentinel.md#cost).
SHALLOW_ARTIFACT = DEEP_ARTIFACT.with_name("sentinel-smollm2-135m-l1")
_KEYS = {"scaler_mean", "scaler_scale", "coef", "intercept"}


class SentinelProbe:
    """The classifier: ``score = ((x - mean) / scale) @ coef + intercept`` (a logistic regression's logit)."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, coef: np.ndarray, intercept: float) -> None:
        if not (mean.shape == scale.shape == coef.shape and mean.ndim == 1):
            raise ConfigError(f"probe tensors disagree: mean {mean.shape}, scale {scale.shape}, coef {coef.shape}")
        self.mean, self.scale, self.coef, self.intercept = mean, scale, coef, float(intercept)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.shape[-1] != self.coef.shape[0]:
            raise ConfigError(f"features have width {x.shape[-1]}, the probe expects {self.coef.shape[0]}")
        return ((x - self.mean) / self.scale) @ self.coef + self.intercept

    def tensors(self) -> dict[str, np.ndarray]:
        return {"scaler_mean": self.mean.astype(np.float32), "scaler_scale": self.scale.astype(np.float32),
                "coef": self.coef.astype(np.float32), "intercept": np.array([self.intercept], dtype=np.float32)}


class SentinelCompressor(SentenceFilter):
    name = "sentinel"
    config: SentinelConfig

    def __init__(self, counter: TokenCounter, config: SentinelConfig, probe: SentinelProbe, attention: Any,
                 layout: FeatureLayout = DEFAULT_LAYOUT, manifest: dict[str, Any] | None = None,
                 reranker: HopReranker | None = None) -> None:
        super().__init__(counter, config)
        width = layout.width(config.layers or attention.n_layers, attention.n_heads)
        if probe.coef.shape[0] != width:
            raise ConfigError(f"the probe has {probe.coef.shape[0]} weights but the feature layout "
                              f"{layout} at {config.layers or attention.n_layers} layers gives {width} columns")
        if layout.uses_embedder and getattr(attention, "embedder", None) != config.embedder:
            raise ConfigError(f"the attention reader embeds with {getattr(attention, 'embedder', None)!r} but the "
                              f"config names embedder={config.embedder!r}; build both with the same embedder")
        for field, attr in (("max_context_tokens", "max_context_tokens"), ("query_positions", "m")):
            if hasattr(attention, attr) and getattr(attention, attr) != getattr(config, field):
                raise ConfigError(f"the attention reader has {field}={getattr(attention, attr)} but the config "
                                  f"names {field}={getattr(config, field)}; build the reader with the config's value")
        self.probe, self.attention, self.layout, self.manifest = probe, attention, layout, manifest or {}
        self.reranker = reranker
        if config.cache_dir and hasattr(attention, "embed_cache_dir"):
            attention.embed_cache_dir = config.cache_dir

    def _index(self, passages: list[Passage]) -> tuple[int, int]:
        """Index time: each passage's sentence embeddings into ``cache_dir`` (split as :meth:`compress` splits
        them), so a question pays only for its own embedding and the proxy pass. A probe on a static embedder
        (``minilm-l6-static``) has nothing to store: ``(0, 0)``."""
        if not self.layout.uses_embedder:
            raise ConfigError(f"this sentinel probe's features ({self.layout}) use no sentence embeddings, so "
                              "there is nothing to index")
        if self.attention.embeds_by_lookup:
            return 0, 0  # a static embedder's vectors are a lookup: nothing to store ahead of time
        if not self.config.cache_dir:
            raise ConfigError("sentinel has no cache_dir: set cache_dir (the folder the embeddings go to, and that "
                              "compress reads) to index passages")
        return self.attention.index_sentences(passages, _spans_by_passage(passages, self.sentences(passages)))

    def caches(self) -> list[Any]:
        cache = getattr(self.attention, "embed_cache", None)
        return [cache] if cache is not None else []

    def score_sentences(self, query: str, passages: list[Passage], sentences: list[Sentence]) -> np.ndarray:
        return self.score_batch([(query, passages, sentences)])[0]

    def score_batch(self, items: list[tuple[str, list[Passage], list[Sentence]]]) -> list[np.ndarray]:
        """Several questions' sentences: their proxy windows (:meth:`AttentionReader.features_batch`) and,
        without a cache, their sentence embeddings in one call (only the screened share with ``embed_share`` < 1,
        :meth:`_screened`); then the probe and the second stage per question."""
        todo = [k for k, (_, _, sents) in enumerate(items) if sents]
        reqs = [(items[k][0], items[k][1], _spans_by_passage(items[k][1], items[k][2])) for k in todo]
        queries = [q for q, _, _ in reqs]
        docs = [self.attention.embed_docs(p, sp)[0] for _, p, sp in reqs] if reqs and self._screening() else None
        screen = self._screen_cos(queries, docs) if docs is not None else None
        feats = self.attention.features_batch(reqs, layers=self.config.layers, layout=self.layout,
                                              cos=screen) if reqs else []
        xs = [f.x.astype(np.float64) for f in feats]
        if screen is not None:
            xs = self._screened(queries, docs, xs, screen)
        out = [np.zeros(0) for _ in items]
        for k, x in zip(todo, xs, strict=True):
            query, passages, sentences = items[k]
            scores = self.probe(x)
            out[k] = scores if self.reranker is None else self.reranker(
                query, passages, [s.passage for s in sentences], [s.text for s in sentences], scores)
        return out

    # -- embedding a share of the sentences (embed_share < 1) ---------------------------------------------
    def _screening(self) -> bool:
        return (self.layout.uses_embedder and self.config.embed_share < 1.0 and self.attention.embed_cache is None
                and not self.attention.embeds_by_lookup)

    def _screen_cos(self, queries: list[str], docs: list[list[str]]) -> list[np.ndarray]:
        from ..embed import get_embedder

        screen = get_embedder(self.config.screen_embedder)
        return [screen.similarity(q, d) for q, d in zip(queries, docs, strict=True)]

    def _screened(self, queries: list[str], docs: list[list[str]], xs: list[np.ndarray],
                  screen: list[np.ndarray]) -> list[np.ndarray]:
        """``xs`` (features with the screen's cosines) with the embedder's cosines: exact for the share of
        sentences the probe ranks best on the screened features, mapped from the screen's for the others by a
        per-question least-squares line fit on the exact ones (used only with a positive slope, else their mean;
        clipped to at most the best exact cosine); ``embed_z`` recomputed over all."""
        import math

        from ..embed import get_embedder

        layers, heads = self.config.layers or self.attention.n_layers, self.attention.n_heads
        ci, zi = (self.layout.column(n, layers, heads) for n in ("embed_cos", "embed_z"))
        picks, texts = [], []
        for q, d, x, s in zip(queries, docs, xs, screen, strict=True):
            n = len(s)
            k = n if n <= 8 else max(8, math.ceil(self.config.embed_share * n))
            picks.append(np.sort(np.argsort(-self.probe(x), kind="stable")[:k]))
            texts += [q, *(d[i] for i in picks[-1])]
        v = get_embedder(self.config.embedder, self.attention.embedder_dtype).encode(texts)
        out, at = [], 0
        for x, s, pick in zip(xs, screen, picks, strict=True):
            exact = (v[at + 1:at + 1 + len(pick)] @ v[at]).numpy().astype(np.float64)
            at += 1 + len(pick)
            cos = np.full(len(s), exact.mean())
            if len(pick) < len(s) and np.ptp(s[pick]) > 1e-9:
                slope, icept = np.polyfit(s[pick], exact, 1)
                if slope > 0:  # fit on the best-ranked few: never inverted, never above the best exact cosine
                    cos = np.clip(slope * s + icept, -1.0, exact.max())
            cos[pick] = exact
            x = x.copy()
            if ci is not None:
                x[:, ci] = cos
            if zi is not None:
                x[:, zi] = zscore(cos[:, None])[:, 0]
            out.append(x)
        return out

    # -- artifact ---------------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | Path, training: dict[str, Any] | None = None,
                        scores: dict[str, Any] | None = None, card: str = "") -> Path:
        from ..models import model_fingerprint, model_id

        cfg = {
            "type": "sentinel",
            "format_version": FORMAT_VERSION,
            "library_version": __version__,
            "proxy": {"id": model_id(self.config.proxy), "sha256": model_fingerprint(self.config.proxy),
                      "num_layers": self.attention.n_layers, "num_heads": self.attention.n_heads},
            "config": self.config.model_dump(exclude={"proxy", "embedder", "cache_dir", "embed_share",
                                                       "screen_embedder"}),  # query-time choices, not the probe's
            "features": {"layers": self.config.layers or self.attention.n_layers, "heads": self.attention.n_heads,
                         "pooling": list(self.layout.pooling), "extra": list(self.layout.extra),
                         "query_positions": self.config.query_positions, "n_features": int(self.probe.coef.shape[0])},
            "training": training if training is not None else self.manifest.get("training"),
            "scores": scores if scores is not None else self.manifest.get("scores"),
        }
        tensors = self.probe.tensors()
        if self.reranker is not None:
            cfg["rerank"] = {"features": list(RERANK_FEATURES), "top_k": self.reranker.top_k}
            tensors.update({f"rerank.{k}": v for k, v in self.reranker.classifier.tensors().items()})
        if self.layout.uses_embedder:
            cfg["embedder"] = {"id": model_id(self.config.embedder), "sha256": model_fingerprint(self.config.embedder)}
        return write_artifact(directory, cfg, tensors, card or _card(cfg))

    @classmethod
    def from_pretrained(cls, directory: str | Path, counter: TokenCounter, proxy: str | None = None,
                        attention: Any = None, **overrides: Any) -> SentinelCompressor:
        """Load a probe. ``proxy`` defaults to the named model it was trained on; a proxy with other weights
        is refused. ``overrides`` change selection options (``default_ratio``, ...), not the features."""
        from .probe import AttentionReader

        cfg, t = read_artifact(directory, "sentinel", FORMAT_VERSION)
        reranker = _read_reranker(directory, cfg, t)
        proxy = resolve_base_model(cfg, "proxy", proxy, directory=directory)
        fixed = {"layers", "query_positions"}
        if fixed & overrides.keys():
            raise ConfigError(f"{sorted(fixed & overrides.keys())} are fixed by the trained probe; retrain to change them")
        try:
            layout = FeatureLayout.from_manifest(cfg["features"])
        except (KeyError, TypeError) as e:
            raise ArtifactError(f"artifact {directory}: compressor_config.json has no valid features.pooling / "
                                f"features.extra ({e}); re-save it with `ragpress train sentinel`") from e
        embedder = overrides.pop("embedder", None)
        if layout.uses_embedder:
            embedder = resolve_base_model(cfg, "embedder", embedder, directory=directory)
        embedder = embedder or SentinelConfig().embedder
        # The artifact's min_score is a mode to ask for (Budget.early_stop); a min_score given here asks for it.
        early = overrides.pop("early_stop", None)
        early = ("min_score" in overrides) if early is None else early
        config = SentinelConfig(**{**cfg["config"], **overrides, "proxy": proxy, "embedder": embedder,
                                   "early_stop": early})
        if attention is None:
            attention = AttentionReader.load(proxy, dtype=config.dtype, query_positions=config.query_positions,
                                             max_context_tokens=config.max_context_tokens, embedder=config.embedder,
                                             embed_cache_dir=config.cache_dir)
        return cls(counter, config, _probe_from(t), attention, layout=layout, manifest=cfg, reranker=reranker)


def _spans_by_passage(passages: list[Passage], sentences: list[Sentence]) -> list[list[tuple[int, int]]]:
    """Per passage, the ``[start, end)`` spans of its sentences, in order: what the attention reader takes."""
    spans: list[list[tuple[int, int]]] = [[] for _ in passages]
    for s in sentences:
        spans[s.passage].append((s.start, s.end))
    return spans


def _probe_from(t: dict[str, np.ndarray], prefix: str = "") -> SentinelProbe:
    return SentinelProbe(t[f"{prefix}scaler_mean"].astype(np.float64), t[f"{prefix}scaler_scale"].astype(np.float64),
                         t[f"{prefix}coef"].astype(np.float64), float(t[f"{prefix}intercept"][0]))


def _read_reranker(directory: str | Path, cfg: dict[str, Any], t: dict[str, np.ndarray]) -> HopReranker | None:
    """The second stage named by ``cfg["rerank"]`` (format 5), checking that the tensors match it."""
    spec = cfg.get("rerank")
    expected = _KEYS | ({f"rerank.{k}" for k in _KEYS} if spec is not None else set())
    missing, unexpected = sorted(expected - t.keys()), sorted(t.keys() - expected)
    if missing or unexpected:
        raise ArtifactError(f"artifact {directory}: missing tensors {missing}, unexpected tensors {unexpected} (the "
                            "manifest's `rerank` entry and the `rerank.*` tensors come together); re-save it with "
                            "`ragpress train sentinel`")
    if spec is None:
        return None
    top_k = spec.get("top_k") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or spec.get("features") != list(RERANK_FEATURES) or isinstance(top_k, bool) \
            or not isinstance(top_k, int) or top_k < 1:
        raise ArtifactError(f"artifact {directory}: rerank={spec!r} does not name this ragpress's second-stage "
                            f"features {list(RERANK_FEATURES)} with an integer rerank.top_k >= 1; retrain with "
                            "`ragpress train sentinel`")
    try:
        return HopReranker(_probe_from(t, "rerank."), top_k)
    except ConfigError as e:
        raise ArtifactError(f"artifact {directory}: the `rerank.*` tensors are inconsistent ({e}); retrain with "
                            "`ragpress train sentinel`") from None


def _card(cfg: dict[str, Any]) -> str:
    s = cfg.get("scores") or {}
    lines = [
        "# sentinel attention probe",
        "",
        f"Proxy: `{cfg['proxy']['id']}` (sha256 `{cfg['proxy']['sha256']}`), first {cfg['features']['layers']} of "
        f"{cfg['proxy']['num_layers']} layers, {cfg['features']['n_features']} features.",
        *([f"Embedder of the embed_* features: `{cfg['embedder']['id']}` (sha256 `{cfg['embedder']['sha256']}`)."]
          if cfg.get("embedder") else []),
        "Classifier: standardised features + logistic regression (scikit-learn), stored as tensors.",
        *([f"Second stage (`rerank.*` tensors): a logistic regression on {len(cfg['rerank']['features'])} features of "
           f"the first stage's scores (links from its top {cfg['rerank']['top_k']} sentences, expanded-query BM25, "
           "passage context); see compressor/sentinel/rerank.py."] if cfg.get("rerank") else []),
        "",
        "Training data: " + str((cfg.get("training") or {}).get("data", "")),
        "",
        "Validation scores (questions never trained on):",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in s.items() if not isinstance(v, (dict, list))]
    rr = s.get("rerank") if isinstance(s.get("rerank"), dict) else {}
    if rr.get("kept"):
        lines += ["", "The scores above are the first stage's. With the second stage (shipped):", ""]
        lines += [f"- {k}: {rr[k]}" for k in ("cv", "val") if k in rr]
    c = cfg.get("config") or {}
    lines += ["", f"Selection: min_score={c.get('min_score')}, complete_links={c.get('complete_links', False)} (see "
              "compressor/filters/base.py).", "", "Reproduce with `ragpress train sentinel`.", ""]
    return "\n".join(lines)
