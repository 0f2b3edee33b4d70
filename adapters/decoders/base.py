"""Decoder backends: one seam, several transports (like httpx transports). This module holds the seam;
each transport has its own module beside it:

* :class:`~adapters.decoders.hf.HFBackend`: transformers, CPU or GPU; ``inputs_embeds`` when soft rows are present; batched with
  left padding; greedy or seeded sampling; stop strings; last-token logits only.
* :class:`~adapters.decoders.fake.FakeBackend`: deterministic, no model; for fast tests of everything around the decoder.

Every backend takes :class:`~compressor.prompt.Prompt` objects and returns :class:`Generation` results with
the time to first token measured separately from the whole call. :meth:`DecoderBackend.stream` generates one
prompt while reporting text as it becomes final (token by token in :class:`HFBackend`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from compressor.base import Compressor, DecoderAdapter
from compressor.errors import ConfigError
from compressor.prompt import Prompt, PromptBuilder, PromptTemplate

__all__ = ["GenerationParams", "Generation", "GenerationStopped", "DecoderBackend"]


class GenerationStopped(Exception):  # noqa: N818 - a signal, not a failure
    """A backend's decode loop ended early because its caller's ``stop`` check said so."""


class GenerationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=32, ge=1, le=4096, description="Tokens to generate at most.")
    temperature: float = Field(default=0.0, ge=0.0, le=5.0, description="0 = greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, description="Seed for sampling.")
    stop: list[str] | None = Field(default=None, description="Stop strings; None uses the prompt's own.")


class Generation(BaseModel):
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    ttft_s: float
    e2e_s: float


class DecoderBackend(ABC):
    """A decoder that turns prompts into text. ``tokenizer`` counts tokens and builds prompts."""

    tokenizer: Any
    model_name: str

    def prompt_builder(self, template: PromptTemplate | None = None) -> PromptBuilder:
        return PromptBuilder(self.tokenizer, template)

    @property
    def hidden_size(self) -> int | None:
        return None

    def with_adapter(self, adapter: DecoderAdapter) -> DecoderBackend:
        """This decoder with a soft method's decoder LoRA applied (a new backend; this one is unchanged).
        Backends that cannot apply one say so."""
        raise ConfigError(f"the {type(self).__name__} decoder cannot apply the decoder LoRA adapter {adapter.name} "
                          "that this method was trained with; use the transformers backend (HFBackend) for it")

    @abstractmethod
    def generate(self, prompts: Sequence[Prompt], params: GenerationParams | None = None) -> list[Generation]:
        """Generate one continuation per prompt."""

    def stream(self, prompt: Prompt, params: GenerationParams | None = None,
               on_delta: Callable[[str], None] | None = None) -> Generation:
        """Generate one prompt, calling ``on_delta(text)`` with text as it becomes final; the deltas join to
        the returned ``Generation.text``. This default reports the whole text once at the end; backends that
        decode step by step call it after every token (possibly with ``""``), so an exception raised in
        ``on_delta`` stops the generation early (client gone, deadline passed)."""
        g = self.generate([prompt], params)[0]
        if on_delta is not None and g.text:
            on_delta(g.text)
        return g


def backend_for(backend: DecoderBackend, compressor: Compressor) -> DecoderBackend:
    """The decoder that reads ``compressor``'s output: ``backend`` itself, or a copy with the decoder LoRA the
    method was trained with (PISCO-style soft compressors)."""
    adapter = compressor.decoder_adapter()
    return backend if adapter is None else backend.with_adapter(adapter)


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i >= 0:
            cut = min(cut, i)
    return text[:cut], cut < len(text)


def _stream_safe_len(text: str, stops: Sequence[str]) -> int:
    """How much of a partial generation can be sent: not a trailing half character, nor a tail that may
    still become the start of a stop string."""
    n = len(text.rstrip("\ufffd"))
    cut = n
    for s in stops:
        for k in range(min(len(s) - 1, n), 0, -1):
            if text[:n].endswith(s[:k]):
                cut = min(cut, n - k)
                break
    return cut
