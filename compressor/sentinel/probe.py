"""Attention features from a proxy LLM, with memory linear in context length.

Sentinel (Zhang et al., 2025, "Sentinel: Attention Probing of Proxy Models for LLM Context Compression")
reads how much a small proxy LLM's final prompt positions attend to each context sentence while it reads
``context + question``, and feeds those per-(layer, head) attention scores to a light classifier.

How the attention rows are obtained, on any architecture that dispatches through transformers'
``AttentionInterface`` (Llama, Gemma 3, Qwen 2/3, Mistral, ...), without patching a model class: the proxy
is loaded with a registered attention function ``ragpress_probe`` that runs the normal SDPA kernel and, only
while a capture is active, computes ``softmax(q_last @ k^T * scaling + mask)`` for the last
``query_positions`` queries: ``[heads, m, L]`` per layer, never the ``[heads, L, L]`` map. Queries and keys
arrive after RoPE and any q/k norms, exactly as the model uses them. Early exit stops the forward pass after
the last needed layer.

Features per sentence: see :meth:`AttentionReader.features` and :class:`FeatureLayout`: named blocks of
``layers * heads`` attention columns, then a few named scalars; an artifact records the names it was fit on.
"""

from __future__ import annotations

import contextvars
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..base import Passage
from ..errors import ConfigError, InputError
from ..text import title_mentions
from .config import DEFAULT_LAYOUT, LINK_EXTRAS, NO_LINK, FeatureLayout
from .rerank import zscore

__all__ = ["ProbeFeatures", "AttentionReader", "ATTN_IMPL", "select_columns", "link_features"]

ATTN_IMPL = "ragpress_probe"
_CAPTURE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("ragpress_probe_capture", default=None)


class _EarlyExit(Exception):
    pass


@dataclass
class _Capture:
    """Per batch element, its groups of query positions (one group per feature block; rows are averaged per
    group) and its length without padding; per layer, per element, per group, the ``[heads, length]`` rows."""

    groups: list[list[torch.Tensor]]
    lengths: list[int]
    max_layers: int
    rows: dict[int, list[list[torch.Tensor]]] = field(default_factory=dict)


def _probe_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cap = _CAPTURE.get()
    if cap is not None:
        layer = int(getattr(module, "layer_idx", len(cap.rows)))
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        cap_soft = getattr(module, "attn_logit_softcapping", None) or getattr(
            getattr(module, "config", None), "attn_logit_softcapping", None)
        Lk = key.shape[2]
        per_item = []
        for b, (groups, n) in enumerate(zip(cap.groups, cap.lengths, strict=True)):  # right-padded: keys [:n]
            qidx = torch.cat(groups)
            q = query[b:b + 1, :, qidx, :].float()
            k = key[b:b + 1, :, :n].float()
            if k.shape[1] != q.shape[1]:
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            s = (q @ k.transpose(-1, -2)) * scale  # [1, H, m, n]: only the m rows needed
            if cap_soft:
                s = torch.tanh(s / cap_soft) * cap_soft
            if attention_mask is not None and attention_mask.dim() == 4:
                am = attention_mask[b:b + 1, :, qidx, -Lk:][..., :n]
                s = s.masked_fill(~am, float("-inf")) if am.dtype == torch.bool else s + am.float()
            else:
                s = s.masked_fill(torch.arange(n, device=s.device)[None, :] > qidx[:, None], float("-inf"))
            p = torch.softmax(s, dim=-1)[0]  # [H, m, n]
            out_rows, start = [], 0
            for g in groups:
                out_rows.append(p[:, start:start + len(g)].mean(dim=1))  # [H, n]
                start += len(g)
            per_item.append(out_rows)
        cap.rows[layer] = per_item
        if len(cap.rows) >= cap.max_layers:  # the last layer read: its attention output is never used
            raise _EarlyExit()
    out = ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
    return out


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTN_IMPL, _probe_attention)
    # Without a registered mask function transformers builds no mask at all for a custom implementation:
    # causal-only models still work (SDPA's is_causal), but sliding-window layers (Gemma 3) would not.
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPL, sdpa_mask)


def _warn_flat_windows(wins: list[list[tuple[int, int, int]]], n_passages: int, layout: FeatureLayout) -> None:
    """Warn when windows too small to z-score within leave sentences without attention contrast. The message
    names no counts, so Python shows it once per run, not once per question."""
    lone = any(sum(b - a for _, a, b in w) < 2 for w in wins)
    uses_passage = any(p.startswith("passage_") for p in layout.pooling)
    single = uses_passage and n_passages > 1 and any(len(w) == 1 for w in wins)
    if lone or single:
        what = " and ".join(["one sentence"] * lone + ["one passage (or part of one)"] * single)
        warnings.warn(f"a proxy window holds only {what}: attention is z-scored within a window, so its "
                      "sentences get no attention contrast (z-score 0) there and are scored by the other features; "
                      "raise max_context_tokens to read more per window", RuntimeWarning, stacklevel=3)


def select_columns(src: FeatureLayout, src_layers: int, dst: FeatureLayout, dst_layers: int,
                   heads: int) -> np.ndarray:
    """Column indices of a ``src`` feature matrix (``src_layers`` deep) that a ``dst`` layout with a
    ``dst_layers`` early exit would have produced: the first layers' columns of each attention block."""
    if dst_layers > src_layers:
        raise ConfigError(f"cannot take {dst_layers} layers from features of {src_layers}")
    f, k = src_layers * heads, dst_layers * heads
    cols = [np.arange(src.pooling.index(b) * f, src.pooling.index(b) * f + k) for b in dst.pooling]
    base = len(src.pooling) * f
    cols += [np.array([base + src.extra.index(e)]) for e in dst.extra]
    return np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)


_WORD = re.compile(r"[a-z0-9]+")


def _content_words(text: str) -> set[str]:
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS_EN_PLUS}


def link_features(passages: list[Passage], owner: list[int], sents: list[str], bm25_z: np.ndarray) -> dict[str, np.ndarray]:
    """The :data:`LINK_EXTRAS` of each sentence (``owner``: its passage index; ``sents``: its text)."""
    P = len(passages)
    rel = np.full(P, NO_LINK)
    for i, pi in enumerate(owner):
        rel[pi] = max(rel[pi], bm25_z[i])
    titles = [p.title for p in passages]
    own = np.asarray(owner, dtype=np.int64)
    names = title_mentions(titles, [p.text for p in passages], range(P))  # passage a's text names b's title
    link_in = np.where(names, rel[:, None], -np.inf).max(0, initial=-np.inf)
    said = title_mentions(titles, sents, own)  # said[i, b]: sentence i names passage b's title
    out = np.maximum(np.where(said, rel[None, :], -np.inf).max(1, initial=-np.inf), NO_LINK)
    return {"passage_bm25": rel[own], "link_in": np.maximum(link_in, NO_LINK)[own], "link_out": out,
            "log1p_mentions": np.log1p(names.sum(0))[own].astype(np.float64)}


@dataclass
class ProbeFeatures:
    """Features of one prompt. ``x``: ``[n_sentences, layout.width(layers, heads)]``."""

    x: np.ndarray
    prompt_tokens: int
    layers: int
    heads: int


@dataclass
class _Window:
    """One proxy prompt: token ids, the query-position groups, per sentence its token range, per passage its
    token range (None: no sentences), and per sentence its passage."""

    ids: list[int]
    groups: list[torch.Tensor]
    tok_ranges: list[tuple[int, int]]
    pranges: list[tuple[int, int] | None]
    owner: list[int]


class AttentionReader:
    """The attention reader: runs the proxy over ``context + question`` and returns per-sentence attention
    features, which :class:`~compressor.sentinel.model.SentinelProbe` (the classifier) scores."""

    def __init__(self, model: Any, tokenizer: Any, query_positions: int = 4, max_context_tokens: int = 8192,
                 embedder: str = "minilm-l6", embedder_dtype: str = "float32",
                 embed_cache_dir: str | None = None) -> None:
        _register()
        if getattr(model.config, "_attn_implementation", None) != ATTN_IMPL:
            model.set_attn_implementation(ATTN_IMPL)
        self.model, self.tokenizer = model, tokenizer
        self.m = query_positions
        self.max_context_tokens = max_context_tokens
        self.join_margin = 2  # tokens allowed per window piece for merges at its joins, when packing windows
        self.embedder = embedder  # loaded on first use, only by a layout naming the embed_* scalars
        self.embedder_dtype = embedder_dtype
        self._embed_cache_dir, self._embed_cache = embed_cache_dir, None
        self._lookup: bool | None = None
        cfg = model.config.get_text_config()
        self.n_layers, self.n_heads = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)

    @classmethod
    def load(cls, name_or_path: str, dtype: str = "bfloat16", **kw: Any) -> AttentionReader:
        from ..models import load_causal_lm

        _register()
        model, tok = load_causal_lm(name_or_path, dtype=dtype)
        return cls(model, tok, **{"embedder_dtype": dtype, **kw})

    @property
    def embed_cache_dir(self) -> str | None:
        """Folder of the sentence-embedding cache (None: embed every sentence per question)."""
        return self._embed_cache_dir

    @embed_cache_dir.setter
    def embed_cache_dir(self, folder: str | None) -> None:
        self._embed_cache_dir, self._embed_cache = folder, None

    @property
    def embeds_by_lookup(self) -> bool:
        """True when the embedder is static (a table lookup per token, :mod:`compressor.static_embed`): its
        vectors cost less to compute than to read from a cache, so none is kept."""
        from ..static_embed import StaticEmbedder

        if self._lookup is None:
            from ..embed import get_embedder

            self._lookup = isinstance(get_embedder(self.embedder, self.embedder_dtype), StaticEmbedder)
        return self._lookup

    @property
    def embed_cache(self) -> Any:
        """The sentence-embedding cache (a :class:`~compressor.cache.TensorCache`), or None without a folder
        or with a static embedder."""
        if self.embed_cache_dir and self._embed_cache is None and not self.embeds_by_lookup:
            from ..cache import TensorCache
            from ..models import model_fingerprint

            ns = f"sentences-{model_fingerprint(self.embedder)[:16]}-{self.embedder_dtype}"
            self._embed_cache = TensorCache(self.embed_cache_dir, ns)
        return self._embed_cache

    @staticmethod
    def embed_docs(passages: list[Passage], spans: list[list[tuple[int, int]]]) -> tuple[list[str], list[int]]:
        """The texts embedded per sentence (title-prefixed, as the minilm filter scores them) and the passage of
        each: what :meth:`embed_similarity` reads and :meth:`index_sentences` writes, keyed alike."""
        docs = [f"{p.title}: {p.text[a:b]}" if p.title else p.text[a:b] for p, sp in zip(passages, spans) for a, b in sp]
        return docs, [pi for pi, sp in enumerate(spans) for _ in sp]

    def _cached_vectors(self, docs: list[str], owner: list[int], query: str | None) -> tuple[Any, Any, int, int]:
        """Sentence vectors by passage, read from the cache where present, the rest embedded now (with the
        query, in one call) and stored: ``(vectors [len(docs), dim], query vector or None, passages embedded
        now, passages read from the cache)``."""
        from ..embed import get_embedder

        emb, cache = get_embedder(self.embedder, self.embedder_dtype), self.embed_cache
        groups: dict[int, list[int]] = {}
        for i, pi in enumerate(owner):
            groups.setdefault(pi, []).append(i)
        vecs = torch.empty(len(docs), emb.dim)
        keys = {pi: "\n".join(docs[i] for i in rows) for pi, rows in groups.items()}
        missing = []
        for pi, rows in groups.items():
            got = cache.get(keys[pi])
            if got is not None and tuple(got.shape) == (len(rows), emb.dim):
                vecs[rows] = got
            else:
                missing.append(pi)
        head = [query] if query is not None else []
        fresh = emb.encode(head + [docs[i] for pi in missing for i in groups[pi]])
        start = len(head)
        for pi in missing:
            rows = groups[pi]
            vecs[rows] = fresh[start:start + len(rows)]
            cache.put(keys[pi], fresh[start:start + len(rows)])
            start += len(rows)
        return vecs, (fresh[0] if head else None), len(missing), len(groups) - len(missing)

    def embed_similarity(self, query: str, docs: list[str], owner: list[int]) -> np.ndarray:
        """Cosine of each doc (a title-prefixed sentence of passage ``owner[i]``) to the question. With a cache
        folder, a passage's sentence vectors are read from it (written at index time by
        :meth:`index_sentences`, or by the first question that saw the passage), so only the question is
        embedded at query time."""
        from ..embed import get_embedder

        if self.embed_cache is None:
            return get_embedder(self.embedder, self.embedder_dtype).similarity(query, docs)
        vecs, q, _, _ = self._cached_vectors(docs, owner, query)
        return (vecs @ q).numpy().astype("float64")

    def index_sentences(self, passages: list[Passage], spans: list[list[tuple[int, int]]]) -> tuple[int, int]:
        """Index time: store the sentence vectors of every passage with sentences in the cache folder, keyed as
        :meth:`embed_similarity` reads them. Returns (passages embedded now, passages already cached)."""
        if self.embeds_by_lookup:
            return 0, 0  # a static embedder: nothing worth storing
        if self.embed_cache is None:
            raise ConfigError("the sentence-embedding cache has no folder: set cache_dir to index passages")
        docs, owner = self.embed_docs(passages, spans)
        _, _, computed, cached = self._cached_vectors(docs, owner, None)
        return computed, cached

    def n_features(self, layers: int, layout: FeatureLayout = DEFAULT_LAYOUT) -> int:
        return layout.width(layers, self.n_heads)

    def _prompt(self, query: str, passages: list[Passage], spans: list[list[tuple[int, int]]]):
        """Prompt text; per sentence its [start, end) char range in that text; the question's range; per
        passage the range of its title line and sentences (None for a passage without sentences)."""
        head = "Read the context and answer the question.\n\nContext:\n"
        parts, ranges, pranges, pos = [head], [], [], len(head)
        for p, sp in zip(passages, spans):
            if not sp:
                pranges.append(None)
                continue
            p_start = pos
            line = f"{p.title}: " if p.title else ""
            parts.append(line)
            pos += len(line)
            for j, (s, e) in enumerate(sp):
                t = p.text[s:e] + (" " if j < len(sp) - 1 else "\n")
                ranges.append((pos, pos + e - s))
                parts.append(t)
                pos += len(t)
            pranges.append((p_start, pos - 1))
        q = query.strip()
        body = "".join(parts) + f"\nQuestion: {q}"
        qrange = (len(body) - len(q), len(body))
        if getattr(self.tokenizer, "chat_template", None):
            msgs = [{"role": "user", "content": body}]
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            shift = text.index(body)
        else:
            text, shift = body + "\nAnswer:", 0

        def sh(r):
            return None if r is None else (r[0] + shift, r[1] + shift)

        return text, [sh(r) for r in ranges], sh(qrange), [sh(r) for r in pranges]

    def _encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and character offsets of a prompt text, BOS prepended without a chat template."""
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if not getattr(self.tokenizer, "chat_template", None) and bos is not None:
            ids, offsets = [bos] + ids, [(0, 0)] + offsets
        return ids, offsets

    def _n_tokens(self, text: str) -> int:
        return len(self._encode(text)[0])

    @staticmethod
    def _window(passages: list[Passage], spans: list[list[tuple[int, int]]],
                window: list[tuple[int, int, int]]) -> tuple[list[Passage], list[list[tuple[int, int]]]]:
        """The passages and sentence spans of one window's ``(passage, first, end)`` pieces."""
        return [passages[i] for i, _, _ in window], [spans[i][a:b] for i, a, b in window]

    def windows(self, query: str, passages: list[Passage],
                spans: list[list[tuple[int, int]]]) -> list[list[tuple[int, int, int]]]:
        """What the proxy reads in each pass, as ``(passage, first sentence, end sentence)`` pieces: the whole
        context in one window when its prompt fits ``max_context_tokens``. Otherwise consecutive pieces are
        packed into windows, each grown while its prompt (instruction, question, the pieces' title lines and
        sentences, two tokens of margin per piece for merges at the joins) stays within the limit. A piece is a
        whole passage, or, for a passage too long to fit with the question alone, a run of its sentences under
        its title line. Each window's prompt is then counted exactly, and one that came out too long is split.
        Passages without sentences are left out (they have no rows). A question that leaves no room for a
        sentence, or a single sentence too long to fit with it, is refused (a sentence is never cut)."""
        if self._n_tokens(self._prompt(query, passages, spans)[0]) <= self.max_context_tokens:
            return [[(i, 0, len(sp)) for i, sp in enumerate(spans)]]
        fixed = self._n_tokens(self._prompt(query, [], [])[0])
        budget = self.max_context_tokens - fixed
        room = budget - self.join_margin  # one piece alone, with its margin
        if room <= 0:
            raise InputError(f"the question and the proxy's instruction take {fixed} tokens, leaving no room for "
                             f"context under max_context_tokens={self.max_context_tokens}: shorten the question "
                             "or raise max_context_tokens (up to the proxy's context length)")
        pieces: list[tuple[int, int, int, int]] = []  # passage, first, end, tokens
        for i, (p, sp) in enumerate(zip(passages, spans)):
            if not sp:
                continue
            cost = self._n_tokens(self._prompt(query, [p], [sp])[0]) - fixed
            if cost <= room:
                pieces.append((i, 0, len(sp), cost))
                continue
            head = self._n_tokens(f"{p.title}: ") if p.title else 0
            sizes = [len(ids) + 1 for ids in self.tokenizer([p.text[a:b] for a, b in sp],
                                                            add_special_tokens=False)["input_ids"]]
            first, used = 0, head
            for j, n in enumerate(sizes):
                if j > first and used + n > room:
                    pieces.append((i, first, j, used))
                    first, used = j, head
                used += n
            pieces.append((i, first, len(sp), used))
        groups: list[list[tuple[int, int, int]]] = []
        cur: list[tuple[int, int, int]] = []
        used = 0
        for i, first, end, cost in pieces:
            if cur and used + cost + self.join_margin > budget:
                groups.append(cur)
                cur, used = [], 0
            cur.append((i, first, end))
            used += cost + self.join_margin
        groups += [cur] if cur else []

        def settle(w: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
            """The packing above estimates; an exact count splits a window that came out too long."""
            n = self._n_tokens(self._prompt(query, *self._window(passages, spans, w))[0])
            if n <= self.max_context_tokens:
                return [w]
            if len(w) > 1:
                return settle(w[: len(w) // 2]) + settle(w[len(w) // 2:])
            i, a, b = w[0]
            if b - a > 1:
                return settle([(i, a, (a + b) // 2)]) + settle([(i, (a + b) // 2, b)])
            title = f" ({passages[i].title!r})" if passages[i].title else ""
            raise InputError(f"sentence {a} of passage {i}{title} makes a proxy prompt of {n} tokens with the "
                             f"question, over max_context_tokens={self.max_context_tokens}, and a sentence is never "
                             "cut: raise max_context_tokens (up to the proxy's context length) or split that sentence")

        return [x for w in groups for x in settle(w)] or [[(i, 0, len(sp)) for i, sp in enumerate(spans)]]

    def _prepare(self, query: str, passages: list[Passage], spans: list[list[tuple[int, int]]]) -> _Window:
        """One proxy prompt over ``passages`` and the question: its ids, and per sentence and passage the token
        ranges the features pool over."""
        text, ranges, qrange, pranges = self._prompt(query, passages, spans)
        ids, offsets = self._encode(text)
        L = len(ids)
        if L > self.max_context_tokens:  # features() reads through windows(), which never makes one this long
            raise InputError(f"a proxy prompt of {L} tokens is over max_context_tokens={self.max_context_tokens}: "
                             "read the context with features(), which splits it into windows")
        starts = np.array([a for a, _ in offsets])
        ends = np.array([b for _, b in offsets])

        def tok_range(a: int, b: int) -> tuple[int, int]:
            idx = np.nonzero((ends > a) & (starts < b))[0]
            return (int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0)

        qa, qb = tok_range(*qrange)
        groups = [torch.arange(qa, qb) if qb > qa else torch.tensor([L - 1]), torch.arange(max(0, L - self.m), L)]
        return _Window(ids, groups, [tok_range(a, b) for a, b in ranges],
                       [None if r is None else tok_range(*r) for r in pranges],
                       [pi for pi, sp in enumerate(spans) for _ in sp])

    def _run(self, wins: list[_Window], layers: int) -> list[list[torch.Tensor]]:
        """The proxy over ``wins`` in one right-padded forward pass (one window: no padding, no mask), early exit
        after ``layers``: per window, per group, the ``[layers * heads, length]`` attention rows. Right padding
        leaves every real token's attention what it is alone (causal: no real query sees a pad)."""
        lengths = [len(w.ids) for w in wins]
        L = max(lengths)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([w.ids + [pad] * (L - len(w.ids)) for w in wins])
        mask = None  # right padding under a causal mask: no real query sees a pad, so no padding mask
        cap = _Capture(groups=[w.groups for w in wins], lengths=lengths, max_layers=layers)
        token = _CAPTURE.set(cap)
        try:
            with torch.inference_mode():
                self.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
        except _EarlyExit:
            pass
        finally:
            _CAPTURE.reset(token)
        if len(cap.rows) < layers:
            raise RuntimeError(f"captured attention of {len(cap.rows)} layers, expected {layers}: the proxy does not "
                               "dispatch attention through transformers' AttentionInterface")
        keep = sorted(cap.rows)[:layers]
        return [[torch.stack([cap.rows[i][b][gi] for i in keep]).reshape(layers * self.n_heads, n)
                 for gi in range(2)] for b, n in enumerate(lengths)]

    def _blocks(self, win: _Window, rows: list[torch.Tensor], layout: FeatureLayout) -> dict[str, np.ndarray]:
        """The layout's attention blocks of one window (rows: its sentences in order)."""
        LH = rows[0].shape[0]
        n_pass = [pi for pi, r in enumerate(win.pranges) if r is not None]

        def zlogmean(A: np.ndarray, trs: list[tuple[int, int]]) -> np.ndarray:
            mean = np.zeros((len(trs), LH), dtype=np.float64)
            for i, (a, b) in enumerate(trs):
                if b > a:
                    mean[i] = A[:, a:b].mean(1)
            return zscore(np.log(mean + 1e-6))

        blocks: dict[str, np.ndarray] = {}
        for gi, group in enumerate(("question", "final")):
            A = rows[gi].numpy()
            if f"{group}:zlogmean" in layout.pooling:
                blocks[f"{group}:zlogmean"] = zlogmean(A, win.tok_ranges)
            if f"passage_{group}:zlogmean" in layout.pooling:
                zp = zlogmean(A, [win.pranges[pi] for pi in n_pass])  # type: ignore[misc]
                row = {pi: j for j, pi in enumerate(n_pass)}
                blocks[f"passage_{group}:zlogmean"] = zp[[row[pi] for pi in win.owner]] if win.owner else \
                    np.zeros((0, LH))
        return blocks

    def features(self, query: str, passages: list[Passage], spans: list[list[tuple[int, int]]],
                 layers: int | None = None, layout: FeatureLayout = DEFAULT_LAYOUT) -> ProbeFeatures:
        """Features of every sentence in ``spans`` (per passage, ``[start, end)`` in the passage text), in
        order, as ``layout`` names them. ``layers``: early exit after that many layers (None: all).

        Two groups of query positions are read: the question's tokens and the final ``query_positions``
        prompt positions. Per group and (layer, head): the mean attention over the sentence's tokens (or over
        its whole passage, title included), as a per-question z-score of its log: attention is relative, what
        matters is how a sentence compares with the others of the same context. Scalars: log token count,
        relative position, first-in-passage flag and log index within the passage, the share of the
        question's content words found in the sentence and in the passage title, the z-scored BM25
        score of the title-prefixed sentence among the context's sentences, the cosine similarity of its
        embedding (``self.embedder``) to the question's, raw and z-scored, and the passage-link scalars
        (:func:`link_features`).

        A context whose prompt is longer than ``max_context_tokens`` is read in windows (:meth:`windows`):
        consecutive whole passages, each window with the question, its attention z-scored within the window.
        The scalars are computed over the whole context either way. A window of one sentence (or of one
        passage, where the context has several) has nothing to compare its attention with: its z-scores are 0,
        those rows are scored by the other features, and a warning says so."""
        return self.features_batch([(query, passages, spans)], layers, layout)[0]

    def features_batch(self, items: list[tuple[str, list[Passage], list[list[tuple[int, int]]]]],
                       layers: int | None = None, layout: FeatureLayout = DEFAULT_LAYOUT,
                       batch_size: int | None = None, cos: list[np.ndarray] | None = None) -> list[ProbeFeatures]:
        """:meth:`features` of several questions' contexts: their proxy windows read ``batch_size`` at a time in
        one right-padded forward pass each, and, without an embedding cache, every question and sentence
        embedded in one call. ``batch_size`` None: 8 on an accelerator, 1 on a CPU, where a window of ~1,500
        tokens already fills the matrix units and padding only adds work (HotpotQA, 2 cores, 2026-12-07: 0.09-0.10 s
        a question one window at a time, 0.10-0.12 s eight at a time). ``cos``: per item, the embedder
        cosines to use (one per sentence) instead of embedding. The same features as one at a time up to the rounding of padded kernels (in
        float32 a z-scored log-attention feature moves by up to ~2e-4; bf16 rounds the attention rows themselves).
        The windows of one long context are batched the same way."""
        layers = self.n_layers if layers is None else min(layers, self.n_layers)
        if batch_size is None:
            batch_size = 1 if self.model.device.type == "cpu" else 8
        units: list[tuple[int, _Window]] = []
        for k, (query, passages, spans) in enumerate(items):
            wins = self.windows(query, passages, spans)
            if len(wins) > 1:
                _warn_flat_windows(wins, sum(1 for sp in spans if sp), layout)
            units += [(k, self._prepare(query, *self._window(passages, spans, w))) for w in wins]
        order = sorted(range(len(units)), key=lambda u: len(units[u][1].ids))  # similar lengths pad little
        rows: dict[int, list[torch.Tensor]] = {}
        for a in range(0, len(order), max(1, batch_size)):
            chunk = order[a:a + max(1, batch_size)]
            rows.update(zip(chunk, self._run([units[u][1] for u in chunk], layers), strict=True))
        per: dict[int, list[int]] = {}
        for u, (k, _) in enumerate(units):
            per.setdefault(k, []).append(u)
        cos = cos if cos is not None else self._batch_similarity(items, layout)
        return [self._item_features(*items[k], [units[u][1] for u in per[k]],
                                    [self._blocks(units[u][1], rows[u], layout) for u in per[k]], layers, layout,
                                    None if cos is None else cos[k]) for k in range(len(items))]

    def _batch_similarity(self, items: list[tuple[str, list[Passage], list[list[tuple[int, int]]]]],
                          layout: FeatureLayout) -> list[np.ndarray] | None:
        """Without an embedding cache and with several questions: every question and title-prefixed sentence
        embedded in one call; None where :meth:`embed_similarity` does it per question."""
        if not layout.uses_embedder or self.embed_cache is not None or len(items) < 2:
            return None
        from ..embed import get_embedder

        texts, at = [], []
        for query, passages, spans in items:
            docs = self.embed_docs(passages, spans)[0]
            at.append((len(texts), len(docs)))
            texts += [query, *docs]
        v = get_embedder(self.embedder, self.embedder_dtype).encode(texts)
        return [(v[a + 1:a + 1 + n] @ v[a]).numpy().astype("float64") for a, n in at]

    def _item_features(self, query: str, passages: list[Passage], spans: list[list[tuple[int, int]]],
                       wins: list[_Window], parts: list[dict[str, np.ndarray]], layers: int, layout: FeatureLayout,
                       cos: np.ndarray | None) -> ProbeFeatures:
        from ..filters.bm25 import bm25_scores

        blocks = {k: np.concatenate([b[k] for b in parts]) for k in parts[0]}
        n_tokens = [b - a for w in wins for a, b in w.tok_ranges]
        L = sum(len(w.ids) for w in wins)
        owner = [pi for pi, sp in enumerate(spans) for _ in sp]  # passage of each sentence
        n = len(owner)
        qwords = _content_words(query)
        extras = {
            "log1p_tokens": [math.log1p(t) for t in n_tokens],
            "relative_position": [i / max(n - 1, 1) for i in range(n)],
            "first_in_passage": [float(j == 0) for sp in spans for j in range(len(sp))],
            "log1p_index_in_passage": [math.log1p(j) for sp in spans for j in range(len(sp))],
        }
        sents = [passages[pi].text[a:b] for pi, sp in enumerate(spans) for a, b in sp]
        titles = [passages[pi].title or "" for pi in owner]
        if layout.uses_embedder:
            if cos is None:
                cos = self.embed_similarity(query, self.embed_docs(passages, spans)[0], owner)
            extras["embed_cos"] = cos
            extras["embed_z"] = zscore(cos[:, None])[:, 0] if n else []
        if {"question_overlap", "title_overlap", "bm25_z", *LINK_EXTRAS} & set(layout.extra):
            share = lambda t: len(qwords & _content_words(t)) / len(qwords) if qwords else 0.0  # noqa: E731
            extras["question_overlap"] = [share(t) for t in sents]
            extras["title_overlap"] = [share(t) for t in titles]
            bm = bm25_scores(query, [f"{t} {s}" for t, s in zip(titles, sents)])
            extras["bm25_z"] = zscore(bm[:, None])[:, 0] if n else np.zeros(0)
            if set(LINK_EXTRAS) & set(layout.extra):
                extras.update(link_features(passages, owner, sents, extras["bm25_z"]))
        cols = [blocks[b] for b in layout.pooling] + [np.asarray(extras[e], dtype=np.float64)[:, None]
                                                      for e in layout.extra]
        x = np.concatenate(cols, axis=1).astype(np.float32) if cols else np.zeros((n, 0), dtype=np.float32)
        return ProbeFeatures(x=x, prompt_tokens=L, layers=layers, heads=self.n_heads)
