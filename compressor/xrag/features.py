"""A bridge input from the decoder's own family: its frozen hidden states of the passage.

xRAG's retriever vector (MiniLM, 384-d) carried nothing a 135M decoder could read (``docs/experiments/xrag.md``).
The decoder's own hidden states at a middle layer are a vector in the space the decoder already computes in,
and they hold the passage's tokens and entities. :class:`DecoderSource` runs the frozen decoder over a passage
alone, stops after ``layer`` (the later layers are never computed), drops the first token (its hidden state is
the attention sink's, huge and the same for every passage) and mean-pools the rest over ``pieces`` equal runs
of tokens: one ``[hidden]`` vector per soft row, in the passage's order.

Shapes: ``texts`` n -> ``[n, pieces, hidden]`` fp32. Computed once per passage (index time); the bridge maps
each vector to one row.

:class:`EncoderSource` reads a trained soft encoder instead (an ``icae`` artifact: a LoRA-adapted copy of the
decoder whose memory slots the frozen decoder reads): the passage's tokens are split into ``runs`` near-equal
runs and each run is read with ``per_run`` memory rows after it, whatever its length; ``[runs * per_run,
hidden]`` per passage (with ``source_finetune`` its trainable part is trained with the bridge, by :meth:`slots`,
which keeps autograd on). Unlike pooled states these already are rows the decoder reads (at 28x, untrained,
they answer NQ questions the zeroed rows do not: ``docs/experiments/xrag.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["DecoderSource", "EncoderSource", "load_encoder_source", "pool_pieces", "split_runs"]


class _Stop(Exception):
    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


def pool_pieces(h: torch.Tensor, n: int, pieces: int) -> torch.Tensor:
    """Mean of ``h[:n]`` (``[L, hidden]``) over ``pieces`` contiguous, near-equal runs of positions, the first
    position left out when there are more positions than pieces. A run never is empty: a passage of fewer
    tokens than pieces repeats its last ones. Returns ``[pieces, hidden]`` fp32."""
    start = 1 if n > pieces else 0
    m = n - start
    out = []
    for k in range(pieces):
        a = start + (k * m) // pieces
        b = start + ((k + 1) * m) // pieces
        a, b = min(a, n - 1), max(min(b, n), min(a, n - 1) + 1)
        out.append(h[a:b].float().mean(0))
    return torch.stack(out)


def _layers(model: Any) -> Any:
    for path in ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return obj
    raise ConfigError(f"cannot find the decoder layers of {type(model).__name__}; use source=embedder")


class DecoderSource:
    """The frozen decoder's hidden states after layer ``layer`` (0: the input embeddings), pooled into
    ``pieces`` vectors per passage (see :func:`pool_pieces`)."""

    def __init__(self, model: Any, tokenizer: Any, layer: int, pieces: int, batch_size: int = 16) -> None:
        n_layers = len(_layers(model))
        if not 0 <= layer <= n_layers:
            raise ConfigError(f"source_layer={layer}: this decoder has {n_layers} layers; choose 0..{n_layers}")
        self.model, self.tokenizer, self.layer, self.pieces, self.batch_size = model, tokenizer, layer, pieces, batch_size
        self.dim = int(model.get_input_embeddings().weight.shape[1])

    def tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _hidden(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.layer == 0:
            return self.model.get_input_embeddings()(ids)

        def stop(_module: Any, _args: Any, output: Any) -> None:
            raise _Stop(output[0] if isinstance(output, tuple) else output)

        handle = _layers(self.model)[self.layer - 1].register_forward_hook(stop)
        try:
            self.model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
        except _Stop as s:
            return s.hidden
        finally:
            handle.remove()
        raise RuntimeError("the decoder returned without reaching the hooked layer")

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """``[len(texts), pieces, hidden]`` fp32, in the order of ``texts`` (batched by length)."""
        out = torch.empty(len(texts), self.pieces, self.dim)
        toks = [self.tokens(t) for t in texts]
        empty = [i for i, t in enumerate(toks) if not t]
        if empty:
            raise ConfigError(f"passage {empty[0]} has no tokens: nothing to encode")
        dev = self.model.get_input_embeddings().weight.device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        order = sorted(range(len(texts)), key=lambda i: len(toks[i]))
        for c in range(0, len(order), self.batch_size):
            rows = order[c: c + self.batch_size]
            L = max(len(toks[i]) for i in rows)
            ids = torch.full((len(rows), L), pad, dtype=torch.long, device=dev)
            mask = torch.zeros(len(rows), L, dtype=torch.long, device=dev)
            for b, i in enumerate(rows):  # right padding: positions 0..n-1 are the passage's, as alone
                ids[b, : len(toks[i])] = torch.tensor(toks[i], device=dev)
                mask[b, : len(toks[i])] = 1
            h = self._hidden(ids, mask)
            for b, i in enumerate(rows):
                out[i] = pool_pieces(h[b], len(toks[i]), self.pieces).cpu()
        return out


def split_runs(ids: Sequence[int], runs: int) -> list[list[int]]:
    """``ids`` cut into ``runs`` contiguous, near-equal runs, in order; never an empty run (a passage of fewer
    tokens than runs repeats its last token)."""
    n = len(ids)
    out = []
    for k in range(runs):
        a = min((k * n) // runs, n - 1)
        b = max(((k + 1) * n) // runs, a + 1)
        out.append(list(ids[a:b]))
    return out


class EncoderSource:
    """The memory slots of a trained soft encoder (``icae``) for each passage: ``runs`` equal runs of its
    tokens, ``per_run`` slots each (see :func:`split_runs`); ``encoder`` an
    :class:`~compressor.icae.model.ICAECompressor`, ``artifact_id`` its tensors' hash."""

    def __init__(self, encoder: Any, runs: int, per_run: int, batch_size: int = 16) -> None:
        if not 1 <= per_run <= encoder.config.max_slots:
            raise ConfigError(f"{per_run} slots a run: the encoder {encoder.artifact_id[:12]} has "
                              f"{encoder.config.max_slots} memory rows; lower rows or raise source_runs")
        self.comp, self.runs, self.per_run, self.batch_size = encoder, runs, per_run, batch_size
        self.dim = int(encoder.encoder.hidden)
        self.artifact_id = encoder.artifact_id

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """``[len(texts), runs * per_run, hidden]`` fp32, in the order of ``texts`` (runs batched by length)."""
        return self.slots(texts)

    def slots(self, texts: Sequence[str]) -> torch.Tensor:
        """:meth:`encode` with autograd on: training with ``source_finetune`` back-propagates into the encoder."""
        tok = self.comp.tokenizer
        ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        empty = [i for i, t in enumerate(ids) if not t]
        if empty:
            raise ConfigError(f"passage {empty[0]} has no tokens: nothing to encode")
        flat = [(i, k, run) for i, t in enumerate(ids) for k, run in enumerate(split_runs(t, self.runs))]
        flat.sort(key=lambda x: len(x[2]))
        out: list[list[torch.Tensor | None]] = [[None] * self.runs for _ in texts]
        for c in range(0, len(flat), self.batch_size):
            chunk = flat[c: c + self.batch_size]
            for (i, k, _), slots in zip(chunk, self.comp.encoder.encode([r for _, _, r in chunk], slots=self.per_run),
                                        strict=True):
                out[i][k] = slots.float().cpu()
        return torch.stack([torch.cat(o, 0) for o in out])  # type: ignore[arg-type]


def load_encoder_source(config: Any, expect_id: str | None = None,
                        finetuned: dict[str, Any] | None = None) -> EncoderSource:
    """The encoder ``config.source_encoder`` names (``shipped``: the shipped ``icae`` artifact), on
    ``config.decoder``; with ``expect_id``, refused unless its hash is the one the bridge was trained on;
    ``finetuned``: the encoder's trainable tensors as the bridge's training left them (``source_finetune``),
    loaded over the base encoder's."""
    from ..errors import ArtifactError
    from ..icae.config import SHIPPED_ARTIFACT
    from ..icae.model import ICAECompressor

    path = SHIPPED_ARTIFACT if config.source_encoder == "shipped" else config.source_encoder
    comp = ICAECompressor.from_pretrained(path, base=config.decoder, dtype=config.source_dtype)
    if expect_id is not None and comp.artifact_id != expect_id:
        raise ArtifactError(f"source_encoder={config.source_encoder!r} is encoder {comp.artifact_id[:12]}, but this "
                            f"bridge was trained on the slots of encoder {expect_id[:12]}: pass the encoder it was "
                            "trained with (source_encoder) or retrain the bridge")
    if finetuned:  # XRAGCompressor checks that they are given exactly when source_finetune is on
        comp.encoder.load_trainable(finetuned, ("encoder",))
    comp.encoder.eval()
    return EncoderSource(comp, config.source_runs, config.rows // config.source_runs, config.embed_batch_size)
