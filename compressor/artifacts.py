"""Self-describing artifact folders shared by every trained family.

A folder holds ``compressor_config.json`` (type, format version, library version, base model id and hash,
family fields, training data and measured scores), ``model.safetensors`` (trainable tensors only) and a short
``README.md`` card. Never pickles: a folder holding a pickle-capable file (``*.bin``, ``*.pt``, ``*.pth``,
``*.pkl``, ``*.pickle``) is refused. Loading is strict: missing or unexpected tensors are listed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ArtifactError, BaseModelMismatchError

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "atomic_folder", "write_artifact", "read_artifact", "check_base_model"]

CONFIG_NAME = "compressor_config.json"
WEIGHTS_NAME = "model.safetensors"
_PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}


@contextlib.contextmanager
def atomic_folder(directory: str | Path) -> Iterator[Path]:
    """Yield a temp folder beside ``directory``; on success rename it into place (replacing an old one), so
    readers see the old folder or the new one, never a half-written one. On error the temp folder goes."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-"))
    try:
        yield tmp
        if directory.exists():
            old = directory.with_name(f".{directory.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(directory, old)
            os.rename(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_artifact(directory: str | Path, config: dict[str, Any], tensors: dict[str, np.ndarray], card: str) -> Path:
    """Write an artifact folder atomically."""
    from safetensors.numpy import save_file

    with atomic_folder(directory) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp / WEIGHTS_NAME))
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
        (tmp / "README.md").write_text(card)
    return Path(directory)


def read_artifact(directory: str | Path, expected_type: str, format_version: int,
                  expected_keys: set[str] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and validate an artifact folder; raise :class:`ArtifactError` with the reason and the fix."""
    from safetensors.numpy import load_file

    directory = Path(directory)
    if not directory.is_dir():
        raise ArtifactError(f"artifact folder {directory} does not exist")
    pickles = sorted(p.name for p in directory.rglob("*") if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise ArtifactError(f"artifact {directory} holds pickle-capable files {pickles}; ragpress never loads "
                            "pickles: remove them (weights belong in model.safetensors)")
    try:
        config = json.loads((directory / CONFIG_NAME).read_text())
    except FileNotFoundError:
        raise ArtifactError(f"artifact {directory} has no {CONFIG_NAME}") from None
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{directory / CONFIG_NAME} is corrupt (invalid JSON: {e})") from None
    if not isinstance(config, dict) or config.get("type") != expected_type:
        raise ArtifactError(f"artifact {directory} has type {config.get('type') if isinstance(config, dict) else None!r}, "
                            f"expected {expected_type!r}")
    ver = config.get("format_version")
    if not isinstance(ver, int) or ver < 1:
        raise ArtifactError(f"artifact {directory} has an invalid format_version {ver!r}")
    if ver > format_version:
        raise ArtifactError(f"artifact {directory} has format_version {ver}, newer than this ragpress supports "
                            f"({format_version}); upgrade ragpress")
    try:
        tensors = load_file(str(directory / WEIGHTS_NAME))
    except FileNotFoundError:
        raise ArtifactError(f"artifact {directory} has no {WEIGHTS_NAME}") from None
    except Exception as e:
        raise ArtifactError(f"{directory / WEIGHTS_NAME} is corrupt: {e}") from None
    if expected_keys is not None:
        missing, unexpected = sorted(expected_keys - tensors.keys()), sorted(tensors.keys() - expected_keys)
        if missing or unexpected:
            raise ArtifactError(f"artifact {directory}: missing tensors {missing}, unexpected tensors {unexpected}")
    return config, tensors


def check_base_model(config: dict[str, Any], role: str, model: str, fingerprint: str) -> None:
    """Refuse an artifact trained on another model than ``model`` (by weight hash, not by name)."""
    want = (config.get(role) or {}).get("sha256")
    if want != fingerprint:
        trained = (config.get(role) or {}).get("id")
        raise BaseModelMismatchError(
            f"this artifact was trained with {role} {trained!r} (sha256 {str(want)[:12]}...), but {model!r} has "
            f"sha256 {fingerprint[:12]}...; use the {role} it was trained on or retrain with `ragpress train`"
        )
