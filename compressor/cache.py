"""A content-addressed tensor cache on disk: what a compressor computes per passage ahead of time (index time)
and reads back at query time (ICAE memory slots, sentinel sentence embeddings)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["TensorCache", "local_root"]


# fsspec protocols whose single PUT shows a whole object or none (memory: tests and one-process use).
_OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory")


def local_root(root: str | Path) -> Path | None:
    """The local folder ``root`` names (a path or a ``file://`` URL), or None for another fsspec URL."""
    root = str(root)
    if "://" in root and not root.startswith("file://"):
        return None
    return Path(root.removeprefix("file://"))


class TensorCache:
    """One safetensors file per (namespace, sha256 of the key text) under ``root``. The namespace names
    everything the value depends on besides the key text (model, weights, options).

    ``root`` is a local folder, or an fsspec URL of an object store (``s3://bucket/cache``, ``gs://…``,
    ``az://…``, ``memory://…``; the protocol's package must be installed, s3fs for s3). Local writes go to a temporary file in the same folder
    and are moved into place with ``os.replace``; an object store's single PUT is atomic already. Either way
    readers see a whole file or none, so several processes (proxy replicas, Ray index workers) may read and
    fill one cache at once: a value computed twice is written twice, identical."""

    def __init__(self, root: str | Path, namespace: str, tensor_name: str = "value") -> None:
        root, local = str(root), local_root(root)
        self.fs: Any = None
        if local is None:
            import fsspec

            protocol = root.split("://", 1)[0]
            if protocol not in _OBJECT_STORES:
                raise ConfigError(f"cache_dir {root!r}: {protocol}:// is not an object store, where one write is "
                                  f"atomic; use a folder (a shared mount works) or one of "
                                  f"{', '.join(p + '://' for p in _OBJECT_STORES)}")
            self.fs, base = fsspec.core.url_to_fs(root)
            self.dir: Any = f"{base.rstrip('/')}/{namespace}"
        else:
            self.dir = local / namespace
        self.tensor_name = tensor_name
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def path(self, text: str) -> Any:
        """Where ``text``'s value lives: a local :class:`~pathlib.Path`, or a path inside :attr:`fs`."""
        k = self.key(text)
        return f"{self.dir}/{k[:2]}/{k}.safetensors" if self.fs is not None else self.dir / k[:2] / f"{k}.safetensors"

    def get(self, text: str) -> Any:
        """The stored tensor (float32, CPU), or None."""
        found = self.get_tensors(text)
        return None if found is None else found[self.tensor_name]

    def put(self, text: str, value: Any) -> Any:
        return self.put_tensors(text, {self.tensor_name: value.detach().float()})

    def get_tensors(self, text: str) -> dict[str, Any] | None:
        """Every tensor stored under ``text`` (CPU, dtypes as written), or None."""
        from safetensors.torch import load, load_file

        p = self.path(text)
        if self.fs is not None:
            try:
                found = load(self.fs.cat_file(p))
            except FileNotFoundError:
                found = None
        else:
            found = load_file(str(p)) if p.is_file() else None
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put_tensors(self, text: str, values: dict[str, Any]) -> Any:
        """Store several named tensors under ``text`` in one file (atomically)."""
        from safetensors.torch import save, save_file

        tensors = {k: v.detach().contiguous().cpu() for k, v in values.items()}
        p = self.path(text)
        if self.fs is not None:
            self.fs.pipe_file(p, save(tensors))  # one PUT: an object store shows all of it or nothing
            return p
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file(tensors, tmp)
            os.replace(tmp, p)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return p
