"""llmlingua 0.2.2's ``PromptCompressor``, made to run offline on transformers 5, with its algorithm untouched.

Three adaptations, nothing else (every other method, threshold and ranking rule is llmlingua's own code):

1. **Offline start-up.** ``PromptCompressor.__init__`` calls ``tiktoken.encoding_for_model("gpt-3.5-turbo")``,
   which downloads the cl100k BPE file. On the LongLLMLingua path that encoding only *reports* sizes
   (``origin_tokens``/``compressed_tokens`` in its result dict); every budget decision uses the scorer's own
   HF tokenizer. :class:`OfflinePromptCompressor` swaps ``tiktoken.encoding_for_model`` for the duration of
   the constructor and then sets ``oai_tokenizer`` to :class:`LocalEncoding` (the decoder's token counter), so
   the reported sizes are in the decoder's tokens. The scorer loads through llmlingua's own ``load_model``
   from a local folder with ``local_files_only=True``: no hub, no network.
2. **Key/value cache.** ``get_ppl`` passes legacy ``[(key, value), ...]`` lists to the model and
   ``iterative_compress_prompt`` slices what comes back as such lists; transformers 5 only takes and returns
   ``Cache`` objects. :class:`LegacyCacheLM` wraps the model: legacy lists in are turned into a
   ``DynamicCache`` holding the same tensors, the returned cache is turned back into a list of
   ``(key, value)`` tensors. Same tensors, same positions, same logits as with transformers 4.
3. **Provenance (observation only).** To map the compressed text back to passages and character spans,
   three methods are wrapped without changing what they return: ``control_context_budget`` records which
   passages survived the coarse filter and its ranking; ``iterative_compress_prompt`` records the exact
   text and token ids it compresses; ``get_compressed_input`` (a pure function of its arguments) is run a
   second time on a tensor of original token positions in place of the ids, so the kept positions follow the
   kept ids exactly. The kept ids are checked against ``ids[positions]`` after every call.

Unsupported here: llmlingua's KV-cache eviction path, taken only when question + kept passages exceed the
scorer's ``max_position_embeddings`` (8,192 for SmolLM2); it is detected and raised as an InputError.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tiktoken
import torch
from llmlingua.prompt_compressor import PromptCompressor
from transformers import DynamicCache

from ..errors import InputError

__all__ = ["OfflinePromptCompressor", "LocalEncoding", "LegacyCacheLM", "Trace"]

_TIKTOKEN_LOCK = threading.Lock()


class LocalEncoding:
    """Stands in for a tiktoken ``Encoding``: ``encode(text) -> ids``, here the decoder's tokenizer."""

    def __init__(self, encode: Callable[[str], Sequence[int]], name: str = "local") -> None:
        self._encode, self.name = encode, name

    def encode(self, text: str, **_: Any) -> list[int]:
        return list(self._encode(text))


class LegacyCacheLM:
    """Model proxy accepting and returning legacy ``[(key, value), ...]`` caches (llmlingua 0.2.2's form)
    around a transformers-5 causal LM (``Cache`` objects). Attribute access passes through."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, *args: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        if past_key_values is not None and not isinstance(past_key_values, DynamicCache):
            past_key_values = DynamicCache([(k, v) for k, v in past_key_values], config=self._model.config)
        out = self._model(*args, past_key_values=past_key_values, **kwargs)
        if out.past_key_values is not None:
            out.past_key_values = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return out


@dataclass
class Trace:
    """What one ``compress_prompt`` call kept. ``parts`` are the texts llmlingua joined with ``"\\n\\n"``
    (the question prefix first when ``start`` > 0); ``kept`` are positions into ``ids``/``offsets``."""

    used: list[int] = field(default_factory=list)  # passages kept by the coarse filter, in input order
    ranking: list[int] = field(default_factory=list)  # coarse ranking, best first (all passages)
    parts: list[str] = field(default_factory=list)
    start: int = 0
    text: str = ""
    ids: list[int] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)


class OfflinePromptCompressor(PromptCompressor):
    """llmlingua's ``PromptCompressor`` (LongLLMLingua path) with the adaptations in the module docstring."""

    def __init__(self, model_path: str | Path, dtype: str, encoding: LocalEncoding) -> None:
        with _TIKTOKEN_LOCK:  # the swap is process-wide while the constructor runs
            real = tiktoken.encoding_for_model
            tiktoken.encoding_for_model = lambda _name: encoding
            try:
                super().__init__(
                    model_name=str(model_path), device_map="cpu",
                    model_config={"torch_dtype": getattr(torch, dtype), "local_files_only": True,
                                  "trust_remote_code": False},
                )
            finally:
                tiktoken.encoding_for_model = real
        self.oai_tokenizer = encoding
        self.model = LegacyCacheLM(self.model)
        self.trace: Trace | None = None
        self._positions: torch.Tensor | None = None

    def compress_traced(self, contexts: list[str], question: str, target_token: int, **settings: Any
                        ) -> tuple[dict[str, Any], Trace]:
        """Run ``compress_prompt`` and return its result with the provenance of every kept token."""
        self.context_idxs = []  # llmlingua appends a ranking per call and never clears it
        self.trace = Trace(used=list(range(len(contexts))), ranking=list(range(len(contexts))))
        try:
            result = self.compress_prompt(contexts, question=question, target_token=target_token, **settings)
            trace = self.trace
        finally:
            self.trace, self._positions = None, None
        if not trace.ids:
            raise RuntimeError("llmlingua did not run its token-level pass; no provenance was recorded")
        return result, trace

    # -- observation wrappers (3. in the module docstring) -------------------------------------------------
    def control_context_budget(self, context, *args, **kwargs):
        res, dynamic_ratio, used = super().control_context_budget(context, *args, **kwargs)
        if self.trace is not None:
            self.trace.used = list(used)
            self.trace.ranking = list(self.context_idxs[-1])
        return res, dynamic_ratio, used

    def iterative_compress_prompt(self, context, *args, **kwargs):
        if self.trace is None:
            return super().iterative_compress_prompt(context, *args, **kwargs)
        start = kwargs.get("start", 0)
        text = "\n\n".join(context)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        if len(ids) >= self.max_position_embeddings:
            raise InputError(
                f"question + kept passages are {len(ids)} scorer tokens, beyond the scorer's "
                f"{self.max_position_embeddings} positions (llmlingua's KV-eviction path is not supported "
                "here); pass fewer or shorter passages"
            )
        self.trace.parts, self.trace.start, self.trace.text = list(context), start, text
        self.trace.ids, self.trace.offsets = ids, [tuple(o) for o in enc["offset_mapping"]]
        self._positions = torch.arange(len(ids), device=self.device).unsqueeze(0)
        out_ids, out_mask = super().iterative_compress_prompt(context, *args, **kwargs)
        kept = self._positions[0, start:].tolist()
        if out_ids.shape[1] != len(kept) or out_ids[0].tolist() != [ids[p] for p in kept]:
            raise RuntimeError("lost track of llmlingua's kept tokens (its ids differ from ids[positions])")
        self.trace.kept = kept
        return out_ids, out_mask

    def get_compressed_input(self, loss, input_ids, attention_mask, *args, **kwargs):
        if self._positions is None:
            return super().get_compressed_input(loss, input_ids, attention_mask, *args, **kwargs)
        if self._positions.shape != input_ids.shape or kwargs.get("keep_flag") is not None:
            raise RuntimeError("llmlingua took a code path the provenance tracking does not cover "
                               "(KV eviction or keep_split)")
        # The method updates its ``end`` argument in place (``end -= ...`` on a tensor): the replay gets
        # copies of every tensor argument as they were before the real call, which runs exactly as upstream.
        snap = [_copy(a) for a in (loss, attention_mask, *args)], {k: _copy(v) for k, v in kwargs.items()}
        out = super().get_compressed_input(loss, input_ids, attention_mask, *args, **kwargs)
        (loss_, mask_, *args_), kwargs_ = snap
        self._positions = super().get_compressed_input(loss_, self._positions, mask_, *args_, **kwargs_)[0]
        return out


def _copy(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x
