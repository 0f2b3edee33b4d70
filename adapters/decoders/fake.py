"""A deterministic decoder for fast tests of everything around the decoder."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from compressor.prompt import Prompt

from .base import DecoderBackend, Generation, GenerationParams

__all__ = ["FakeBackend"]


class FakeBackend(DecoderBackend):
    """Deterministic stand-in for tests: answers with a fixed ``reply`` (default: the prompt's row count).
    Uses a real tokenizer so token counts are real; records every prompt in ``calls``."""

    def __init__(self, tokenizer: Any, reply: str | None = None, model_name: str = "fake") -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.model_name = model_name
        self.calls: list[Prompt] = []

    def generate(self, prompts: Sequence[Prompt], params: GenerationParams | None = None) -> list[Generation]:
        params = params or GenerationParams()
        out = []
        for p in prompts:
            self.calls.append(p)
            t0 = time.perf_counter()
            text = self.reply if self.reply is not None else f"{len(p)} prompt rows"
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: params.max_new_tokens]
            text = self.tokenizer.decode(ids)
            dt = time.perf_counter() - t0
            out.append(Generation(text=text, token_ids=ids, prompt_tokens=len(p), finish_reason="stop",
                                  ttft_s=dt, e2e_s=dt))
        return out
