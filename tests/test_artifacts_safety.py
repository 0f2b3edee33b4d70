"""Artifact and cache safety (compressor.artifacts): corrupt files, versions from the future, another base
model and pickles anywhere are refused with a message that says what to do; writes are atomic under a real
SIGKILL and with concurrent writers."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from compressor import ArtifactError, BaseModelMismatchError, ConfigError
from compressor import artifacts as A
from compressor.artifacts import check_base_model, read_artifact, resolve_base_model, write_artifact

KEYS = {"w"}


def write(d: Path, gen: int = 0, n: int = 8, **cfg) -> Path:
    config = {"type": "t", "format_version": 1, "gen": gen, "proxy": {"id": "m", "sha256": "a" * 64}, **cfg}
    return write_artifact(d, config, {"w": np.full(n, gen, dtype=np.float32)}, f"card {gen}\n")


def consistent(d: Path, card: bool = True) -> int:
    """Read ``d``: config, weights (and card) must come from one and the same write; return its number.
    ``card=False`` while writers run: the card is a third file, read apart from read_artifact."""
    cfg, t = read_artifact(d, "t", 1, KEYS)
    assert (t["w"] == cfg["gen"]).all(), (cfg["gen"], t["w"][:3])
    if card:
        assert (d / "README.md").read_text() == f"card {cfg['gen']}\n"
    return cfg["gen"]


def test_round_trip_and_permissions(tmp_path):
    write(tmp_path / "a", gen=3)
    assert consistent(tmp_path / "a") == 3
    assert (tmp_path / "a").stat().st_mode & 0o055  # not left 0700 by mkdtemp: a shared cache stays readable
    write(tmp_path / "a", gen=4)  # replacing
    assert consistent(tmp_path / "a") == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temp or old folder left behind


@pytest.mark.parametrize("damage, says", [
    (lambda d: (d / A.WEIGHTS_NAME).write_bytes(b"garbage"), "model.safetensors is corrupt"),
    (lambda d: (d / A.WEIGHTS_NAME).write_bytes((d / A.WEIGHTS_NAME).read_bytes()[:-7]), "is corrupt"),
    (lambda d: (d / A.WEIGHTS_NAME).write_bytes((10**12).to_bytes(8, "little") + b"{}"), "is corrupt"),
    (lambda d: (d / A.WEIGHTS_NAME).unlink(), "has no model.safetensors"),
    (lambda d: (d / A.CONFIG_NAME).unlink(), "has no compressor_config.json"),
    (lambda d: (d / A.CONFIG_NAME).write_text('{"type": "t", '), "corrupt (invalid JSON"),
    (lambda d: (d / A.CONFIG_NAME).write_text("[1, 2]"), "has type None, expected 't'"),
    (lambda d: _cfg(d, type="other"), "has type 'other', expected 't'"),
    (lambda d: _cfg(d, format_version=99), "format_version 99, newer than this ragpress supports (1); upgrade"),
    (lambda d: _cfg(d, format_version="1"), "invalid format_version '1'"),
    (lambda d: _cfg(d, format_version=0), "invalid format_version 0"),
], ids=["garbage weights", "truncated weights", "header claims a terabyte", "no weights", "no config",
        "config not JSON", "config not an object", "another type", "format from the future", "version a string",
        "version zero"])
def test_damaged_artifacts_refused(tmp_path, damage, says):
    d = write(tmp_path / "a")
    damage(d)
    with pytest.raises(ArtifactError) as e:
        read_artifact(d, "t", 1, KEYS)
    assert says in str(e.value)


def _cfg(d: Path, **changes) -> None:
    cfg = json.loads((d / A.CONFIG_NAME).read_text())
    (d / A.CONFIG_NAME).write_text(json.dumps({**cfg, **changes}))


def test_missing_and_unexpected_tensors_listed(tmp_path):
    write_artifact(tmp_path / "a", {"type": "t", "format_version": 1}, {"w": np.zeros(2), "extra": np.zeros(1)}, "")
    with pytest.raises(ArtifactError, match=r"missing tensors \['v'\], unexpected tensors \['extra', 'w'\]"):
        read_artifact(tmp_path / "a", "t", 1, {"v"})


@pytest.mark.parametrize("name, content", [
    ("extra.pkl", pickle.dumps({"x": 1})),
    ("sub/deep/weights.PT", b"anything"),  # any case, any depth
    ("arrays.npy", b"\x93NUMPY"),
    ("model.joblib", b"x"),
    ("notes.dat", pickle.dumps([1, 2, 3], protocol=2)),  # a pickle under an innocent name
    ("state.data", None),  # a zip archive: what torch.save writes
])
def test_pickles_anywhere_refused(tmp_path, name, content):
    d = write(tmp_path / "a")
    f = d / name
    f.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        with zipfile.ZipFile(f, "w") as z:
            z.writestr("archive/data.pkl", pickle.dumps({"w": 1}))
    else:
        f.write_bytes(content)
    with pytest.raises(ArtifactError, match="pickle") as e:
        read_artifact(d, "t", 1, KEYS)
    assert name in str(e.value) and "ragpress never loads pickles" in str(e.value)


def test_no_false_pickle_alarm(tmp_path):
    d = write(tmp_path / "a")
    (d / "notes.txt").write_text("\x80 is not a pickle on its own")
    (d / "extra.safetensors").write_bytes(b"\x80\x02" + b"\x00" * 6)  # safetensors: parsed, never unpickled
    assert not A._pickle_capable(d / "extra.safetensors", b"\x80\x02\x00\x00")
    assert A._pickle_capable(d / "extra.dat", b"\x80\x02\x00\x00")
    consistent(d)
    shipped = REPO / "compressor" / "artifacts" / "sentinel-smollm2-135m"
    if (shipped / A.CONFIG_NAME).exists():
        read_artifact(shipped, "sentinel", 99)  # the shipped probe holds nothing pickle-capable


@pytest.mark.parametrize("role", ["proxy", "embedder", "decoder"])
def test_another_base_model_refused(role):
    cfg = {role: {"id": "smollm2-135m-instruct", "sha256": "a" * 64}}
    check_base_model(cfg, role, "smollm2-135m-instruct", "a" * 64)  # the same weights: fine
    with pytest.raises(BaseModelMismatchError) as e:
        check_base_model(cfg, role, "my-finetune", "b" * 64)
    msg = str(e.value)
    assert f"trained with {role} 'smollm2-135m-instruct'" in msg and "'my-finetune'" in msg
    assert "retrain with `ragpress train`" in msg
    with pytest.raises(BaseModelMismatchError):  # no record of the base model at all: refused too
        check_base_model({}, role, "smollm2-135m-instruct", "a" * 64)


@pytest.mark.parametrize("role", ["base", "proxy", "embedder", "decoder"])
def test_resolve_base_model(role, monkeypatch, tmp_path):
    import compressor.models as M

    monkeypatch.setattr(M, "model_fingerprint", lambda name: "a" * 64 if name == "smollm2-135m-instruct" else "b" * 64)
    named = {role: {"id": "smollm2-135m-instruct", "sha256": "a" * 64}}
    assert resolve_base_model(named, role, directory=tmp_path) == "smollm2-135m-instruct"  # the model it records
    with pytest.raises(BaseModelMismatchError):  # a model passed in is checked too
        resolve_base_model(named, role, "my-finetune", directory=tmp_path)
    local = {role: {"id": "my-finetune", "sha256": "b" * 64}}
    with pytest.raises(ConfigError, match=f"trained with a local {role} folder 'my-finetune': pass {role}=PATH"):
        resolve_base_model(local, role, directory=tmp_path)  # a local folder is never guessed
    assert resolve_base_model(local, role, "/models/my-finetune", directory=tmp_path) == "/models/my-finetune"
    with pytest.raises(ArtifactError, match=f"records no {role} model"):
        resolve_base_model({role: "not a record"}, role, directory=tmp_path)


# -- atomic writes -----------------------------------------------------------------------------------------------
WRITER = """
import sys, numpy as np
from compressor.artifacts import write_artifact
d, n, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(start, start + 10**6):
    write_artifact(d, {"type": "t", "format_version": 1, "gen": i}, {"w": np.full(n, i, dtype=np.float32)},
                   f"card {i}\\n")
    if i == start:
        print("written", flush=True)
    if len(sys.argv) > 4 and i - start + 1 >= int(sys.argv[4]):
        break
"""


def _writer(d: Path, n: int, start: int, count: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-c", WRITER, str(d), str(n), str(start)] + ([str(count)] if count else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)


def test_sigkill_mid_write_leaves_no_corrupt_entry(tmp_path):
    """A real writer process, killed with SIGKILL at varied moments while it rewrites the folder in a loop
    (800 KB of weights each time): the folder always reads whole, config, weights and card from one write."""
    d = tmp_path / "cache"
    seen = set()
    for k, delay in enumerate([0.0, 0.013, 0.037, 0.071, 0.12, 0.2]):
        p = _writer(d, 200_000, start=1000 * k)
        assert p.stdout.readline().strip() == "written"
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        assert p.returncode == -signal.SIGKILL
        seen.add(consistent(d))
        assert [x.name for x in tmp_path.iterdir() if not x.name.startswith(".")] == ["cache"]
    assert len(seen) > 1  # the kills landed at different points of the loop
    write(d, gen=7)  # a killed writer's leftovers do not get in the way of the next one
    assert consistent(d) == 7


def test_concurrent_writer_processes(tmp_path):
    d = tmp_path / "cache"
    procs = [_writer(d, 50_000, start=1000 * k, count=15) for k in range(4)]
    for p in procs:
        assert p.stdout.readline().strip() == "written"
        assert p.wait(120) == 0  # every writer succeeded
    assert consistent(d) % 1000 == 14  # the last write of one of them
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cache"]  # nothing left over


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_concurrent_writer_threads(tmp_path, monkeypatch, exchange):
    """Also without renameat2 (other kernels, filesystems): writers never fail, the folder stays whole."""
    if not exchange:
        monkeypatch.setattr(A, "_exchange", lambda a, b: False)
    d = tmp_path / "cache"
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(k: int) -> None:
        try:
            for i in range(12):
                write(d, gen=100 * k + i, n=20_000)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def reader() -> None:
        while not stop.is_set():
            if d.exists():
                try:
                    consistent(d, card=False)
                except AssertionError as e:  # config and weights from two writes
                    errors.append(e)
                except ArtifactError as e:  # the folder may be briefly absent in the fallback, never mixed
                    if exchange or "does not exist" not in str(e):
                        errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    r.join(10)
    assert errors == []
    consistent(d)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cache"]


def test_reader_retries_a_replaced_folder_then_says_why(tmp_path, monkeypatch):
    """A read cut short by a swap is retried on the new folder; a folder replaced on every try (a looping writer)
    ends in an error that says so, after the retry window, not after a fixed small count of tries."""
    d = write(tmp_path / "a", gen=1)
    real_read, calls = A._read_at, []

    def swapped_once(fd, *args):
        calls.append(fd)
        if len(calls) == 1:
            write(d, gen=2)  # the folder the reader holds is replaced under it
            raise ArtifactError("cut short")
        return real_read(fd, *args)

    monkeypatch.setattr(A, "_read_at", swapped_once)
    cfg, _ = read_artifact(d, "t", 1, KEYS)
    assert cfg["gen"] == 2 and len(calls) == 2

    def always_swapped(fd, *args):
        calls.append(fd)
        write(d, gen=3 + len(calls))
        raise ArtifactError("cut short")

    monkeypatch.setattr(A, "_read_at", always_swapped)
    monkeypatch.setattr(A, "_REREAD_SECONDS", 0.2)
    calls.clear()
    t0 = time.monotonic()
    with pytest.raises(ArtifactError, match=r"kept being replaced while it was read \(\d+ tries in 0.2 s\)"):
        read_artifact(d, "t", 1, KEYS)
    assert time.monotonic() - t0 >= 0.2 and len(calls) > 5


def test_reader_does_not_retry_a_damaged_folder(tmp_path):
    """Damage in a folder nobody replaces is reported at once, not retried for the whole window."""
    d = write(tmp_path / "a", gen=1)
    (d / A.WEIGHTS_NAME).write_bytes(b"garbage")
    t0 = time.monotonic()
    with pytest.raises(ArtifactError, match="is corrupt"):
        read_artifact(d, "t", 1, KEYS)
    assert time.monotonic() - t0 < A._REREAD_SECONDS / 2


def test_rewriting_an_artifact_keeps_its_results_section(tmp_path):
    """The trainers write the card from scratch; the hand-kept ``## Results`` of the card it replaces survives,
    flagged as measured on the previous weights when the weights changed."""
    d = tmp_path / "art"
    cfg = {"type": "t", "format_version": 1}
    write_artifact(d, cfg, {"w": np.zeros(3, dtype=np.float32)}, "# card v1\n")
    (d / "README.md").write_text("# card v1\n\n## Results\n\nF1 0.5 on 100 questions.\n")
    write_artifact(d, cfg, {"w": np.zeros(3, dtype=np.float32)}, "# card v2\n")
    assert (d / "README.md").read_text() == "# card v2\n\n## Results\n\nF1 0.5 on 100 questions.\n"
    write_artifact(d, cfg, {"w": np.ones(3, dtype=np.float32)}, "# card v3\n")
    text = (d / "README.md").read_text()
    assert text.startswith("# card v3\n\n## Results\n\n> Measured on the previous weights") and "F1 0.5" in text
