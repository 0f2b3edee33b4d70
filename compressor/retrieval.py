"""The retriever: a small embedded document index, passages embedded once, stored on disk, retrieved by cosine
similarity. No compressor family is needed to use it (the eval's retrieval setting builds one per corpus).

It is also what ``xrag`` reads: xRAG's point (Cheng et al. 2024) is that the retriever already embedded every
document at index time, so compressing a retrieved document to one soft row costs only the bridge:
:class:`~compressor.xrag.model.XRAGCompressor` reads the stored vector by the passage's text hash and never
re-encodes an indexed passage at query time.

On disk (written atomically: a temp folder beside the target, renamed into place)::

    index.json              type, format version, embedder id / sha256 / dim, count
    embeddings.safetensors  {"embeddings": float32 [n, dim]}, unit-norm rows
    passages.jsonl          one {"sha256", "text", "title", "id"} per row, same order

Passages are keyed by the sha256 of their text (the title is not part of the key or of the embedding: the
prompt shows titles as text and the soft row stands for the body). Duplicate texts are stored once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .artifacts import atomic_folder
from .base import Passage, coerce_passages
from .errors import ArtifactError, BaseModelMismatchError, InputError

__all__ = ["DocumentIndex", "INDEX_FORMAT_VERSION", "text_key", "cached_index"]

INDEX_FORMAT_VERSION = 1

_MANIFEST, _VECTORS, _PASSAGES = "index.json", "embeddings.safetensors", "passages.jsonl"


def text_key(text: str) -> str:
    """The lookup key of a passage: sha256 of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _embedder_info(name: str) -> dict[str, Any]:
    from .models import model_fingerprint, model_id

    return {"id": model_id(name), "sha256": model_fingerprint(name)}


class DocumentIndex:
    """Unit-norm passage vectors ``[n, dim]`` (float32) with their passages, searchable by cosine."""

    def __init__(self, passages: Sequence[Passage], vectors: torch.Tensor, embedder: dict[str, Any]) -> None:
        if vectors.dim() != 2 or vectors.shape[0] != len(passages):
            raise InputError(f"index vectors have shape {tuple(vectors.shape)} for {len(passages)} passages")
        self.passages = list(passages)
        self.vectors = vectors.float().contiguous()
        self.embedder = {**embedder, "dim": int(vectors.shape[1])}
        self.keys = [text_key(p.text) for p in self.passages]
        self._row = {k: i for i, k in enumerate(self.keys)}
        if len(self._row) != len(self.keys):
            raise InputError("index passages contain duplicate texts; build() deduplicates them")
        self._encoder: Any = None

    def __len__(self) -> int:
        return len(self.passages)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    # -- building --------------------------------------------------------------------------------------
    @staticmethod
    def _dedup(passages: Any) -> list[Passage]:
        seen: dict[str, Passage] = {}
        for p in coerce_passages(passages):
            seen.setdefault(text_key(p.text), Passage(text=p.text, title=p.title, id=p.id))
        return list(seen.values())

    @classmethod
    def build(cls, passages: Any, embedder: str = "minilm-l6", batch_size: int = 64) -> DocumentIndex:
        """Embed every distinct passage text once with the named/local ``embedder``."""
        from .embed import get_embedder

        plist = cls._dedup(passages)
        enc = get_embedder(embedder)
        vectors = enc.encode([p.text for p in plist], batch_size=batch_size)
        index = cls(plist, vectors, _embedder_info(embedder))
        index._encoder = enc
        return index

    @classmethod
    def from_vectors(cls, passages: Any, vectors: Any, embedder: str = "minilm-l6") -> DocumentIndex:
        """Wrap vectors a caller already holds (their vector store), made by the same ``embedder`` over
        the passage texts. Rows are L2-normalised; non-finite or zero rows are refused."""
        plist = coerce_passages(passages)
        v = torch.as_tensor(vectors, dtype=torch.float32)
        if v.dim() != 2 or v.shape[0] != len(plist):
            raise InputError(f"vectors have shape {tuple(v.shape)}; expected [{len(plist)}, dim], one row a passage")
        norms = v.norm(dim=-1)
        if not torch.isfinite(v).all() or bool((norms < 1e-8).any()):
            raise InputError("vectors hold non-finite or all-zero rows; re-embed those passages")
        keep: dict[str, int] = {}
        for i, p in enumerate(plist):
            keep.setdefault(text_key(p.text), i)
        rows = list(keep.values())
        return cls([plist[i] for i in rows], v[rows] / norms[rows, None], _embedder_info(embedder))

    # -- lookup and search -----------------------------------------------------------------------------
    def lookup(self, texts: Sequence[str]) -> tuple[torch.Tensor, list[bool]]:
        """Stored vectors of ``texts``: ``[len(texts), dim]`` (zeros where missing) and a hit mask."""
        out = torch.zeros(len(texts), self.dim)
        hits = []
        for i, t in enumerate(texts):
            row = self._row.get(text_key(t))
            hits.append(row is not None)
            if row is not None:
                out[i] = self.vectors[row]
        return out, hits

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosine top-``k`` of unit-norm ``queries`` ``[q, dim]``: scores and row indices, each ``[q, k]``,
        best first (ties broken by the lower row)."""
        if queries.dim() != 2 or queries.shape[1] != self.dim:
            raise InputError(f"query vectors have shape {tuple(queries.shape)}; the index dim is {self.dim}")
        if k < 1:
            raise InputError(f"k must be >= 1, got {k}")
        scores = queries.float() @ self.vectors.T
        k = min(k, len(self))
        # stable sort keeps ties in row order, so retrieval is deterministic
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
        return scores.gather(1, order), order

    def retrieve(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages per query string; only the queries are encoded."""
        if self._encoder is None:
            from .embed import get_embedder

            self._encoder = get_embedder(self._embedder_name())
        q = self._encoder.encode(list(queries))
        _, idx = self.search(q, k)
        return [[self.passages[int(j)] for j in row] for row in idx]

    def _embedder_name(self) -> str:
        from .models import NAMED_MODELS

        name = self.embedder["id"]
        if name not in NAMED_MODELS:
            raise InputError(f"index embedder {name!r} is a local folder; encode queries yourself and call search()")
        return name

    def check_embedder(self, embedder: dict[str, Any]) -> None:
        """Refuse vectors from another embedder than ``embedder`` ({id, sha256}), the one its reader expects (for
        ``xrag``, the embedder its bridge was trained on)."""
        if self.embedder.get("sha256") != embedder.get("sha256"):
            raise BaseModelMismatchError(
                f"the index was embedded with {self.embedder.get('id')!r} (sha256 {str(self.embedder.get('sha256'))[:12]}...)"
                f" but its reader expects {embedder.get('id')!r} (sha256 {str(embedder.get('sha256'))[:12]}...); "
                "rebuild the index with that embedder")

    # -- disk ------------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write atomically (temp folder + rename, replacing an old index)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        with atomic_folder(directory) as tmp:
            save_file({"embeddings": self.vectors}, str(tmp / _VECTORS))
            with open(tmp / _PASSAGES, "w", encoding="utf-8") as f:
                for k, p in zip(self.keys, self.passages):
                    f.write(json.dumps({"sha256": k, "text": p.text, "title": p.title, "id": p.id}) + "\n")
            manifest = {"type": "ragpress-index", "format_version": INDEX_FORMAT_VERSION, "embedder": self.embedder,
                        "count": len(self)}
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> DocumentIndex:
        """Read an index folder; refuse a corrupt or newer one, naming the reason."""
        from safetensors.torch import load_file

        directory = Path(directory)
        try:
            manifest = json.loads((directory / _MANIFEST).read_text())
            vectors = load_file(str(directory / _VECTORS))["embeddings"]
            rows = [json.loads(line) for line in (directory / _PASSAGES).read_text(encoding="utf-8").splitlines()
                    if line.strip()]
        except FileNotFoundError as e:
            raise ArtifactError(f"index {directory} is incomplete: {e.filename} is missing") from None
        except Exception as e:
            raise ArtifactError(f"index {directory} is corrupt: {e}") from None
        if manifest.get("type") != "ragpress-index":
            raise ArtifactError(f"{directory} is not a ragpress index (type {manifest.get('type')!r})")
        if not isinstance(manifest.get("format_version"), int) or manifest["format_version"] > INDEX_FORMAT_VERSION:
            raise ArtifactError(f"index {directory} has format_version {manifest.get('format_version')!r}; this "
                                f"ragpress reads up to {INDEX_FORMAT_VERSION}")
        if not (manifest.get("count") == len(rows) == vectors.shape[0]):
            raise ArtifactError(f"index {directory} is corrupt: {manifest.get('count')} in the manifest, {len(rows)} "
                                f"passages, {vectors.shape[0]} vectors")
        passages = [Passage(text=r["text"], title=r.get("title"), id=r.get("id")) for r in rows]
        bad = [i for i, (r, p) in enumerate(zip(rows, passages)) if r.get("sha256") != text_key(p.text)]
        if bad:
            raise ArtifactError(f"index {directory} is corrupt: passages {bad[:5]} do not match their sha256")
        return cls(passages, vectors, {k: v for k, v in manifest["embedder"].items() if k != "dim"})


def cached_index(name: str, passages: Any, embedder: str = "minilm-l6", root: str | Path | None = None,
                 batch_size: int = 64) -> tuple[DocumentIndex, Path, bool]:
    """Build once, then reuse: ``(index, folder, built_now)``. The folder under ``root`` (default
    ``$RAGPRESS_HOME/indexes``) is named by ``name`` and a hash of the embedder weights and the distinct
    passage texts in order, so a changed corpus or embedder gets a new index instead of stale vectors."""
    from .models import ragpress_home

    plist = DocumentIndex._dedup(passages)
    info = _embedder_info(embedder)
    h = hashlib.sha256(info["sha256"].encode())
    for p in plist:
        h.update(text_key(p.text).encode())
    folder = Path(root) if root is not None else ragpress_home() / "indexes"
    folder = folder / f"{name}-{info['id']}-{h.hexdigest()[:16]}"
    if (folder / _MANIFEST).exists():
        index = DocumentIndex.load(folder)
        index.check_embedder(info)
        return index, folder, False
    index = DocumentIndex.build(plist, embedder, batch_size=batch_size)
    index.save(folder)
    return index, folder, True
