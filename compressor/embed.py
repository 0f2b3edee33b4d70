"""Sentence embeddings (mean pooling + L2 norm, as sentence-transformers' all-MiniLM-L6-v2 config says)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

__all__ = ["Embedder", "get_embedder"]


class Embedder:
    """A frozen sentence embedder. ``encode(texts) -> float32 tensor [n, dim]``, unit-norm rows."""

    def __init__(self, model: Any, tokenizer: Any, name: str, max_length: int = 256) -> None:
        self.model, self.tokenizer, self.name, self.max_length = model, tokenizer, name, max_length

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], batch_size: int = 16) -> Any:
        """Rows in the order of ``texts``. Texts are batched by length (shortest first), so a batch pads to
        similar lengths: the same vectors as input-order batching, in about half the time on sentences."""
        import torch

        if not texts:
            return torch.zeros(0, self.dim)
        lengths = [len(ids) for ids in self.tokenizer(list(texts), truncation=True,
                                                      max_length=self.max_length)["input_ids"]]
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        out = torch.empty(len(texts), self.dim)
        with torch.inference_mode():
            for i in range(0, len(order), batch_size):
                rows = order[i:i + batch_size]
                enc = self.tokenizer([texts[j] for j in rows], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                h = self.model(**enc).last_hidden_state.float()
                m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out[rows] = torch.nn.functional.normalize(v, dim=-1)
        return out

    def similarity(self, query: str, docs: Sequence[str]) -> Any:
        """Cosine similarity of each doc's embedding to the query's: float64 numpy ``[len(docs)]``."""
        v = self.encode([query, *docs])
        return (v[1:] @ v[0]).numpy().astype("float64")


@functools.lru_cache(maxsize=4)
def get_embedder(name_or_path: str = "minilm-l6", dtype: str = "float32") -> Any:
    """A cached embedder. ``dtype="bfloat16"`` runs the encoder in bf16 (about 2x faster on a CPU with AMX;
    cosine similarities move by up to ~0.005); pooling and normalisation stay fp32. A static embedder
    (``minilm-l6-static``, or a folder holding a static table) is a :class:`~compressor.static_embed.StaticEmbedder`
    with the same interface; ``dtype`` does not apply to it (a lookup, kept fp32)."""
    import torch

    from .models import load_embedder, resolve_model
    from .static_embed import StaticEmbedder, is_static_folder

    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"embedder dtype {dtype!r}: choose float32, bfloat16 or float16")
    folder = resolve_model(name_or_path)
    if is_static_folder(folder):
        return StaticEmbedder.load(folder, str(name_or_path))
    model, tok = load_embedder(name_or_path)
    return Embedder(model.to(getattr(torch, dtype)), tok, name_or_path)
