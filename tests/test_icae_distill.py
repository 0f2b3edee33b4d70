"""ICAE v2 (#22): distillation targets (teacher reads the evidence only, cached once), the decoder LoRA
(PISCO / COCOM), a frozen-encoder run, the validation curve, and decoders that apply the adapter. Tiny Llama
models from config with fixed seeds."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import interrupted

from adapters.decoders import FakeBackend, HFBackend, backend_for
from compressor import ConfigError, Passage, PromptBuilder
from compressor.distill import teacher_targets
from compressor.icae import ICAECompressor, ICAEConfig, ICAETrainConfig
from compressor.icae.train import train_icae
from compressor.models import load_causal_lm
from compressor.prompt import embed_prompt
from compressor.training import QARecord

GOLD = Passage(text="Paris is the capital and most populous city of France.", title="Paris")
NOISE = [Passage(text="The mitochondrion is the powerhouse of the cell, producing ATP.", title="Cell"),
         Passage(text="Mount Everest is Earth's highest mountain above sea level.", title="Everest")]
QA = [QARecord("What is the capital of France?", (NOISE[0], GOLD, NOISE[1]), "Paris", ("Paris",), (1,)),
      QARecord("What is the highest mountain?", (NOISE[1], GOLD), "Everest", ("Mount Everest", "Everest"), (0,)),
      QARecord("What produces ATP?", (NOISE[0],), "the mitochondrion", ("mitochondrion",), ())]
TEXTS = [" ".join([p.text] * 3) for p in (GOLD, *NOISE)]


def _cfg(base, **kw):
    return ICAEConfig(base=str(base), segment_tokens=16, lora_r=4, **kw)


def _train(base, work, steps=(2, 3), resume=False, config=None, val=(), **kw):
    tc = ICAETrainConfig(stage1_steps=steps[0], stage2_steps=steps[1], batch_size=2, checkpoint_every=1,
                         precision="fp32", curriculum_start_tokens=8, stage2_targets="distill", distill_top_k=8,
                         **kw)
    score = (lambda text, r: {"accuracy": float(any(a.lower() in text.lower() for a in r.answers))}) if val else None
    return train_icae(TEXTS, QA, work, config or _cfg(base, decoder_lora_r=4), tc, resume=resume, progress=False,
                      log=lambda s: None, val=val, score=score)


def test_teacher_reads_the_evidence_only_and_its_targets_are_cached(tiny_model_dir, tmp_path):
    assert QA[0].evidence_only().passages == (GOLD,) and QA[2].evidence_only() is QA[2]
    model, tok = load_causal_lm(tiny_model_dir, dtype="float32")
    builder = PromptBuilder(tok)
    seen = []
    real = model.forward

    def spy(*a, **kw):
        if kw.get("input_ids") is not None and kw["input_ids"].shape[1] > 1:
            seen.extend(tok.decode(row) for row in kw["input_ids"])
        return real(*a, **kw)

    model.forward = spy
    first, counts = teacher_targets(model, builder, QA, 6, 8, tmp_path / "t", "ns", progress=False,
                                    log=lambda s: None, batch_size=2)
    assert counts["cached"] == 0 and len(first) == 3
    assert not any("mitochondrion" in s for s in seen[:1]) and "Paris is the capital" in seen[0]
    for t in first:  # a tiny random model never stops: every target falls back to the gold answer
        assert t.source == "gold" and t.topk_logp is None
    seen.clear()
    again, counts = teacher_targets(model, builder, QA, 6, 8, tmp_path / "t", "ns", progress=False, log=lambda s: None)
    assert counts["cached"] == 3 and not seen  # nothing generated: every target read from the cache
    assert [t.ids for t in again] == [t.ids for t in first]
    _, other = teacher_targets(model, builder, QA, 6, 8, tmp_path / "t", "other-base", progress=False,
                               log=lambda s: None)
    assert other["cached"] == 0  # another namespace (base model, prompt style) never reuses them
    # a teacher that stops and is accepted becomes the target, with its distribution
    stop = next(iter(__import__("compressor.distill", fromlist=["stop_ids"]).stop_ids(builder)))

    def answers_at_once(*a, **kw):  # the tiny model now ends its answer at once
        out = real(*a, **kw)
        out.logits[..., stop] = 1e4
        return out

    model.forward = answers_at_once
    taught, counts = teacher_targets(model, builder, QA, 6, 8, None, "ns", accept=lambda text, r: True,
                                     progress=False, log=lambda s: None)
    assert counts["teacher"] == 3 and all(t.source == "teacher" and t.topk_logp.shape == (1, 8) for t in taught)


def test_decoder_adapter_learns_with_the_encoder_and_resumes_exactly(tiny_model_dir, tmp_path, monkeypatch):
    full, report = _train(tiny_model_dir, tmp_path / "a")
    t = full.encoder.trainable_tensors()
    assert any(k.startswith("decoder_lora.") for k in t) and any(k.startswith("lora.") for k in t)
    # both adapters moved in the same steps (peft flips requires_grad when adapters switch)
    assert all(t[k].abs().sum() > 0 for k in t if "lora_B" in k)
    assert report["distill_targets"]["gold"] == 3

    interrupted(monkeypatch, 4, lambda: _train(tiny_model_dir, tmp_path / "b"))  # stops in stage 2
    resumed, _ = _train(tiny_model_dir, tmp_path / "b", resume=True)
    got = resumed.encoder.trainable_tensors()
    assert set(got) == set(t)
    for k in t:
        assert torch.allclose(t[k], got[k], atol=1e-5), k


def test_frozen_encoder_run_trains_the_decoder_adapter_only(tiny_model_dir, tmp_path, counter, monkeypatch):
    start, _ = _train(tiny_model_dir, tmp_path / "s", steps=(2, 0), config=_cfg(tiny_model_dir))
    init = start.save_pretrained(tmp_path / "init", trained=True)
    with pytest.raises(ConfigError, match="decoder_lora_r"):
        _train(tiny_model_dir, tmp_path / "x", steps=(0, 2), config=_cfg(tiny_model_dir), train_encoder=False,
               init_from=str(init))
    with pytest.raises(ConfigError, match="init_from"):
        _train(tiny_model_dir, tmp_path / "y", steps=(0, 2), train_encoder=False)
    val = QA[:2]
    comp, report = _train(tiny_model_dir, tmp_path / "f", steps=(0, 3), train_encoder=False, init_from=str(init),
                          val=val)
    before, after = start.encoder.trainable_tensors(), comp.encoder.trainable_tensors()
    for k in before:  # the encoder is exactly init_from's
        assert torch.equal(before[k], after[k]), k
    assert any(after[k].abs().sum() > 0 for k in after if k.startswith("decoder_lora.") and "lora_B" in k)
    ckpt = json.loads((tmp_path / "f" / "checkpoint" / "compressor_config.json").read_text())
    assert ckpt["step"] == 3
    from compressor.artifacts import read_artifact

    _, saved = read_artifact(tmp_path / "f" / "checkpoint", "icae-checkpoint", 1)
    assert saved and all(k.startswith(("decoder_lora.", "opt.")) for k in saved)  # small: no encoder copy
    curve = [json.loads(x) for x in (tmp_path / "f" / "val_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [0, 1, 2, 3] and all(r["n"] == 2 and 0 <= r["accuracy"] <= 1 for r in curve)
    assert report["validation"] == curve

    interrupted(monkeypatch, 2, lambda: _train(tiny_model_dir, tmp_path / "g", steps=(0, 3), train_encoder=False,
                                               init_from=str(init)))
    resumed, _ = _train(tiny_model_dir, tmp_path / "g", steps=(0, 3), train_encoder=False, init_from=str(init),
                        resume=True)
    for k, v in resumed.encoder.trainable_tensors().items():
        assert torch.allclose(v, after[k], atol=1e-5), k


def test_decoders_read_the_slots_through_the_adapter(tiny_model_dir, tmp_path, counter, smol_tokenizer):
    trained, _ = _train(tiny_model_dir, tmp_path / "a", stage2_lr=5e-2)
    path = trained.save_pretrained(tmp_path / "art", trained=True)
    cfg = json.loads((path / "compressor_config.json").read_text())
    assert cfg["config"]["decoder_lora_r"] == 4 and "own LoRA adapter (r=4" in (path / "README.md").read_text()
    comp = ICAECompressor.from_pretrained(path, counter, base=str(tiny_model_dir), dtype="float32")
    adapter = comp.decoder_adapter()
    assert adapter is not None and adapter.lora["r"] == 4
    for k, v in trained.encoder.decoder_lora()[1].items():
        assert torch.equal(v, adapter.tensors[k]), k

    base = HFBackend.load(str(tiny_model_dir), dtype="float32")
    reader = backend_for(base, comp)
    assert reader is not base and reader.model_name.endswith(adapter.name)
    prompt = base.prompt_builder().build(comp.compress("What is the capital of France?", [GOLD, *NOISE]))
    with torch.no_grad():
        want = comp.encoder.lm
        with comp.encoder.decoder():
            w = want(inputs_embeds=embed_prompt(want, prompt)[None]).logits[0, -1]
        got = reader.model(inputs_embeds=embed_prompt(reader.model, prompt)[None]).logits[0, -1]
        plain = base.model(inputs_embeds=embed_prompt(base.model, prompt)[None]).logits[0, -1]
    assert torch.allclose(w, got, atol=1e-4)  # the backend decodes exactly as training did
    assert not torch.allclose(w, plain, atol=1e-3)  # and the adapter matters
    assert reader.generate([prompt])[0].token_ids  # generation runs through the adapter
    with pytest.raises(ConfigError, match="cannot apply the decoder LoRA adapter"):
        backend_for(FakeBackend(smol_tokenizer), comp)
    frozen = ICAECompressor(counter, trained.encoder.__class__(load_causal_lm(tiny_model_dir, dtype="float32")[0],
                                                               _cfg(tiny_model_dir)), smol_tokenizer)
    assert frozen.decoder_adapter() is None and backend_for(base, frozen) is base


def test_a_chunk_stops_at_max_hours_and_resume_finishes_it(tiny_model_dir, tmp_path):
    comp, report = _train(tiny_model_dir, tmp_path / "w", steps=(2, 2), max_hours=0.0)
    assert report["complete"] is False and report["stage1_steps_done"] == 0
    path = comp.save_pretrained(tmp_path / "art", trained=True, training=report)
    assert "an incomplete run" in (path / "README.md").read_text()
    _, done = _train(tiny_model_dir, tmp_path / "w", steps=(2, 2), resume=True)
    assert done["complete"] is True and done["stage2_steps_done"] == 2 and done["cpu_hours_steps"] >= 0


def test_text_lora_baseline_trains_saves_and_refuses_another_base(tiny_model_dir, tmp_path, smol_tokenizer):
    from conftest import make_tiny_llama

    from compressor.decoder_lora import load_decoder_adapter, save_decoder_adapter, train_text_lora
    from compressor.errors import BaseModelMismatchError

    tc = ICAETrainConfig(stage1_steps=0, stage2_steps=3, batch_size=2, checkpoint_every=1, precision="fp32",
                         stage2_targets="distill", distill_top_k=8, stage2_lr=5e-2)
    tensors, report = train_text_lora(QA, tmp_path / "w", str(tiny_model_dir), tc, r=4, progress=False,
                                      log=lambda s: None)
    assert report["stage2_steps_done"] == 3 and any(v.abs().sum() > 0 for k, v in tensors.items() if "lora_B" in k)
    path = save_decoder_adapter(tmp_path / "art", str(tiny_model_dir), tensors, 4, "all-linear",
                                {"data": "unit test", **report})
    adapter = load_decoder_adapter(path, str(tiny_model_dir))
    base = HFBackend.load(str(tiny_model_dir), dtype="float32")
    reader = base.with_adapter(adapter)
    ids = torch.tensor([smol_tokenizer("What is the capital of France?")["input_ids"]])
    with torch.no_grad():
        assert not torch.allclose(reader.model(input_ids=ids).logits, base.model(input_ids=ids).logits, atol=1e-3)
    other = tmp_path / "other"
    make_tiny_llama(len(smol_tokenizer), seed=9).save_pretrained(other)
    smol_tokenizer.save_pretrained(other)
    with pytest.raises(BaseModelMismatchError):
        load_decoder_adapter(path, str(other))
    with pytest.raises(ConfigError, match="stage1_steps=0"):
        train_text_lora(QA, tmp_path / "x", str(tiny_model_dir), tc.model_copy(update={"stage1_steps": 1}),
                        progress=False)


def test_soft_controls_zero_or_swap_the_slots(counter, smol_tokenizer, tiny_model_dir):
    from adapters.bench import _method_spec
    from adapters.datasets import QAExample
    from adapters.evaluate import evaluate
    from compressor.icae import ICAEEncoder

    comp = ICAECompressor(counter, ICAEEncoder(load_causal_lm(tiny_model_dir, dtype="float32")[0],
                                               _cfg(tiny_model_dir)), smol_tokenizer)
    fake = FakeBackend(smol_tokenizer, reply="x")
    exs = [QAExample(id=str(i), question=r.question, answers=list(r.answers), passages=list(r.passages))
           for i, r in enumerate(QA)]
    mine = evaluate(exs, fake, comp, progress=False)
    zero = evaluate(exs, fake, comp, progress=False, control="zeroed")
    other = evaluate(exs, fake, comp, progress=False, control="other")
    calls = fake.calls
    n = len(exs)
    own, zeroed, swapped = calls[:n], calls[n: 2 * n], calls[2 * n:]
    for a, z in zip(own, zeroed, strict=True):
        soft = [s for s in z.segments if not isinstance(s, list)]
        assert soft and all(float(s.abs().sum()) == 0 for s in soft) and len(a) == len(z)
    for i in range(n):  # question i reads question i+1's slots (cyclically), under its own question
        got = [s for s in swapped[i].segments if not isinstance(s, list)]
        want = [s for s in own[(i + 1) % n].segments if not isinstance(s, list)]
        assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert "What is the capital of France?" in smol_tokenizer.decode(
        [t for s in swapped[0].segments if isinstance(s, list) for t in s])
    assert [r["tokens_in"] for r in other] == [r["tokens_in"] for r in mine]  # sizes stay the method's own
    assert [r["tokens_in"] for r in zero] == [r["tokens_in"] for r in mine]
    with pytest.raises(ConfigError, match="soft methods"):
        _method_spec("none@zeroed")
    with pytest.raises(ConfigError, match="own decoder adapter"):
        _method_spec("icae@lora")
    assert _method_spec("icae@other").name == "icae"


def test_train_chunk_script_resumes_the_committed_checkpoint_and_writes_a_loadable_artifact(tiny_model_dir, tmp_path,
                                                                                            counter):
    """examples/train_chunk.sh (and gpu_train.sh, which is it with DEVICE=cuda) on a tiny model on the CPU: a
    chunk copies its checkpoint into the run folder (what a session commits); a chunk on a fresh machine resumes
    from it; the artifact loads."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    src = tmp_path / "run"
    src.mkdir()
    (src / "args.txt").write_text(
        f"--base {tiny_model_dir} --lora-r 2 --segment-tokens 16 --stage1-steps 0 --stage2-steps 2 --batch-size 1\n"
        "--multi-passage --distractors 2 --n-nq 2 --n-squad 1 --n-hotpot 1 --n-val 1 --stage2-targets distill\n"
        "--decoder-lora-r 2 --checkpoint-every 1 --precision fp32 --max-answer-tokens 4\n")
    env = {**os.environ, "SRC": str(src), "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"),
           "RAGPRESS": os.path.join(os.path.dirname(sys.executable), "ragpress"), "MAX_HOURS": "1"}
    script = ["bash", str(REPO / "examples" / "train_chunk.sh")]
    run = subprocess.run(script, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    ckpt = json.loads((src / "checkpoint" / "compressor_config.json").read_text())
    assert ckpt["step"] == 2 and (src / "train_log.jsonl").read_text().count("\n") == 2
    first = ICAECompressor.from_pretrained(tmp_path / "out", counter, base=str(tiny_model_dir), dtype="float32")
    assert first.decoder_adapter() is not None
    assert json.loads((tmp_path / "out" / "compressor_config.json").read_text())["training"]["complete"] is True

    env.update(WORK=str(tmp_path / "fresh-machine"), OUT=str(tmp_path / "out2"))  # only the run folder is there
    run = subprocess.run(script, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "resumed at step 2 of 2" in run.stdout + run.stderr
    again = ICAECompressor.from_pretrained(tmp_path / "out2", counter, base=str(tiny_model_dir), dtype="float32")
    a, b = first.encoder.trainable_tensors(), again.encoder.trainable_tensors()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    missing = subprocess.run(script, env={**env, "SRC": str(tmp_path / "nothing")}, capture_output=True, text=True)
    assert missing.returncode == 2 and "no " in missing.stderr and "args.txt" in missing.stderr


def test_contrastive_term_reads_the_next_records_passages_and_zeroed_slots(tiny_model_dir, tmp_path):
    """contrast_weight > 0: each stage-2 step also scores every record's target from the next record's passages
    (its slots, titles and layout, the record's own question) and from zeroed slots, and logs the gaps."""
    start, _ = _train(tiny_model_dir, tmp_path / "s", steps=(2, 0), config=_cfg(tiny_model_dir))
    init = str(start.save_pretrained(tmp_path / "init", trained=True))
    _train(tiny_model_dir, tmp_path / "c", steps=(0, 2), train_encoder=False, init_from=init, contrast_weight=1.0,
           contrast_negatives="both")
    lines = [json.loads(x) for x in (tmp_path / "c" / "train_log.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(x["contrast"] > 0 and "logp_gap" in x and "logp_gap_zeroed" in x for x in lines)
    assert any(x["logp_gap"] != 0 for x in lines)  # other records' passages change the target's likelihood
    with pytest.raises(ValueError, match="batch_size"):
        ICAETrainConfig(contrast_weight=1.0, batch_size=1)
    # the same record twice: the next record's passages are its own, so the gap is 0 and the term log 2
    twice = [QA[0], QARecord(QA[0].question, QA[0].passages, QA[0].answer, QA[0].answers, QA[0].evidence)]
    tc = ICAETrainConfig(stage1_steps=0, stage2_steps=1, batch_size=2, precision="fp32", stage2_targets="distill",
                         distill_top_k=8, train_encoder=False, init_from=init, contrast_weight=1.0)
    train_icae([], twice, tmp_path / "t", _cfg(tiny_model_dir, decoder_lora_r=4), tc, progress=False,
               log=lambda s: None)
    x = json.loads((tmp_path / "t" / "train_log.jsonl").read_text().splitlines()[0])
    assert abs(x["logp_gap"]) < 1e-5 and abs(x["contrast"] - math.log(2)) < 1e-5
    # zeroed slots alone: one record a batch is enough, and the term is softplus(-beta * gap)
    tz = tc.model_copy(update={"batch_size": 1, "contrast_negatives": "zeroed", "contrast_beta": 3.0})
    train_icae([], QA, tmp_path / "z", _cfg(tiny_model_dir, decoder_lora_r=4), tz, progress=False, log=lambda s: None)
    x = json.loads((tmp_path / "z" / "train_log.jsonl").read_text().splitlines()[0])
    assert "logp_gap" not in x and abs(x["contrast"] - math.log1p(math.exp(-3.0 * x["logp_gap_zeroed"]))) < 1e-4
