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

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> Any:
        import torch

        outs = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                enc = self.tokenizer(list(texts[i:i + batch_size]), padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                h = self.model(**enc).last_hidden_state
                m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                outs.append(torch.nn.functional.normalize(v, dim=-1).float())
        if not outs:
            return torch.zeros(0, self.dim)
        return torch.cat(outs)


@functools.lru_cache(maxsize=4)
def get_embedder(name_or_path: str = "minilm-l6") -> Embedder:
    from .models import load_embedder

    model, tok = load_embedder(name_or_path)
    return Embedder(model, tok, name_or_path)
