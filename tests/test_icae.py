"""ICAE: segment logic, encoder shapes, slot cache, artifacts, training. A fresh tiny Llama (hidden 32, from
config, fixed seed) per test, since peft wraps the model it is given in place."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys

import pytest
import torch
from conftest import REPO, interrupted, make_tiny_llama

from compressor import (
    ArtifactError,
    BaseModelMismatchError,
    Budget,
    BudgetError,
    ConfigError,
    Passage,
    PromptBuilder,
    available_compressors,
)
from compressor.icae import (
    SHIPPED_ARTIFACT,
    ICAECompressor,
    ICAEConfig,
    ICAEEncoder,
    ICAETrainConfig,
    SlotCache,
)
from compressor.icae.train import pretrain_example, train_icae
from compressor.prompt import embed_prompt
from compressor.training import QARecord
from serving.cli import main

HIDDEN = 32
PASSAGES = [
    Passage(text="Paris is the capital and most populous city of France.", title="Paris"),
    Passage(text="The mitochondrion is the powerhouse of the cell, producing ATP. " * 3, title="Mitochondrion"),
    Passage(text="Mount Everest is Earth's highest mountain above sea level.", title="Everest"),
]


def _encoder(smol_tokenizer, seed=0, **cfg):
    config = ICAEConfig(**{"segment_tokens": 16, "ratio": 4.0, "lora_r": 4, **cfg})
    enc = ICAEEncoder(make_tiny_llama(len(smol_tokenizer), seed=seed), config, seed=seed)
    with torch.no_grad():  # a LoRA with B = 0 is the identity: give it weight so the adapter matters in tests
        for n, p in enc.peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return enc


def _comp(counter, smol_tokenizer, **cfg):
    return ICAECompressor(counter, _encoder(smol_tokenizer, **cfg), smol_tokenizer)


def test_segment_arithmetic_and_config_validation():
    c = ICAEConfig()
    assert (c.ratio, c.segment_tokens, c.max_slots) == (4.0, 64, 16)
    c = ICAEConfig(segment_tokens=128)
    assert c.segments_of(300) == [(0, 128), (128, 256), (256, 300)]
    assert c.rows_for(300) == 32 + 32 + 11 and c.rows_for(0) == 0 and c.slots_for(1) == 1
    assert ICAEConfig(ratio=3, segment_tokens=10).max_slots == 4
    with pytest.raises(ValueError, match="ratio"):
        ICAEConfig(ratio=0.5)
    with pytest.raises(ValueError, match="extra"):
        ICAEConfig(ratios=4)
    assert ICAETrainConfig(stage1_steps=100).segment_cap(0, 128) == 32
    assert ICAETrainConfig(stage1_steps=100).segment_cap(50, 128) == 128
    code = "import compressor.icae, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_always_registered_and_says_whether_the_encoder_ships():
    spec = available_compressors()["icae"]
    assert spec.artifact == SHIPPED_ARTIFACT and spec.shipped == SHIPPED_ARTIFACT.is_dir()


def test_encoder_shapes_batching_and_accumulation(smol_tokenizer):
    enc = _encoder(smol_tokenizer)
    segs = [list(range(100, 116)), list(range(200, 205)), list(range(300, 309))]
    with torch.no_grad():
        batch = enc.encode(segs)
        alone = [enc.encode([s])[0] for s in segs]
    assert [tuple(b.shape) for b in batch] == [(4, HIDDEN), (2, HIDDEN), (3, HIDDEN)]
    for b, a in zip(batch, alone):  # left padding does not change any sequence's slots
        assert torch.allclose(b, a, atol=1e-5)
    long = list(range(100, 140))  # 40 tokens: segments 16 + 16 + 8 -> 4 + 4 + 2 rows
    with torch.no_grad():
        plain = enc.encode_passages([long, segs[1]], batch_size=2)
    assert [tuple(p.shape) for p in plain] == [(10, HIDDEN), (2, HIDDEN)]
    acc = _encoder(smol_tokenizer, accumulate=True)
    acc.load_state_dict(enc.state_dict())
    with torch.no_grad():
        summed = acc.encode_passages([long, segs[1]], batch_size=1)
    assert torch.allclose(summed[0][:4], plain[0][:4], atol=1e-5)  # the first segment has no prefix
    assert not torch.allclose(summed[0][4:], plain[0][4:], atol=1e-3)  # later ones see the earlier slots
    assert torch.allclose(summed[1], plain[1], atol=1e-5)


def test_calibration_matches_embedding_statistics(smol_tokenizer):
    enc = _encoder(smol_tokenizer)
    ids = [list(range(500, 516)), list(range(700, 712)), list(range(900, 916))]
    raw = enc.calibrate_(ids)
    e = enc.lm.get_input_embeddings()(torch.tensor(sum(ids, []))).float()
    with torch.no_grad(), enc.decoder():
        got = torch.cat(enc.encode_passages(ids), 0)
    assert raw > 0 and got.shape == (4 + 3 + 4, HIDDEN)
    assert torch.allclose(got.mean(0), e.mean(0), atol=1e-4)
    assert torch.allclose(got.std(0), e.std(0), rtol=1e-3, atol=1e-5)
    assert not math.isclose(float(got.norm(dim=-1).mean()), raw, rel_tol=1e-2)


def test_compress_rows_order_budget_and_prompt(counter, smol_tokenizer):
    comp = _comp(counter, smol_tokenizer)
    ctx = comp.compress("What produces ATP?", PASSAGES)
    n = [len(smol_tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in PASSAGES]
    assert [p.index for p in ctx.passages] == [0, 1, 2] and [p.title for p in ctx.passages] == ["Paris",
                                                                                                "Mitochondrion", "Everest"]
    assert [p.tokens_out for p in ctx.passages] == [comp.config.rows_for(k) for k in n]
    assert [tuple(p.embeds.shape) for p in ctx.passages] == [(comp.config.rows_for(k), HIDDEN) for k in n]
    assert ctx.tokens_in == sum(n) and ctx.ratio == pytest.approx(sum(n) / ctx.tokens_out)
    assert ctx.ratio >= 3.0  # ceil per segment: a little under 4x
    prompt = PromptBuilder(smol_tokenizer).build(ctx)
    x = embed_prompt(comp.encoder.lm, prompt)
    assert x.shape[0] == len(prompt)
    rows = [s for s in prompt.segments if not isinstance(s, list)]
    assert all(torch.equal(r, p.embeds) for r, p in zip(rows, ctx.passages))
    assert ctx.stopped_by == "budget" and ctx.asked_ratio is None
    under = comp.compress("q?", PASSAGES, Budget(ratio=3.0))  # a target it reaches: within it
    assert under.tokens_out == ctx.tokens_out and under.stopped_by == "budget" and under.asked_ratio == 3.0
    over = comp.compress("q?", PASSAGES, Budget(ratio=6.0))  # a target: rounded to one slot per 4 tokens, said so
    assert over.tokens_out == ctx.tokens_out and over.stopped_by == "granularity" and over.asked_ratio == 6.0
    with pytest.raises(BudgetError, match=r"strict budget .* ask for ratio <= "):  # a hard cap: refused
        comp.compress("q?", PASSAGES, Budget(ratio=6.0, strict=True))
    with pytest.raises(BudgetError, match="target_tokens >= "):
        comp.compress("q?", PASSAGES, Budget(target_tokens=3, strict=True))


def test_a_passage_no_longer_than_its_slots_passes_as_text(counter, smol_tokenizer):
    """A one-token passage would be one slot: it goes as text, beside the others' slots, and the prompt puts
    each where the passage was."""
    comp = _comp(counter, smol_tokenizer)
    short = Passage(text="Paris", title="Capital")
    assert len(smol_tokenizer(short.text, add_special_tokens=False)["input_ids"]) == 1
    ctx = comp.compress("What is the capital?", [PASSAGES[1], short], Budget(ratio=4))
    assert ctx.passages[1].embeds is None and ctx.passages[1].text == "Paris" and ctx.passages[1].tokens_out == 1
    assert ctx.passages[0].embeds is not None and ctx.stopped_by == "passed_through"
    prompt = PromptBuilder(smol_tokenizer).build(ctx)
    text = smol_tokenizer.decode([t for s in prompt.segments if isinstance(s, list) for t in s])
    assert "[2] Capital: Paris" in text and sum(not isinstance(s, list) for s in prompt.segments) == 1


def test_index_fills_the_slot_cache_ahead_of_questions(counter, smol_tokenizer, tmp_path, monkeypatch):
    """Index time: every passage's slots are encoded once into the cache; compress then encodes nothing, and
    indexing again computes only new passages."""
    comp = _comp(counter, smol_tokenizer, cache_dir=str(tmp_path / "cache"))
    rep = comp.index(PASSAGES)
    assert (rep.method, rep.passages, rep.computed, rep.cached, rep.skipped) == ("icae", 3, 3, 0, 0)
    assert len([p for p in (tmp_path / "cache").rglob("*.safetensors")]) == 3
    fresh = _comp(counter, smol_tokenizer).compress("q?", PASSAGES)

    def boom(*a, **k):
        raise AssertionError("the encoder ran on an indexed passage")

    with monkeypatch.context() as m:
        m.setattr(comp.encoder, "encode_passages", boom)
        got = comp.compress("q?", PASSAGES)
    for a, b in zip(got.passages, fresh.passages):
        torch.testing.assert_close(a.embeds, b.embeds)
    rep = comp.index([*PASSAGES, "A passage the corpus gained later."])
    assert (rep.computed, rep.cached) == (1, 3)
    with pytest.raises(ConfigError, match="icae has no cache_dir: set cache_dir"):
        _comp(counter, smol_tokenizer).index(PASSAGES)


def test_slot_cache_hit_skips_the_encoder_and_writes_atomically(counter, smol_tokenizer, tmp_path, monkeypatch):
    comp = _comp(counter, smol_tokenizer, cache_dir=str(tmp_path / "cache"))
    first = comp.compress("q?", PASSAGES)
    assert comp.encoded_passages == 3 and comp.cache.misses == 3 and comp.cache.hits == 0
    files = sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert len(files) == 3 and not any(f.startswith(".tmp-") for f in files)

    def boom(*a, **k):
        raise AssertionError("the encoder ran on a cache hit")

    monkeypatch.setattr(comp.encoder, "encode_passages", boom)
    again = comp.compress("q?", PASSAGES[::-1])
    assert comp.cache.hits == 3
    for a, b in zip(first.passages, again.passages[::-1]):
        assert torch.equal(a.embeds, b.embeds)
    # a failed write leaves neither a partial file nor a temporary one
    import safetensors.torch as st

    def torn(tensors, path):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(st, "save_file", torn)
    with pytest.raises(OSError, match="disk full"):
        comp.cache.put("new passage", torch.zeros(2, HIDDEN))
    assert comp.cache.get("new passage") is None
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "cache").rglob("*"))
    # another artifact (or encoding setting) gets another cache folder
    other = SlotCache(tmp_path / "cache", "other-artifact")
    assert other.get(PASSAGES[0].text) is None


def test_artifact_round_trip_and_mismatch_refusal(counter, smol_tokenizer, tmp_path):
    base = tmp_path / "base"
    make_tiny_llama(len(smol_tokenizer), seed=3).save_pretrained(base)
    smol_tokenizer.save_pretrained(base)
    from compressor.models import load_causal_lm

    enc = ICAEEncoder(load_causal_lm(base, dtype="float32")[0], ICAEConfig(base=str(base), segment_tokens=16, lora_r=4))
    with torch.no_grad():
        enc.memory.normal_()
        for n, p in enc.peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    comp = ICAECompressor(counter, enc, smol_tokenizer)
    path = comp.save_pretrained(tmp_path / "art", trained=True, training={"data": "unit test"})
    cfg = json.loads((path / "compressor_config.json").read_text())
    assert cfg["type"] == "icae" and cfg["trained"] and cfg["base"]["hidden_size"] == HIDDEN
    assert len(cfg["base"]["sha256"]) == 64 and cfg["config"]["segment_tokens"] == 16
    again = ICAECompressor.from_pretrained(path, counter, base=str(base), dtype="float32")
    a, b = comp.compress("q?", PASSAGES), again.compress("q?", PASSAGES)
    assert all(torch.allclose(x.embeds, y.embeds, atol=1e-5) for x, y in zip(a.passages, b.passages))
    assert again.artifact_id != "unsaved" and len(again.artifact_id) == 32
    with pytest.raises(ConfigError, match="pass base=PATH"):
        ICAECompressor.from_pretrained(path, counter)
    other = tmp_path / "other"
    make_tiny_llama(len(smol_tokenizer), seed=4).save_pretrained(other)
    smol_tokenizer.save_pretrained(other)
    with pytest.raises(BaseModelMismatchError, match="trained with base"):
        ICAECompressor.from_pretrained(path, counter, base=str(other))
    with pytest.raises(ConfigError, match="fixed by the trained encoder"):
        ICAECompressor.from_pretrained(path, counter, base=str(base), ratio=8.0)
    control = comp.save_pretrained(tmp_path / "control", trained=False)
    with pytest.raises(ArtifactError, match="untrained encoder"):
        ICAECompressor.from_pretrained(control, counter, base=str(base))
    assert not ICAECompressor.from_pretrained(control, counter, base=str(base), allow_untrained=True).trained
    assert "UNTRAINED CONTROL" in (control / "README.md").read_text()
    assert isinstance(again.reconstruct(PASSAGES[0].text, max_new_tokens=3), str)


def test_pretrain_examples_are_windows_of_the_text():
    import random

    toks = list(range(100))
    for k in range(20):
        task, seg, target = pretrain_example(toks, 32, random.Random(k), 0.5, 16)
        assert len(seg) == 32 and seg == toks[seg[0]: seg[0] + 32]
        assert target == seg if task == "ae" else target == toks[seg[-1] + 1: seg[-1] + 17]
    assert pretrain_example(list(range(10)), 32, random.Random(0), 1.0, 16)[0] == "ae"  # nothing left to continue


TEXTS = [p.text for p in PASSAGES] + ["Water boils at one hundred degrees Celsius at sea level pressure."]
QA = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris"),
      QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion")]


def _train(base, work, steps=(3, 2), resume=False, **kw):
    cfg = ICAEConfig(base=str(base), segment_tokens=16, lora_r=4)
    tc = ICAETrainConfig(stage1_steps=steps[0], stage2_steps=steps[1], batch_size=2, checkpoint_every=1,
                         precision="fp32", curriculum_start_tokens=8, **kw)
    return train_icae(TEXTS, QA, work, cfg, tc, resume=resume, progress=False, log=lambda s: None)


def test_training_checkpoints_resumes_exactly_and_learns(tiny_model_dir, tmp_path, monkeypatch):
    full, report = _train(tiny_model_dir, tmp_path / "a")
    assert report["stage1_steps_done"] == 3 and report["stage2_steps_done"] == 2
    log = [json.loads(x) for x in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in log] == [1, 1, 1, 2, 2] and all(r["kl"] > 0 for r in log[3:])
    with pytest.raises(ConfigError, match="--resume"):
        _train(tiny_model_dir, tmp_path / "a")

    interrupted(monkeypatch, 3, lambda: _train(tiny_model_dir, tmp_path / "b"))  # stops in stage 1, after step 2
    with pytest.raises(ConfigError, match="differ from the checkpoint"):
        _train(tiny_model_dir, tmp_path / "b", resume=True, kl_weight=0.5)
    resumed, _ = _train(tiny_model_dir, tmp_path / "b", resume=True)
    want, got = full.encoder.trainable_tensors(), resumed.encoder.trainable_tensors()
    assert set(want) == set(got) and any(k.startswith("lora.") for k in want)
    for k in want:
        assert torch.allclose(want[k], got[k], atol=1e-5), k
    assert len((tmp_path / "b" / "train_log.jsonl").read_text().splitlines()) == 5

    _, learn = _train(tiny_model_dir, tmp_path / "c", steps=(30, 0), stage1_lr=1e-2, lm_fraction=0.0)
    assert learn["stage1_loss_last"] < learn["stage1_loss_first"]  # a frozen random decoder: slow, but down


def test_cli_untrained_control_and_eval(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAGPRESS_HOME", str(tmp_path / "home"))
    out = tmp_path / "untrained"
    assert main(["train", "icae", "--out", str(out), "--work-dir", str(tmp_path / "work"), "--stage1-steps", "0",
                 "--stage2-steps", "0", "--base", str(tiny_model_dir), "--lora-r", "4", "--segment-tokens", "32",
                 "--n-stage1", "8", "--n-nq", "2", "--n-squad", "0"]) == 0
    assert json.loads((out / "compressor_config.json").read_text())["trained"] is False
    nq = tmp_path / "nq.jsonl.gz"
    with gzip.open(nq, "wt") as f:
        for i, p in enumerate(PASSAGES):
            f.write(json.dumps({"question": f"question {i} about {p.title}?", "answers": [p.title],
                                "ctxs": [{"title": p.title, "text": p.text, "isgold": True}]}) + "\n")
    summary = tmp_path / "eval.json"
    args = ["eval", "--dataset", "nq", "--path", str(nq), "--method", "icae", "--artifact", str(out), "--limit", "2",
            "--decoder", str(tiny_model_dir), "--max-new-tokens", "2", "--slot-cache", str(tmp_path / "slots"),
            "--out", str(summary)]
    assert main(args) == 0
    s = json.loads(summary.read_text())
    assert s["trained"] is False and s["encoded_passages"] == 2 and s["slot_cache_hits"] == 0
    assert s["ratio"] > 3.0
    assert main(args) == 0  # second run: every passage from the cache
    s = json.loads(summary.read_text())
    assert s["encoded_passages"] == 0 and s["slot_cache_hits"] == 2
    assert "UNTRAINED" in capsys.readouterr().err
    if not SHIPPED_ARTIFACT.is_dir():
        assert main(["eval", "--dataset", "nq", "--path", str(nq), "--method", "icae", "--limit", "1",
                     "--decoder", str(tiny_model_dir)]) == 2
        assert "no shipped icae encoder" in capsys.readouterr().err
