"""Scale-out: the index built as a Ray Data job equals the single-process index, and two proxy processes share
one per-passage cache (atomic writes: concurrent writers of the same files, then each reads what the other
wrote). Ray is the optional `ray` extra; CI installs it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from adapters.datasets import corpus_of, load_dataset
from adapters.indexing import index_corpus

REPO = Path(__file__).resolve().parents[1]
HOTPOT = REPO.parent / "shared" / "data" / "hotpotqa_train" / "hotpotqa_train_a.jsonl"
SMOL = "smollm2-135m-instruct"


def _files(root: Path) -> dict[Path, Path]:
    return {p.relative_to(root): p for p in root.rglob("*.safetensors")}


def _corpus(limit: int):
    if not HOTPOT.is_file():
        pytest.skip(f"the shared data is not here ({HOTPOT})")
    return corpus_of(load_dataset("hotpotqa", HOTPOT, limit=limit))


@pytest.mark.real_model
@pytest.mark.parametrize("method,options,atol", [("sentinel", {"dtype": "float32"}, 1e-5),
                                                 ("icae", {"dtype": "float32"}, 1e-4)])  # float32: batch mates differ
def test_ray_index_equals_the_local_index(tmp_path, method, options, atol):
    pytest.importorskip("ray", reason="the ray extra: pip install 'ragpress[ray]'")
    from safetensors.torch import load_file

    passages = _corpus(3)
    passages = passages + passages[:4]  # repeats are indexed once, and counted
    local = index_corpus(method, passages, tmp_path / "local", SMOL, options, chunk=8, progress=False)
    ray = index_corpus(method, passages, tmp_path / "ray", SMOL, options, chunk=8, progress=False, engine="ray",
                       workers=2)
    for k in ("passages", "computed", "cached", "duplicates", "skipped"):
        assert ray[k] == local[k], k
    assert ray["engine"] == "ray" and ray["duplicates"] == 4 and ray["computed"] > 0
    a, b = _files(tmp_path / "local"), _files(tmp_path / "ray")
    assert a and set(a) == set(b)  # the same content-addressed files
    for rel in a:
        ta, tb = load_file(a[rel]), load_file(b[rel])
        assert ta.keys() == tb.keys()
        for k in ta:
            assert ta[k].shape == tb[k].shape
            assert (ta[k] - tb[k]).abs().max().item() <= atol, (rel, k)
    again = index_corpus(method, passages, tmp_path / "ray", SMOL, options, chunk=8, progress=False, engine="ray",
                         workers=2)
    assert again["computed"] == 0 and again["cached"] == local["computed"]  # a second job only reads


def test_ray_engine_without_ray_is_one_line(monkeypatch, tmp_path):
    import builtins

    from compressor.errors import ConfigError

    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError, match=r"pip install 'ragpress\[ray\]'"):
        index_corpus("sentinel", _corpus(1), tmp_path, SMOL, engine="ray")


# -- two proxies, one cache ---------------------------------------------------------------------------------
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:  # all bound at once: n different ports
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _serve(cache: Path, log: Path, port: int) -> tuple[subprocess.Popen, str]:
    cmd = [str(Path(sys.executable).parent / "ragpress"), "serve", "--port", str(port), "--method", "sentinel",
           "--cache-dir", str(cache), "--no-inspector", "--batch-max-size", "1"]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return proc, f"http://127.0.0.1:{port}"


def _wait(proc: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the proxy exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the proxy did not start: {log.read_text()[-2000:]}")


def _ask(base: str, question: str, passages) -> dict:
    body = {"model": SMOL, "max_tokens": 1, "messages": [{"role": "user", "content": question}],
            "documents": [{"title": p.title, "text": p.text} for p in passages],
            "compression": {"ratio": 4, "explain": True}}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["compression"]


def _cache(base: str) -> tuple[int, int]:
    text = httpx.get(base + "/metrics", timeout=10).text
    hits = re.search(r'^ragpress_cache_hits_total\{method="sentinel"\} (\d+)$', text, re.M)
    misses = re.search(r'^ragpress_cache_misses_total\{method="sentinel"\} (\d+)$', text, re.M)
    return int(hits.group(1)), int(misses.group(1))


def _kept(info: dict) -> list:
    return [[s["sentence"] for s in p["sentences"] if s["kept"]] for p in info["explanation"][0]["passages"]]


@pytest.mark.real_model
def test_two_proxies_share_one_cache(tmp_path):
    data = load_dataset("hotpotqa", HOTPOT, limit=8) if HOTPOT.is_file() else pytest.skip("no shared data")
    cache = tmp_path / "cache"
    index_corpus("sentinel", data[6].passages, cache, SMOL, progress=False)  # ahead of time, as `ragpress index`
    port_a, port_b = _free_ports(2)
    (pa, a), (pb, b) = _serve(cache, tmp_path / "a.log", port_a), _serve(cache, tmp_path / "b.log", port_b)
    try:
        _wait(pa, a, tmp_path / "a.log")
        _wait(pb, b, tmp_path / "b.log")
        # 1. both replicas compress the same new passages at the same moment: concurrent writers of each file
        barrier = threading.Barrier(2)

        def both(base: str) -> list[dict]:
            barrier.wait()
            return [_ask(base, ex.question, ex.passages) for ex in data[:3]]

        with ThreadPoolExecutor(2) as ex:
            ra, rb = ex.map(both, [a, b])
        assert [_kept(x) for x in ra] == [_kept(x) for x in rb]  # the same selection from either replica
        files = _files(cache)
        n_new = len({(p.title, p.text) for ex in data[:3] for p in ex.passages})
        n_indexed = len({(p.title, p.text) for p in data[6].passages})
        assert len(files) == n_new + n_indexed  # one whole file per passage, whoever wrote it
        assert not [p for p in cache.rglob(".tmp-*")]  # no temporary file left behind
        from safetensors.torch import load_file

        assert all(load_file(p)["value"].shape[1] == 384 for p in files.values())  # every file whole
        # 2. what one replica wrote, the other reads: no passage embedded twice
        h0, m0 = _cache(a)
        ib = _ask(b, data[4].question, data[4].passages)
        hb, mb = _cache(b)
        ia = _ask(a, data[4].question, data[4].passages)
        h1, m1 = _cache(a)
        assert (h1 - h0, m1 - m0) == (len(data[4].passages), 0)
        assert _kept(ia) == _kept(ib)
        # 3. what `ragpress index` wrote before either started is read, not computed
        _ask(b, data[6].question, data[6].passages)
        assert _cache(b)[1] == mb
    finally:
        for p in (pa, pb):
            p.terminate()
        for p in (pa, pb):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_an_object_store_cache_and_a_refused_protocol(tmp_path):
    import torch

    from compressor.cache import TensorCache
    from compressor.errors import ConfigError

    a, b = TensorCache("memory://ragpress-test/cache", "ns"), TensorCache("memory://ragpress-test/cache", "ns")
    assert a.get("a passage") is None and a.misses == 1
    a.put("a passage", torch.ones(2, 3))
    assert torch.equal(b.get("a passage"), torch.ones(2, 3)) and b.hits == 1  # another reader sees the whole value
    local = TensorCache(f"file://{tmp_path}", "ns")
    local.put("x", torch.zeros(1))
    assert (tmp_path / "ns").is_dir() and not list(tmp_path.rglob(".tmp-*"))
    with pytest.raises(ConfigError, match=r"sftp:// is not an object store"):
        TensorCache("sftp://host/cache", "ns")
