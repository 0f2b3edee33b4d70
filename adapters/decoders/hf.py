"""The transformers backend: CPU or GPU, ``inputs_embeds`` when soft rows are present, batched with left padding,
greedy or seeded sampling, stop strings, last-token logits only."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from compressor.base import DecoderAdapter
from compressor.errors import ArtifactError, InputError
from compressor.prompt import Prompt, embed_prompt

from .base import (
    DecoderBackend,
    Generation,
    GenerationParams,
    GenerationStopped,
    _cut_at_stop,
    _stream_safe_len,
)

__all__ = ["HFBackend"]


class HFBackend(DecoderBackend):
    """A transformers causal LM. Build from a name/folder with :meth:`load` or wrap a loaded model."""

    def __init__(self, model: Any, tokenizer: Any, model_name: str = "custom") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        eos = set()
        for src in (getattr(model, "generation_config", None), tokenizer):
            e = getattr(src, "eos_token_id", None)
            if e is not None:
                eos.update(e if isinstance(e, (list, tuple)) else [e])
        self.eos_ids = eos
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (min(eos) if eos else 0)

    @classmethod
    def load(cls, name_or_path: str = "smollm2-135m-instruct", dtype: str = "bfloat16", device: str = "cpu") -> HFBackend:
        from compressor.models import load_causal_lm

        model, tok = load_causal_lm(name_or_path, dtype=dtype, device=device)
        return cls(model, tok, model_name=str(name_or_path))

    def with_adapter(self, adapter: DecoderAdapter) -> HFBackend:
        """A copy of this decoder with ``adapter``'s LoRA injected, unmerged (the numerics it was trained with:
        base weights as loaded, LoRA in fp32)."""
        import copy

        import torch
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        peft_model = get_peft_model(copy.deepcopy(self.model), LoraConfig(**adapter.lora))
        res = set_peft_model_state_dict(peft_model, {k: torch.as_tensor(v) for k, v in adapter.tensors.items()})
        if getattr(res, "unexpected_keys", None):
            raise ArtifactError(f"decoder adapter {adapter.name} does not fit {self.model_name}: unexpected "
                                f"{res.unexpected_keys[:3]}")
        peft_model.eval()
        return HFBackend(peft_model.base_model.model, self.tokenizer, model_name=f"{self.model_name}+{adapter.name}")

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.get_text_config().hidden_size)

    def _batch_inputs(self, prompts: Sequence[Prompt]) -> dict[str, Any]:
        import torch

        device = self.model.get_input_embeddings().weight.device
        lens = [len(p) for p in prompts]
        if min(lens) == 0:
            raise InputError("a prompt is empty")
        L = max(lens)
        mask = torch.zeros(len(prompts), L, dtype=torch.long, device=device)
        for i, n in enumerate(lens):
            mask[i, L - n:] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        if not any(p.has_soft for p in prompts):
            ids = torch.full((len(prompts), L), self.pad_id, dtype=torch.long, device=device)
            for i, p in enumerate(prompts):
                ids[i, L - lens[i]:] = torch.tensor(p.token_ids, device=device)
            return {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
        pad_row = self.model.get_input_embeddings()(torch.tensor([self.pad_id], device=device))[0]
        rows = []
        for p, n in zip(prompts, lens):
            e = embed_prompt(self.model, p)
            if e.shape[-1] != self.hidden_size:
                raise InputError(f"soft rows have width {e.shape[-1]}, the decoder's hidden size is {self.hidden_size}")
            rows.append(torch.cat([pad_row.expand(L - n, -1), e], dim=0) if n < L else e)
        return {"inputs_embeds": torch.stack(rows), "attention_mask": mask, "position_ids": pos}

    def generate(self, prompts: Sequence[Prompt], params: GenerationParams | None = None,
                 stop: Callable[[], bool] | None = None) -> list[Generation]:
        """``stop``: checked after every new token; when it returns True the decode loop ends by raising
        :class:`GenerationStopped` (a caller's deadline passed, its clients left)."""
        if stop is None:
            return self._generate(prompts, params or GenerationParams(), None)

        def check(i: int, text: str, done: bool) -> None:
            if stop():
                raise GenerationStopped()

        return self._generate(prompts, params or GenerationParams(), check)

    def stream(self, prompt: Prompt, params: GenerationParams | None = None,
               on_delta: Callable[[str], None] | None = None) -> Generation:
        params = params or GenerationParams()
        stops = tuple(params.stop) if params.stop is not None else prompt.stop
        sent = ""

        def on_token(i: int, text: str, done: bool) -> None:
            nonlocal sent
            safe = text if done else text[: _stream_safe_len(text, stops)]
            delta = safe[len(sent):] if safe.startswith(sent) else ""
            sent += delta
            if on_delta is not None:
                on_delta(delta)

        g = self._generate([prompt], params, on_token)[0]
        tail = g.text[len(sent):] if g.text.startswith(sent) else ""
        if tail and on_delta is not None:
            on_delta(tail)
        return g

    def _generate(self, prompts: Sequence[Prompt], params: GenerationParams,
                  on_token: Callable[[int, str, bool], None] | None) -> list[Generation]:
        """The decode loop; ``on_token(row, text_so_far, done)`` runs after every generated token."""
        import torch

        if not prompts:
            return []
        t0 = time.perf_counter()
        gen = None
        if params.temperature > 0:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(params.seed if params.seed is not None else 0)
        with torch.inference_mode():
            inputs = self._batch_inputs(prompts)
            mask, pos = inputs["attention_mask"], inputs["position_ids"]
            out = self.model(**inputs, use_cache=True, logits_to_keep=1)
            B = len(prompts)
            tokens: list[list[int]] = [[] for _ in range(B)]
            texts = [""] * B
            done = [False] * B
            reasons = ["length"] * B
            stops = [tuple(params.stop) if params.stop is not None else p.stop for p in prompts]
            ttft = None
            for step in range(params.max_new_tokens):
                nxt = self._pick(out.logits[:, -1, :], params, gen)
                if ttft is None:
                    ttft = time.perf_counter() - t0
                for i in range(B):
                    if done[i]:
                        continue
                    t = int(nxt[i])
                    if t in self.eos_ids:
                        done[i], reasons[i] = True, "stop"
                        continue
                    tokens[i].append(t)
                    texts[i] = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
                    cut, hit = _cut_at_stop(texts[i], stops[i])
                    if hit:
                        texts[i], done[i], reasons[i] = cut, True, "stop"
                    if on_token is not None:
                        on_token(i, texts[i], done[i])
                if all(done) or step == params.max_new_tokens - 1:
                    break
                mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
                pos = pos[:, -1:] + 1
                out = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos,
                                 past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        e2e = time.perf_counter() - t0
        return [
            Generation(text=texts[i], token_ids=tokens[i], prompt_tokens=len(prompts[i]), finish_reason=reasons[i],
                       ttft_s=ttft or e2e, e2e_s=e2e)
            for i in range(B)
        ]

    @staticmethod
    def _pick(logits: Any, params: GenerationParams, gen: Any) -> Any:
        import torch

        if params.temperature <= 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sp, si = probs.sort(dim=-1, descending=True)
            keep = sp.cumsum(-1) - sp < params.top_p
            sp = sp * keep
            probs = torch.zeros_like(probs).scatter(-1, si, sp)
        return torch.multinomial(probs.cpu(), 1, generator=gen)[:, 0].to(logits.device)
