"""Static sentence embeddings distilled from a sentence embedder: no network pass at query time.

A sentence vector is the SIF-weighted mean of per-token vectors (Arora et al., 2017, "A simple but tough-to-beat
baseline for sentence embeddings"; the token vectors are read out of a contextual encoder as in Model2Vec). For
every token ``t`` of the base encoder's vocabulary the encoder reads the one-token text ``[CLS] t [SEP]`` and
``t``'s output row is kept; the frequency-weighted mean row is subtracted (the common direction every row shares),
and a token weighs ``a / (a + p(t))`` with ``p`` its frequency in English training text (the counts ship in
``compressor/data/``; a token they never saw weighs 1, a special token such as ``[UNK]`` 0). Unit-norm rows, as the base embedder's.

Trade-off against the base encoder (all-MiniLM-L6-v2): on training questions, the AUC of the
cosine to the question for evidence sentences is 0.81 / 0.89 (HotpotQA / NQ + 9) against 0.84 / 0.94, at about
a fortieth of the cost (a table lookup per token instead of six transformer layers per sentence). The table is
derived once from the base model on the user's machine (about 20 s on 2 CPU cores) and kept under
``$RAGPRESS_HOME/models/<name>``; its identity (``sha256``) is that of its inputs (base weights, counts, recipe),
so two machines agree on it without shipping the table.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["StaticEmbedder", "COUNTS_FILE", "derive_static", "is_static_folder"]

COUNTS_FILE = Path(__file__).parent / "data" / "token_counts_wordpiece.json.gz"
TABLE_FILE = "static.safetensors"
RECIPE = {"version": 2, "readout": "token row of [CLS] t [SEP]", "center": "frequency-weighted mean",
          "sif_a": 1e-3, "special_tokens": "weight 0"}


def is_static_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / TABLE_FILE).is_file()


class StaticEmbedder:
    """The :class:`~compressor.embed.Embedder` interface over a token table: ``encode(texts) -> [n, dim]``."""

    def __init__(self, table: Any, weights: Any, tokenizer: Any, name: str) -> None:
        self.table, self.weights, self.tokenizer, self.name = table, weights, tokenizer, name

    @classmethod
    def load(cls, folder: str | os.PathLike, name: str) -> StaticEmbedder:
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        t = load_file(str(Path(folder) / TABLE_FILE))
        return cls(t["table"], t["weights"], AutoTokenizer.from_pretrained(folder), name)

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def encode(self, texts: Sequence[str], batch_size: int = 0) -> Any:
        """Unit-norm rows in the order of ``texts`` (``batch_size`` is accepted for the common interface; the
        whole list is one lookup). Every token counts: nothing is truncated. An empty text gives a zero row."""
        import torch

        if not texts:
            return torch.zeros(0, self.dim)
        ids = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        flat = torch.tensor([i for row in ids for i in row], dtype=torch.long)
        offsets = torch.tensor([0, *torch.tensor([len(r) for r in ids]).cumsum(0).tolist()[:-1]], dtype=torch.long)
        v = torch.nn.functional.embedding_bag(flat, self.table, offsets, mode="sum",
                                              per_sample_weights=self.weights[flat])
        return torch.nn.functional.normalize(v, dim=-1)

    def similarity(self, query: str, docs: Sequence[str]) -> Any:
        """Cosine similarity of each doc's embedding to the query's: float64 numpy ``[len(docs)]``."""
        v = self.encode([query, *docs])
        return (v[1:] @ v[0]).numpy().astype("float64")


def _counts() -> tuple[dict[str, int], str]:
    raw = COUNTS_FILE.read_bytes()
    return json.loads(gzip.decompress(raw))["counts"], hashlib.sha256(raw).hexdigest()


def static_identity(base_sha256: str) -> str:
    """The sha256 a derived table is known by: of its base model's, the counts file's and the recipe."""
    _, counts_sha = _counts()
    blob = json.dumps({"base": base_sha256, "counts": counts_sha, "recipe": RECIPE}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def distill_table(model: Any, tokenizer: Any, counts: dict[str, int], batch_size: int = 1024) -> tuple[Any, Any]:
    """``(table [vocab, dim], weights [vocab])`` from a frozen encoder, as the module docstring says."""
    import torch

    vocab = len(tokenizer)
    # where one text token sits among the special tokens the tokenizer adds (BERT: [CLS] t [SEP])
    template = tokenizer("a")["input_ids"]
    inner = tokenizer("a", add_special_tokens=False)["input_ids"]
    if len(inner) != 1 or inner[0] not in template:
        raise ValueError(f"cannot place one token among {tokenizer.__class__.__name__}'s special tokens")
    pos = template.index(inner[0])
    rows = []
    with torch.inference_mode():
        for start in range(0, vocab, batch_size):
            ids = torch.arange(start, min(start + batch_size, vocab))
            inp = torch.tensor(template).repeat(len(ids), 1)
            inp[:, pos] = ids
            rows.append(model(input_ids=inp, attention_mask=torch.ones_like(inp)).last_hidden_state[:, pos].float())
    table = torch.cat(rows)
    freq = torch.tensor([float(counts.get(t, 0)) for t in tokenizer.convert_ids_to_tokens(list(range(vocab)))])
    p = freq / freq.sum().clamp(min=1.0)
    table = table - (p[:, None] * table).sum(0)
    weights = RECIPE["sif_a"] / (RECIPE["sif_a"] + p)
    weights[[i for i in tokenizer.all_special_ids if i < vocab]] = 0.0  # [UNK], [CLS], ...: say nothing of meaning
    return table.contiguous(), weights.contiguous()


def derive_static(name: str, base: str, final: Path) -> None:
    """Write the static embedder ``name`` distilled from the named/local encoder ``base`` into ``final``
    atomically (temp folder + rename; a lost race with another process is not an error)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    from .models import SOURCE_FILE, model_fingerprint, resolve_model, staged_folder

    src = resolve_model(base)
    with staged_folder(final) as tmp:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModel.from_pretrained(src, dtype=torch.float32).eval()
        counts, counts_sha = _counts()
        table, weights = distill_table(model, tok, counts)
        save_file({"table": table, "weights": weights}, str(tmp / TABLE_FILE))
        tok.save_pretrained(tmp)
        base_sha = model_fingerprint(base)
        (tmp / SOURCE_FILE).write_text(json.dumps(
            {"name": name, "source": f"static distillation of {base}", "base_sha256": base_sha,
             "counts_sha256": counts_sha, "recipe": RECIPE, "sha256": static_identity(base_sha)}, indent=2))
