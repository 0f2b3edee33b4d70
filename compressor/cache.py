"""A content-addressed tensor cache on disk: what a compressor computes per passage ahead of time (index time)
and reads back at query time (ICAE memory slots, sentinel sentence embeddings)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["TensorCache"]


class TensorCache:
    """One safetensors file per (namespace, sha256 of the key text) under ``root``. Writes go to a temporary
    file in the same folder and are moved into place with ``os.replace``, so readers see a whole file or none.
    The namespace names everything the value depends on besides the key text (model, weights, options)."""

    def __init__(self, root: str | Path, namespace: str, tensor_name: str = "value") -> None:
        self.dir = Path(root) / namespace
        self.tensor_name = tensor_name
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def path(self, text: str) -> Path:
        k = self.key(text)
        return self.dir / k[:2] / f"{k}.safetensors"

    def get(self, text: str) -> Any:
        """The stored tensor (float32, CPU), or None."""
        found = self.get_tensors(text)
        return None if found is None else found[self.tensor_name]

    def put(self, text: str, value: Any) -> Path:
        return self.put_tensors(text, {self.tensor_name: value.detach().float()})

    def get_tensors(self, text: str) -> dict[str, Any] | None:
        """Every tensor stored under ``text`` (CPU, dtypes as written), or None."""
        from safetensors.torch import load_file

        p = self.path(text)
        if not p.is_file():
            self.misses += 1
            return None
        self.hits += 1
        return load_file(str(p))

    def put_tensors(self, text: str, values: dict[str, Any]) -> Path:
        """Store several named tensors under ``text`` in one file (atomically)."""
        from safetensors.torch import save_file

        p = self.path(text)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file({k: v.detach().contiguous().cpu() for k, v in values.items()}, tmp)
            os.replace(tmp, p)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return p
