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

Features per sentence: see :meth:`AttentionProbe.features`: ``2 * layers * heads + 2`` numbers.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..base import Passage
from ..errors import InputError

__all__ = ["ProbeFeatures", "AttentionProbe", "ATTN_IMPL"]

ATTN_IMPL = "ragpress_probe"
_CAPTURE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("ragpress_probe_capture", default=None)


class _EarlyExit(Exception):
    pass


@dataclass
class _Capture:
    groups: list[torch.Tensor]  # query positions, one group per feature block; rows are averaged per group
    max_layers: int
    rows: dict[int, list[torch.Tensor]] = field(default_factory=dict)


def _probe_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cap = _CAPTURE.get()
    if cap is not None:
        layer = int(getattr(module, "layer_idx", len(cap.rows)))
        qidx = torch.cat(cap.groups)
        q = query[:, :, qidx, :].float()
        k = key.float()
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        scale = scaling if scaling is not None else 1.0 / math.sqrt(q.shape[-1])
        s = (q @ k.transpose(-1, -2)) * scale  # [B, H, m, L]: only the m rows needed
        cap_soft = getattr(module, "attn_logit_softcapping", None) or getattr(
            getattr(module, "config", None), "attn_logit_softcapping", None)
        if cap_soft:
            s = torch.tanh(s / cap_soft) * cap_soft
        L = k.shape[2]
        if attention_mask is not None and attention_mask.dim() == 4:
            am = attention_mask[:, :, qidx, -L:]
            s = s.masked_fill(~am, float("-inf")) if am.dtype == torch.bool else s + am.float()
        else:
            s = s.masked_fill(torch.arange(L, device=s.device)[None, :] > qidx[:, None], float("-inf"))
        p = torch.softmax(s, dim=-1)[0]  # [H, m, L]
        out_rows, start = [], 0
        for g in cap.groups:
            out_rows.append(p[:, start:start + len(g)].mean(dim=1))  # [H, L]
            start += len(g)
        cap.rows[layer] = out_rows
    out = ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
    if cap is not None and len(cap.rows) >= cap.max_layers:
        raise _EarlyExit()
    return out


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTN_IMPL, _probe_attention)
    # Without a registered mask function transformers builds no mask at all for a custom implementation:
    # causal-only models still work (SDPA's is_causal), but sliding-window layers (Gemma 3) would not.
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPL, sdpa_mask)


@dataclass
class ProbeFeatures:
    """Features of one prompt. ``x``: ``[n_sentences, N_BLOCKS * layers * heads + 2]``."""

    x: np.ndarray
    prompt_tokens: int
    layers: int
    heads: int


class AttentionProbe:
    """Runs the proxy over ``context + question`` and returns per-sentence attention features."""

    def __init__(self, model: Any, tokenizer: Any, query_positions: int = 4, max_context_tokens: int = 8192) -> None:
        _register()
        if getattr(model.config, "_attn_implementation", None) != ATTN_IMPL:
            model.set_attn_implementation(ATTN_IMPL)
        self.model, self.tokenizer = model, tokenizer
        self.m = query_positions
        self.max_context_tokens = max_context_tokens
        cfg = model.config.get_text_config()
        self.n_layers, self.n_heads = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)

    @classmethod
    def load(cls, name_or_path: str, dtype: str = "bfloat16", **kw: Any) -> AttentionProbe:
        from ..models import load_causal_lm

        _register()
        model, tok = load_causal_lm(name_or_path, dtype=dtype)
        return cls(model, tok, **kw)

    def n_features(self, layers: int) -> int:
        return N_BLOCKS * layers * self.n_heads + 2

    def _prompt(self, query: str, passages: list[Passage], spans: list[list[tuple[int, int]]]):
        """Prompt text, per sentence its [start, end) char range in that text, and the question's range."""
        head = "Read the context and answer the question.\n\nContext:\n"
        parts, ranges, pos = [head], [], len(head)
        for p, sp in zip(passages, spans):
            if not sp:
                continue
            line = f"{p.title}: " if p.title else ""
            parts.append(line)
            pos += len(line)
            for j, (s, e) in enumerate(sp):
                t = p.text[s:e] + (" " if j < len(sp) - 1 else "\n")
                ranges.append((pos, pos + e - s))
                parts.append(t)
                pos += len(t)
        q = query.strip()
        body = "".join(parts) + f"\nQuestion: {q}"
        qrange = (len(body) - len(q), len(body))
        if getattr(self.tokenizer, "chat_template", None):
            msgs = [{"role": "user", "content": body}]
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            shift = text.index(body)
        else:
            text, shift = body + "\nAnswer:", 0
        return text, [(a + shift, b + shift) for a, b in ranges], (qrange[0] + shift, qrange[1] + shift)

    def features(self, query: str, passages: list[Passage], spans: list[list[tuple[int, int]]],
                 layers: int | None = None) -> ProbeFeatures:
        """Features of every sentence in ``spans`` (per passage, ``[start, end)`` in the passage text), in
        order. ``layers``: early exit after that many layers (None: all).

        Two groups of query positions are read: the question's tokens and the final ``query_positions``
        prompt positions. Per group and (layer, head): the mean attention over the sentence's tokens, as a
        per-question z-score of its log (attention is relative: what matters is how a sentence compares with
        the others of the same context). Then log token count and relative position."""
        layers = self.n_layers if layers is None else min(layers, self.n_layers)
        text, ranges, qrange = self._prompt(query, passages, spans)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if not getattr(self.tokenizer, "chat_template", None) and bos is not None:
            ids, offsets = [bos] + ids, [(0, 0)] + offsets
        L = len(ids)
        if L > self.max_context_tokens:
            raise InputError(f"the proxy prompt has {L} tokens, over max_context_tokens={self.max_context_tokens}; "
                             "raise it (up to the proxy's context length) or pass fewer passages")
        starts = np.array([a for a, _ in offsets])
        ends = np.array([b for _, b in offsets])

        def tok_range(a: int, b: int) -> tuple[int, int]:
            idx = np.nonzero((ends > a) & (starts < b))[0]
            return (int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0)

        n = len(ranges)
        tok_ranges = [tok_range(a, b) for a, b in ranges]
        qa, qb = tok_range(*qrange)
        groups = [torch.arange(qa, qb) if qb > qa else torch.tensor([L - 1]), torch.arange(max(0, L - self.m), L)]
        cap = _Capture(groups=groups, max_layers=layers)
        token = _CAPTURE.set(cap)
        try:
            with torch.inference_mode():
                self.model.base_model(input_ids=torch.tensor([ids]), use_cache=False)
        except _EarlyExit:
            pass
        finally:
            _CAPTURE.reset(token)
        if len(cap.rows) < layers:
            raise RuntimeError(f"captured attention of {len(cap.rows)} layers, expected {layers}: the proxy does not "
                               "dispatch attention through transformers' AttentionInterface")
        LH = layers * self.n_heads
        x = np.zeros((n, N_BLOCKS * LH + 2), dtype=np.float32)
        for gi in range(len(groups)):
            A = torch.stack([cap.rows[i][gi] for i in sorted(cap.rows)[:layers]]).reshape(LH, L).numpy()
            mean = np.zeros((n, LH), dtype=np.float64)
            for i, (a, b) in enumerate(tok_ranges):
                if b > a:
                    mean[i] = A[:, a:b].mean(1)
            logm = np.log(mean + 1e-6)
            x[:, gi * LH:(gi + 1) * LH] = (logm - logm.mean(0)) / (logm.std(0) + 1e-6) if n > 1 else 0.0
        for i, (a, b) in enumerate(tok_ranges):
            x[i, -2] = math.log1p(b - a)
            x[i, -1] = i / max(n - 1, 1)
        return ProbeFeatures(x=x, prompt_tokens=L, layers=layers, heads=self.n_heads)


# (question positions, final positions): per-question z-score of log mean attention. Measured on 180
# training questions (validation AUC / recall@20%): raw mean+max 0.76 / 0.60, the z-scores alone 0.89 / 0.78;
# the question's positions carry most of it (final positions alone: 0.61 / 0.36).
N_BLOCKS = 2


def select_layers(x: np.ndarray, from_layers: int, to_layers: int, heads: int) -> np.ndarray:
    """Columns of a ``from_layers`` feature matrix that a ``to_layers`` early exit would have produced."""
    if to_layers == from_layers:
        return x
    k, f = to_layers * heads, from_layers * heads
    return np.concatenate([x[:, b * f: b * f + k] for b in range(N_BLOCKS)] + [x[:, -2:]], axis=1)
