"""Self-describing artifact folders shared by every trained family.

A folder holds ``compressor_config.json`` (type, format version, library version, base model id and hash,
family fields, training data and measured scores), ``model.safetensors`` (trainable tensors only) and a short
``README.md`` card. Never pickles: a folder holding a pickle-capable file (by name: ``*.bin``, ``*.pt``,
``*.pth``, ``*.pkl``, ``*.pickle``, ``*.ckpt``, ``*.joblib``, ``*.npy``, ``*.npz``; or by content: a pickle
stream or a zip archive, which is what ``torch.save`` writes) is refused. Loading is strict: missing or
unexpected tensors are listed.

Writes are atomic (:func:`atomic_folder`): a reader, or a writer killed at any instruction, sees the old
folder or the new one, never a mix; concurrent writers of one folder all succeed and the last one wins.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ArtifactError, BaseModelMismatchError, ConfigError

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "atomic_folder", "write_artifact", "read_artifact", "check_base_model",
           "resolve_base_model"]

CONFIG_NAME = "compressor_config.json"
WEIGHTS_NAME = "model.safetensors"
_PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz"}
_SAFE_SUFFIXES = {".safetensors"}  # parsed by safetensors, which has no code path to pickle
_RENAME_EXCHANGE = 2  # linux/fs.h
_REREAD_SECONDS = 2.0  # how long read_artifact retries a folder that writers keep replacing


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, musl
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the filesystem cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _swap_into_place(tmp: Path, directory: Path) -> None:
    """Put the finished ``tmp`` at ``directory``; what was there ends up in ``tmp`` (removed by the caller)."""
    while True:
        try:
            os.rename(tmp, directory)  # nothing there yet: one atomic step
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if _exchange(tmp, directory):  # readers see the old folder or the new one, at every instant
            return
        # Fallback (no renameat2): move the old folder aside under a unique name, then rename. Between the two
        # steps the folder is briefly missing; a writer killed there leaves the old one at `aside`.
        aside = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-old-"))
        try:
            os.rename(directory, aside / "x")
        except FileNotFoundError:  # another writer moved it first: try again
            os.rmdir(aside)
            continue
        try:
            os.rename(tmp, directory)
        except OSError:  # another writer put its folder there first: it wins, ours is dropped
            pass
        shutil.rmtree(aside, ignore_errors=True)
        return


@contextlib.contextmanager
def atomic_folder(directory: str | Path) -> Iterator[Path]:
    """Yield a temp folder beside ``directory``; on success put it in place (replacing an old one) in one
    atomic step, so readers see the old folder or the new one, never a half-written one, and concurrent
    writers all succeed (the last one wins). On error, or if the process dies, ``directory`` is untouched;
    the temp folder goes (a killed writer leaves a hidden ``.NAME-*`` folder, never read)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-"))
    try:
        yield tmp
        for f in tmp.rglob("*"):  # durable before it becomes visible
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700: a shared cache must stay readable
        _swap_into_place(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    try:  # Linux: read it without the set-and-restore race of os.umask
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _pickle_capable(path: Path, head: bytes = b"") -> bool:
    """By name, or by the first bytes of the file: a pickle stream (protocol 2-5 opens with PROTO n) or a zip
    archive (``torch.save``'s format). ``*.safetensors`` is parsed by safetensors, which cannot unpickle."""
    suffix = path.suffix.lower()
    if suffix in _PICKLE_SUFFIXES:
        return True
    if suffix in _SAFE_SUFFIXES:
        return False
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head == b"PK\x03\x04"


RESULTS_HEADING = "## Results"


def write_artifact(directory: str | Path, config: dict[str, Any], tensors: dict[str, np.ndarray], card: str) -> Path:
    """Write an artifact folder atomically. The card is ``card`` plus the hand-kept ``## Results`` section of
    the card it replaces (measurements made after training, e.g. the benchmark's): kept as it is when the
    weights are the same bytes, else under a line saying it was measured on the previous weights."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    old_card, old_weights = directory / "README.md", directory / WEIGHTS_NAME
    try:  # another writer may be swapping the folder: then there is no card to carry over
        results = old_card.read_text().partition(f"\n{RESULTS_HEADING}")[2]
    except OSError:
        results = ""
    with atomic_folder(directory) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp / WEIGHTS_NAME))
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
        if results:
            same = _sha256(old_weights) == _sha256(tmp / WEIGHTS_NAME)
            note = "" if same else (f"\n\n> Measured on the previous weights (sha256 {_sha256(old_weights)[:12]}...), "
                                    "not on these: rerun the measurements before citing them.")
            card = card.rstrip() + f"\n\n{RESULTS_HEADING}{note}" + ("\n" if note else "") + results
        (tmp / "README.md").write_text(card)
    return directory


def _sha256(path: Path) -> str:
    """The sha256 of ``path``, or ``"none"`` when another writer has just swapped it away."""
    from .models import file_sha256

    try:
        return file_sha256(path)
    except OSError:
        return "none"


def read_artifact(directory: str | Path, expected_type: str, format_version: int,
                  expected_keys: set[str] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read and validate an artifact folder; raise :class:`ArtifactError` with the reason and the fix.

    Every file is read through one open handle on the folder, so the config and the weights come from the
    same write even while :func:`atomic_folder` swaps a new one in; a read that such a swap cut short (the
    old folder removed under it) is tried again on the new one, for up to ``_REREAD_SECONDS`` (a tight loop of
    writers on a loaded machine can replace it several times in a row)."""
    directory = Path(directory)
    deadline, tries = time.monotonic() + _REREAD_SECONDS, 0
    while tries < 5 or time.monotonic() < deadline:
        tries += 1
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise ArtifactError(f"artifact folder {directory} does not exist") from None
        except NotADirectoryError:
            raise ArtifactError(f"artifact folder {directory} is a file, not a folder") from None
        try:
            return _read_at(fd, directory, expected_type, format_version, expected_keys)
        except (ArtifactError, OSError):
            try:
                replaced = os.stat(directory).st_ino != os.fstat(fd).st_ino  # fd pins the inode: no reuse
            except FileNotFoundError:
                replaced = True
            if not replaced:
                raise
        finally:
            os.close(fd)
    raise ArtifactError(f"artifact {directory} kept being replaced while it was read ({tries} tries in "
                        f"{_REREAD_SECONDS:g} s); is a writer looping?")


def _read_file(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _read_at(dir_fd: int, directory: Path, expected_type: str, format_version: int,
             expected_keys: set[str] | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from safetensors.numpy import load as load_safetensors

    pickles = []
    for root, _, files, root_fd in os.fwalk(".", dir_fd=dir_fd):
        for name in files:
            rel = os.path.normpath(os.path.join(root, name))
            head = b"" if Path(name).suffix.lower() in _PICKLE_SUFFIXES | _SAFE_SUFFIXES else _head(root_fd, name)
            if _pickle_capable(Path(rel), head):
                pickles.append(rel)
    if pickles:
        raise ArtifactError(f"artifact {directory} holds pickle-capable files {sorted(pickles)}; ragpress never "
                            "loads pickles: remove them (weights belong in model.safetensors)")
    try:
        config = json.loads(_read_file(dir_fd, CONFIG_NAME))
    except FileNotFoundError:
        raise ArtifactError(f"artifact {directory} has no {CONFIG_NAME}") from None
    except ValueError as e:  # invalid JSON or not UTF-8
        raise ArtifactError(f"{directory / CONFIG_NAME} is corrupt (invalid JSON: {e})") from None
    if not isinstance(config, dict) or config.get("type") != expected_type:
        raise ArtifactError(f"artifact {directory} has type {config.get('type') if isinstance(config, dict) else None!r}, "
                            f"expected {expected_type!r}")
    ver = config.get("format_version")
    if not isinstance(ver, int) or isinstance(ver, bool) or ver < 1:
        raise ArtifactError(f"artifact {directory} has an invalid format_version {ver!r}")
    if ver > format_version:
        raise ArtifactError(f"artifact {directory} has format_version {ver}, newer than this ragpress supports "
                            f"({format_version}); upgrade ragpress")
    try:
        raw = _read_file(dir_fd, WEIGHTS_NAME)
    except FileNotFoundError:
        raise ArtifactError(f"artifact {directory} has no {WEIGHTS_NAME}") from None
    try:
        tensors = load_safetensors(raw)
    except Exception as e:
        raise ArtifactError(f"{directory / WEIGHTS_NAME} is corrupt: {e}") from None
    if expected_keys is not None:
        missing, unexpected = sorted(expected_keys - tensors.keys()), sorted(tensors.keys() - expected_keys)
        if missing or unexpected:
            raise ArtifactError(f"artifact {directory}: missing tensors {missing}, unexpected tensors {unexpected}")
    return config, tensors


def _head(dir_fd: int, name: str) -> bytes:
    """The first 4 bytes of a regular file (not following links; pipes and devices are not opened for
    reading), or b\"\"."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        return f.read(4) if stat.S_ISREG(os.fstat(fd).st_mode) else b""


def check_base_model(config: dict[str, Any], role: str, model: str, fingerprint: str) -> None:
    """Refuse an artifact trained on another model than ``model`` (by weight hash, not by name)."""
    record = config.get(role) if isinstance(config.get(role), dict) else {}
    want = record.get("sha256")
    if want != fingerprint:
        trained = record.get("id")
        raise BaseModelMismatchError(
            f"this artifact was trained with {role} {trained!r} (sha256 {str(want)[:12]}...), but {model!r} has "
            f"sha256 {fingerprint[:12]}...; use the {role} it was trained on or retrain with `ragpress train`"
        )


def resolve_base_model(config: dict[str, Any], role: str, override: str | None = None, *,
                       directory: str | Path) -> str:
    """The model to load for ``role`` (``"base"``, ``"decoder"``, ``"embedder"``, ``"proxy"``) of an artifact
    whose ``compressor_config.json`` is ``config``: ``override`` (a named model or a local folder) if given, else
    the named model it records as ``config[role]["id"]``. Either way its weights must hash to the recorded
    sha256 (:func:`check_base_model`). A model trained from a local folder is not looked for: the caller
    passes it as ``override``, which the error (naming ``directory``) says."""
    from .models import NAMED_MODELS, model_fingerprint

    record = config.get(role) if isinstance(config.get(role), dict) else {}
    trained = record.get("id")
    if trained is None and not override:
        raise ArtifactError(f"artifact {directory}: {CONFIG_NAME} records no {role} model ({role}.id); re-save it "
                            "with `ragpress train`")
    name = override or (trained if trained in NAMED_MODELS else None)
    if name is None:
        raise ConfigError(f"artifact {directory} was trained with a local {role} folder {trained!r}: "
                          f"pass {role}=PATH")
    check_base_model(config, role, name, model_fingerprint(name))
    return name
