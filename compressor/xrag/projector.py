"""The xRAG bridge: one retriever embedding -> one row in the decoder's input-embedding space.

Paper: Cheng et al. 2024, "xRAG: Extreme Context Compression for Retrieval-augmented Generation with One
Token". Their projector is a two-layer MLP with GELU (``mlp2x_gelu``); here ``[n, embedder_dim]`` (unit-norm
MiniLM vectors, 384-d) -> ``[n, decoder_hidden]`` (576 for SmolLM2-135M).

Initialisation matters because the decoder only ever saw rows of its own embedding table: a freshly
initialised bridge is rescaled (:meth:`Bridge.calibrate_`) so that the mean norm of its outputs equals the
mean norm of the decoder's input-embedding rows (taken through the embedding module, so a scaled table
such as Gemma's ``sqrt(hidden)`` is matched in its scaled form).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Bridge", "BRIDGE_KEYS", "INPUT_KEYS", "embedding_row_norm"]

BRIDGE_KEYS = frozenset({"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
# Format 2 adds the input standardisation (a format-1 bridge reads unit-norm MiniLM vectors as they are).
INPUT_KEYS = frozenset({"in_mean", "in_std"})


class Bridge(nn.Module):
    """``standardise -> Linear(in_dim, width) -> GELU -> Linear(width, per_input * out_dim)``; fp32. With
    ``residual`` (inputs that already are decoder rows: the soft encoder's slots) the input is added back and
    ``fc2`` starts at zero, so the untrained bridge is the identity.

    Each input vector gives ``per_input`` rows of width ``out_dim`` (a single MiniLM vector can be asked for
    several rows; the decoder source gives one pooled vector per row, ``per_input`` 1). ``in_mean``/``in_std``
    standardise each input feature (set once from training inputs by :meth:`standardise_`; identity by
    default): a decoder's hidden states carry a few channels of huge, nearly constant activations that would
    otherwise swamp the rest."""

    def __init__(self, in_dim: int, width: int, out_dim: int, per_input: int = 1, residual: bool = False) -> None:
        super().__init__()
        self.in_dim, self.width, self.out_dim, self.per_input = int(in_dim), int(width), int(out_dim), int(per_input)
        self.residual = bool(residual)
        if residual and (in_dim != out_dim or per_input != 1):
            raise ValueError(f"a residual bridge maps each input to one row of the same width, not {in_dim} -> "
                             f"{per_input} x {out_dim}")
        self.register_buffer("in_mean", torch.zeros(self.in_dim))
        self.register_buffer("in_std", torch.ones(self.in_dim))
        self.fc1 = nn.Linear(self.in_dim, self.width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(self.width, self.out_dim * self.per_input)
        if residual:  # starts as the identity: the input rows already are rows the decoder reads
            with torch.no_grad():
                self.fc2.weight.zero_()
                self.fc2.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[..., in_dim]`` -> ``[..., per_input * out_dim]`` (fp32)."""
        if x.shape[-1] != self.in_dim:
            raise ValueError(f"bridge input has width {x.shape[-1]}, expected {self.in_dim} (the source's dim)")
        y = self.fc2(self.act(self.fc1((x.float() - self.in_mean) / self.in_std)))
        return x.float() + y if self.residual else y

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[n, m, in_dim]`` (m input vectors per passage) -> ``[n, m * per_input, out_dim]``."""
        return self(x).reshape(x.shape[0], -1, self.out_dim)

    @torch.no_grad()
    def standardise_(self, inputs: torch.Tensor) -> None:
        """Set the input standardisation from ``[n, in_dim]`` training inputs (std floored at 1e-4 of its mean)."""
        x = inputs.float().reshape(-1, self.in_dim)
        std = x.std(0)
        self.in_mean.copy_(x.mean(0))
        self.in_std.copy_(std.clamp(min=float(std.mean()) * 1e-4 + 1e-12))

    @torch.no_grad()
    def calibrate_(self, inputs: torch.Tensor, target_norm: float) -> float:
        """Scale ``fc2`` so that the mean L2 norm of ``self(inputs)`` is ``target_norm``; return the factor.

        ``inputs``: ``[n, in_dim]``, real passage embeddings where available (they sit in a narrow cone of
        the sphere, unlike random vectors)."""
        if target_norm <= 0:
            raise ValueError(f"target_norm must be positive, got {target_norm}")
        current = float(self(inputs).reshape(-1, self.out_dim).norm(dim=-1).mean())
        factor = target_norm / max(current, 1e-12)
        self.fc2.weight.mul_(factor)
        self.fc2.bias.mul_(factor)
        return factor

    def tensors(self) -> dict[str, torch.Tensor]:
        """The bridge's tensors, fp32, contiguous, keyed as in :data:`BRIDGE_KEYS` and :data:`INPUT_KEYS`."""
        return {k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()}


@torch.no_grad()
def embedding_row_norm(model: nn.Module, sample: int = 8192, seed: int = 0) -> float:
    """Mean L2 norm of the decoder's input-embedding rows, through the embedding module (so any input
    scaling is included), over a seeded sample of ``sample`` token ids."""
    emb = model.get_input_embeddings()
    vocab = int(emb.weight.shape[0])
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab, generator=g)[: min(sample, vocab)].to(emb.weight.device)
    return float(emb(ids).float().norm(dim=-1).mean())
