"""xRAG: bridge, document index, soft-row splicing, artifacts, training. Tiny Llama decoder (hidden 32, from
config, fixed seed) and the real MiniLM embedder."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys

import pytest
import torch
from conftest import REPO, interrupted, make_tiny_llama

from adapters.decoders import GenerationParams
from compressor import (
    ArtifactError,
    BaseModelMismatchError,
    Budget,
    BudgetError,
    ConfigError,
    InputError,
    Passage,
    PromptBuilder,
    available_compressors,
)
from compressor.prompt import embed_prompt
from compressor.retrieval import DocumentIndex, cached_index
from compressor.xrag import (
    SHIPPED_ARTIFACT,
    XRAGCompressor,
    XRAGConfig,
    XRAGTrainConfig,
    load_xrag,
)
from compressor.xrag.projector import Bridge, embedding_row_norm
from compressor.xrag.train import QARecord, train_xrag
from serving.cli import main

PASSAGES = [
    Passage(text="Paris is the capital and most populous city of France.", title="Paris"),
    Passage(text="The mitochondrion is the powerhouse of the cell, producing ATP.", title="Mitochondrion"),
    Passage(text="Mount Everest is Earth's highest mountain above sea level.", title="Everest"),
]
HIDDEN = 32  # tiny Llama's hidden size


@pytest.fixture(scope="module")
def index():
    return DocumentIndex.build(PASSAGES + [PASSAGES[0]])  # the duplicate is stored once


def _comp(counter, tiny_model_dir, index=None, seed=0):
    torch.manual_seed(seed)
    return XRAGCompressor(counter, XRAGConfig(decoder=str(tiny_model_dir), bridge_width=24), Bridge(384, 24, HIDDEN),
                          index=index)


def test_config_validates_and_imports_no_torch():
    with pytest.raises(ValueError, match="bridge_width"):
        XRAGConfig(bridge_width=0)
    with pytest.raises(ValueError, match="precision"):
        XRAGTrainConfig(precision="fp16")
    code = "import sys, compressor, compressor.xrag, compressor.xrag.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_always_registered_and_says_whether_the_bridge_ships():
    spec = available_compressors()["xrag"]
    assert spec.artifact == SHIPPED_ARTIFACT and spec.shipped == SHIPPED_ARTIFACT.is_dir()


def test_bridge_shapes_and_norm_calibration(tiny_model):
    torch.manual_seed(0)
    b = Bridge(384, 48, HIDDEN)
    x = torch.nn.functional.normalize(torch.randn(10, 384), dim=-1)
    assert b(x).shape == (10, HIDDEN) and b(x[0]).shape == (HIDDEN,)
    target = embedding_row_norm(tiny_model)
    b.calibrate_(x, target)
    with torch.no_grad():
        assert float(b(x).norm(dim=-1).mean()) == pytest.approx(target, rel=1e-4)
    with pytest.raises(ValueError, match="expected 384"):
        b(torch.randn(2, 100))
    assert set(b.tensors()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "in_mean", "in_std"}


def test_index_round_trip_and_retrieval_order(index, tmp_path):
    assert len(index) == 3 and index.dim == 384
    assert torch.allclose(index.vectors.norm(dim=-1), torch.ones(3), atol=1e-5)
    top = index.retrieve(["What is the capital of France?", "highest mountain on Earth"], k=3)
    assert top[0][0].title == "Paris" and top[1][0].title == "Everest" and len(top[0]) == 3
    scores, rows = index.search(index.vectors[[2]], k=3)
    assert int(rows[0, 0]) == 2 and (scores[0, :-1] >= scores[0, 1:]).all()
    path = index.save(tmp_path / "idx")
    again = DocumentIndex.load(path)
    assert torch.equal(again.vectors, index.vectors) and again.passages == index.passages
    assert again.embedder == index.embedder and again.keys == index.keys
    vecs, hits = again.lookup([PASSAGES[1].text, "not indexed"])
    assert hits == [True, False] and torch.equal(vecs[0], index.vectors[1]) and not vecs[1].any()
    lines = (path / "passages.jsonl").read_text().splitlines()
    (path / "passages.jsonl").write_text("\n".join([lines[0].replace("Paris", "Lyon")] + lines[1:]) + "\n")
    with pytest.raises(ArtifactError, match="sha256"):
        DocumentIndex.load(path)


def test_cached_index_and_user_vectors(index, tmp_path):
    a, folder, built = cached_index("t", PASSAGES, root=tmp_path)
    b, folder2, built2 = cached_index("t", PASSAGES, root=tmp_path)
    assert built and not built2 and folder == folder2 and torch.equal(a.vectors, b.vectors)
    assert cached_index("t", PASSAGES[:2], root=tmp_path)[1] != folder  # another corpus, another index
    user = DocumentIndex.from_vectors(PASSAGES, index.vectors * 3.0)  # normalised on the way in
    assert torch.allclose(user.vectors, index.vectors, atol=1e-6)
    with pytest.raises(InputError, match="all-zero"):
        DocumentIndex.from_vectors(PASSAGES, torch.zeros(3, 384))
    with pytest.raises(InputError, match="one row a passage"):
        DocumentIndex.from_vectors(PASSAGES, torch.ones(2, 384))


def test_retriever_lives_outside_the_family():
    import compressor.retrieval as retrieval
    import compressor.xrag as xrag

    assert xrag.DocumentIndex is DocumentIndex and xrag.cached_index is cached_index  # lazy re-export
    assert xrag.text_key is retrieval.text_key
    code = "import sys, compressor.retrieval; assert 'compressor.xrag.model' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_one_row_per_passage_from_stored_vectors(counter, tiny_model_dir, index):
    comp = _comp(counter, tiny_model_dir, index)
    ctx = comp.compress("capital of France?", [PASSAGES[2], PASSAGES[0]])
    assert ctx.kind == "soft" and ctx.tokens_out == 2 and ctx.ratio == ctx.tokens_in / 2
    assert [p.title for p in ctx.passages] == ["Everest", "Paris"]
    assert all(p.embeds.shape == (1, HIDDEN) and p.tokens_out == 1 for p in ctx.passages)
    want = comp.rows(index.vectors[[2, 0]])
    assert torch.equal(torch.cat([p.embeds for p in ctx.passages]), want)
    assert (comp.index_hits, comp.encoded_on_the_fly) == (2, 0)
    comp.compress("q?", ["A passage that is not in the index."])
    assert (comp.index_hits, comp.encoded_on_the_fly) == (2, 1)
    rounded = comp.compress("q?", PASSAGES, Budget(target_tokens=2))  # one row per passage is the least
    assert rounded.tokens_out == 3 and rounded.stopped_by == "granularity"
    with pytest.raises(BudgetError, match="the least it keeps is 3"):
        comp.compress("q?", PASSAGES, Budget(target_tokens=2, strict=True))


def test_index_from_another_embedder_refused(counter, tiny_model_dir, index):
    comp = _comp(counter, tiny_model_dir)
    comp.manifest = {"embedder": {"id": "minilm-l6", "sha256": index.embedder["sha256"]}}
    comp.attach_index(index)
    other = DocumentIndex(index.passages, index.vectors, {"id": "other", "sha256": "0" * 64})
    with pytest.raises(BaseModelMismatchError, match="rebuild the index"):
        comp.attach_index(other)


def test_rows_spliced_at_placeholders(counter, tiny_model_dir, index, tiny_model, smol_tokenizer):
    ctx = _comp(counter, tiny_model_dir, index).compress("Which is highest?", PASSAGES)
    prompt = PromptBuilder(smol_tokenizer).build(ctx)
    kinds = ["soft" if isinstance(s, torch.Tensor) else "ids" for s in prompt.segments]
    assert kinds == ["ids", "soft", "ids", "soft", "ids", "soft", "ids"]
    pos, where = 0, []
    for i, seg in enumerate(prompt.segments):
        if isinstance(seg, list):
            if i + 1 < len(prompt.segments):
                n = len(where) + 1
                assert smol_tokenizer.decode(seg).endswith(f"[{n}] {PASSAGES[n - 1].title}: ")
            pos += len(seg)
        else:
            where.append(pos)
            pos += 1
    e = embed_prompt(tiny_model, prompt)
    assert e.shape == (len(prompt), HIDDEN)
    for k, p in enumerate(where):
        assert torch.equal(e[p], ctx.passages[k].embeds[0])


def test_soft_batch_generation_equals_single(counter, tiny_model_dir, index, tiny_backend):
    comp = _comp(counter, tiny_model_dir, index)
    b = tiny_backend.prompt_builder()
    prompts = [b.build(comp.compress("Which city is the capital?", PASSAGES)),
               b.build(comp.compress("What makes ATP?", [PASSAGES[1]]))]
    params = GenerationParams(max_new_tokens=6, stop=[])
    batch = tiny_backend.generate(prompts, params)
    single = [tiny_backend.generate([p], params)[0] for p in prompts]
    assert [g.token_ids for g in batch] == [g.token_ids for g in single]
    assert batch[0].prompt_tokens == len(prompts[0])


def test_artifact_round_trip_and_mismatch_refusal(counter, tiny_model_dir, index, tmp_path, smol_tokenizer):
    comp = _comp(counter, tiny_model_dir, index)
    path = comp.save_pretrained(tmp_path / "art", trained=True, training={"data": "unit test"})
    cfg = json.loads((path / "compressor_config.json").read_text())
    assert cfg["type"] == "xrag" and cfg["trained"] is True and cfg["bridge"]["out_dim"] == HIDDEN
    assert cfg["embedder"]["id"] == "minilm-l6" and len(cfg["embedder"]["sha256"]) == 64
    assert len(cfg["decoder"]["sha256"]) == 64 and cfg["decoder"]["hidden_size"] == HIDDEN
    again = XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir), index=index)
    a, b = comp.compress("q?", PASSAGES), again.compress("q?", PASSAGES)
    assert all(torch.equal(x.embeds, y.embeds) for x, y in zip(a.passages, b.passages))
    with pytest.raises(ConfigError, match="pass decoder=PATH"):
        XRAGCompressor.from_pretrained(path, counter)
    other_decoder = tmp_path / "other-decoder"
    make_tiny_llama(len(smol_tokenizer), seed=1).save_pretrained(other_decoder)
    with pytest.raises(BaseModelMismatchError, match="trained with decoder"):
        XRAGCompressor.from_pretrained(path, counter, decoder=str(other_decoder))
    from transformers import BertConfig, BertModel

    other_embedder = tmp_path / "other-embedder"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=100, hidden_size=384, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=64)).save_pretrained(other_embedder)
    with pytest.raises(BaseModelMismatchError, match="trained with embedder"):
        XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir), embedder=str(other_embedder))
    control = comp.save_pretrained(tmp_path / "control", trained=False)
    with pytest.raises(ArtifactError, match="untrained bridge"):
        XRAGCompressor.from_pretrained(control, counter, decoder=str(tiny_model_dir))
    assert not load_xrag(counter, control, decoder=str(tiny_model_dir)).trained  # explicit path: allowed
    assert "UNTRAINED CONTROL" in (control / "README.md").read_text()


TEXTS = [p.text for p in PASSAGES]
QA = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris"),
      QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion")]


def _train(tiny_model_dir, work, steps=(3, 2), resume=False, **kw):
    cfg = XRAGConfig(decoder=str(tiny_model_dir), bridge_width=16)
    tc = XRAGTrainConfig(stage1_steps=steps[0], stage2_steps=steps[1], batch_size=2, checkpoint_every=1,
                         precision="fp32", max_passage_tokens=12, **kw)
    return train_xrag(TEXTS, QA, work, cfg, tc, resume=resume, progress=False, log=lambda s: None)


def test_training_checkpoints_and_resumes_exactly(tiny_model_dir, tmp_path, monkeypatch):
    full, report = _train(tiny_model_dir, tmp_path / "a")
    assert report["stage1_steps_done"] == 3 and report["stage2_steps_done"] == 2
    log = [json.loads(x) for x in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in log] == [1, 1, 1, 2, 2] and all(r["kl"] > 0 for r in log[3:])
    with pytest.raises(ConfigError, match="--resume"):
        _train(tiny_model_dir, tmp_path / "a")

    interrupted(monkeypatch, 3, lambda: _train(tiny_model_dir, tmp_path / "b"))  # stops in stage 1, after step 2
    with pytest.raises(ConfigError, match="differ from the checkpoint"):
        _train(tiny_model_dir, tmp_path / "b", resume=True, kl_weight=1.0)
    # a checkpoint written before a setting existed resumes as if it held the setting's default, and only then
    cfg_path = tmp_path / "b" / "checkpoint" / "compressor_config.json"
    state = json.loads(cfg_path.read_text())
    del state["identity"]["train"]["contrast_negatives"]
    cfg_path.write_text(json.dumps(state))
    with pytest.raises(ConfigError, match=r"\['train'\] differ"):
        _train(tiny_model_dir, tmp_path / "b", resume=True, contrast_negatives="zeroed")
    resumed, _ = _train(tiny_model_dir, tmp_path / "b", resume=True)
    for k, v in full.bridge.tensors().items():
        assert torch.allclose(v, resumed.bridge.tensors()[k], atol=1e-6), k
    assert len((tmp_path / "b" / "train_log.jsonl").read_text().splitlines()) == 5


def test_training_reduces_the_paraphrase_loss(tiny_model_dir, tmp_path):
    _, report = _train(tiny_model_dir, tmp_path / "w", steps=(20, 0), stage1_lr=1e-2)
    assert report["stage1_loss_last"] < report["stage1_loss_first"]


def test_cli_untrained_control_and_retrieval_eval(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAGPRESS_HOME", str(tmp_path / "home"))
    out = tmp_path / "untrained"
    assert main(["train", "xrag", "--out", str(out), "--work-dir", str(tmp_path / "work"), "--stage1-steps", "0",
                 "--stage2-steps", "0", "--decoder", str(tiny_model_dir), "--bridge-width", "16",
                 "--n-stage1", "8", "--n-nq", "2", "--n-squad", "0"]) == 0
    assert json.loads((out / "compressor_config.json").read_text())["trained"] is False
    nq = tmp_path / "nq.jsonl.gz"
    with gzip.open(nq, "wt") as f:
        for i, p in enumerate(PASSAGES):
            f.write(json.dumps({"question": f"question {i} about {p.title}?", "answers": [p.title],
                                "ctxs": [{"title": p.title, "text": p.text, "isgold": True}]}) + "\n")
    summary = tmp_path / "eval.json"
    assert main(["eval", "--dataset", "nq", "--path", str(nq), "--method", "xrag", "--artifact", str(out),
                 "--retrieve", "2", "--limit", "2", "--decoder", str(tiny_model_dir), "--max-new-tokens", "2",
                 "--out", str(summary)]) == 0
    s = json.loads(summary.read_text())
    assert s["trained"] is False and s["retrieve"] == 2 and s["tokens_out_mean"] == 2
    assert s["encoded_on_the_fly"] == 0 and s["index_hits"] == 4 and s["gold_recall_at_k"] is not None
    assert "UNTRAINED" in capsys.readouterr().err
    if not SHIPPED_ARTIFACT.is_dir():
        assert main(["eval", "--dataset", "nq", "--path", str(nq), "--method", "xrag", "--limit", "1",
                     "--decoder", str(tiny_model_dir)]) == 2
        assert "no shipped xrag bridge" in capsys.readouterr().err


# -- format 2: the decoder's own hidden states as the bridge input, several rows per passage -----------------------

def test_pool_pieces_runs_and_sink_left_out():
    from compressor.xrag.features import pool_pieces

    h = torch.arange(9, dtype=torch.float32)[:, None].repeat(1, 2)  # position p holds p
    assert pool_pieces(h, 9, 2)[:, 0].tolist() == [2.5, 6.5]  # positions 1-4 and 5-8: position 0 left out
    assert pool_pieces(h, 9, 1)[:, 0].tolist() == [4.5]
    assert pool_pieces(h, 2, 4)[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]  # fewer tokens than pieces: repeats
    assert pool_pieces(h, 9, 3).shape == (3, 2)


def test_decoder_source_is_the_layer_hidden_state_pooled_and_batch_independent(tiny_model, smol_tokenizer):
    from compressor.xrag.features import DecoderSource, pool_pieces

    src = DecoderSource(tiny_model, smol_tokenizer, layer=1, pieces=3, batch_size=4)
    texts = [p.text for p in PASSAGES]
    together = src.encode(texts)
    assert together.shape == (3, 3, HIDDEN)
    for i, t in enumerate(texts):
        ids = torch.tensor([smol_tokenizer(t, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            hs = tiny_model(input_ids=ids, output_hidden_states=True).hidden_states[1][0]
        torch.testing.assert_close(together[i], pool_pieces(hs, ids.shape[1], 3), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(src.encode([t])[0], together[i], atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="choose 0..2"):
        DecoderSource(tiny_model, smol_tokenizer, layer=3, pieces=1)


def _dec_comp(counter, tiny_model_dir, tiny_model, smol_tokenizer, cache_dir=None, rows=2, seed=0):
    from compressor.xrag.features import DecoderSource

    torch.manual_seed(seed)
    cfg = XRAGConfig(decoder=str(tiny_model_dir), source="decoder", source_layer=1, source_dtype="float32",
                     rows=rows, bridge_width=24, cache_dir=None if cache_dir is None else str(cache_dir))
    return XRAGCompressor(counter, cfg, Bridge(HIDDEN, 24, HIDDEN),
                          source=DecoderSource(tiny_model, smol_tokenizer, 1, rows))


def test_decoder_source_rows_index_cache_and_batch(counter, tiny_model_dir, tiny_model, smol_tokenizer, tmp_path):
    comp = _dec_comp(counter, tiny_model_dir, tiny_model, smol_tokenizer, tmp_path / "rows")
    ctx = comp.compress("Which city is the capital?", PASSAGES)
    assert [p.tokens_out for p in ctx.passages] == [2, 2, 2] and all(p.embeds.shape == (2, HIDDEN) for p in ctx.passages)
    assert ctx.tokens_out == 6 and ctx.ratio == pytest.approx(ctx.tokens_in / 6)
    fresh = _dec_comp(counter, tiny_model_dir, tiny_model, smol_tokenizer, tmp_path / "rows")
    report = fresh.index(PASSAGES + [PASSAGES[0]])
    assert (report.computed, report.cached, report.duplicates) == (0, 3, 1)  # the first compress stored them
    again = fresh.compress("Which city is the capital?", PASSAGES)
    assert fresh.encoded_on_the_fly == 0 and fresh.cache.hits >= 6
    assert all(torch.equal(a.embeds, b.embeds) for a, b in zip(ctx.passages, again.passages))
    other = _dec_comp(counter, tiny_model_dir, tiny_model, smol_tokenizer, tmp_path / "other")
    assert other.index(PASSAGES).computed == 3
    batch = other.compress_batch([("q one?", PASSAGES, None), ("q two?", [PASSAGES[2], PASSAGES[1]], None)])
    single = [comp.compress("q one?", PASSAGES), comp.compress("q two?", [PASSAGES[2], PASSAGES[1]])]
    for b, s in zip(batch, single):
        assert all(torch.allclose(x.embeds, y.embeds, atol=1e-6) for x, y in zip(b.passages, s.passages))
    with pytest.raises(BudgetError, match="least it keeps is 6"):
        comp.compress("q?", PASSAGES, Budget(target_tokens=3, strict=True))
    short = comp.compress("q?", [Passage(text="Paris")])  # no longer than its rows: passes as text
    assert short.passages[0].text == "Paris" and short.passages[0].embeds is None


def test_decoder_source_artifact_round_trip_and_refusals(counter, tiny_model_dir, tiny_model, smol_tokenizer,
                                                         tmp_path):
    comp = _dec_comp(counter, tiny_model_dir, tiny_model, smol_tokenizer, rows=3)
    comp.bridge.standardise_(torch.randn(50, HIDDEN) * 5 + 2)
    path = comp.save_pretrained(tmp_path / "art", trained=True, training={"data": "unit test"})
    cfg = json.loads((path / "compressor_config.json").read_text())
    assert cfg["format_version"] == 2 and "embedder" not in cfg and cfg["rows"] == 3
    assert cfg["source"] == {"source": "decoder", "layer": 1, "pieces": 3, "dtype": "float32"}
    again = XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir))
    assert torch.equal(again.bridge.in_std, comp.bridge.in_std)
    a, b = comp.compress("q?", PASSAGES), again.compress("q?", PASSAGES)
    assert all(torch.allclose(x.embeds, y.embeds, atol=1e-5) for x, y in zip(a.passages, b.passages))
    other = tmp_path / "other-decoder"
    make_tiny_llama(len(smol_tokenizer), seed=1).save_pretrained(other)
    with pytest.raises(BaseModelMismatchError, match="trained with decoder"):
        XRAGCompressor.from_pretrained(path, counter, decoder=str(other))
    with pytest.raises(ConfigError, match="rows is fixed"):
        XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir), rows=1)


def test_format_1_artifact_still_loads(counter):
    exp1 = REPO / "compressor" / "artifacts" / "xrag-minilm-smollm2-exp1"
    comp = load_xrag(counter, exp1)
    assert comp.config.source == "embedder" and comp.config.rows == 1 and comp.bridge.per_input == 1
    assert torch.equal(comp.bridge.in_mean, torch.zeros(384)) and torch.equal(comp.bridge.in_std, torch.ones(384))


def test_distilled_training_on_decoder_states_validates_and_resumes(tiny_model_dir, tmp_path, monkeypatch):
    qa = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris", ("Paris",), (0,)),
          QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion", ("mitochondrion",), (0,))]

    def run(work, resume=False, **kw):
        cfg = XRAGConfig(decoder=str(tiny_model_dir), source="decoder", source_layer=2, source_dtype="float32",
                         rows=2, bridge_width=16)
        tc = XRAGTrainConfig(stage1_steps=2, stage2_steps=3, batch_size=2, checkpoint_every=1, precision="fp32",
                             max_passage_tokens=12, max_answer_tokens=4, stage2_targets="distill", **kw)
        return train_xrag(TEXTS, qa, work, cfg, tc, resume=resume, progress=False, log=lambda s: None,
                          accept=lambda text, r: True, val=qa[:1],
                          score=lambda text, r: {"f1": float(r.answer.lower() in text.lower())})

    full, report = run(tmp_path / "a")
    assert report["stage2_steps_done"] == 3 and [v["step"] for v in report["validation"]] == [0, 1, 2, 3, 4, 5]
    assert (tmp_path / "teacher").exists() is False and (tmp_path / "a" / "teacher").is_dir()
    assert full.config.rows == 2 and full.bridge.per_input == 1 and float(full.bridge.in_std.mean()) != 1.0
    interrupted(monkeypatch, 4, lambda: run(tmp_path / "b"))
    resumed, _ = run(tmp_path / "b", resume=True)
    for k, v in full.bridge.tensors().items():
        assert torch.allclose(v, resumed.bridge.tensors()[k], atol=1e-6), k


def test_shared_prefix_is_run_once_with_the_same_logits_and_gradients(smol_tokenizer):
    from compressor.training import _PREFIX_KV, qa_layouts, shared_prefix, target_logits

    model = make_tiny_llama(len(smol_tokenizer)).float().requires_grad_(False)
    b = PromptBuilder(smol_tokenizer)
    seqs = [qa_layouts(b, r, [3] * len(r.passages), HIDDEN, 0, 8)[0] for r in QA]
    p = shared_prefix(seqs)
    assert 0 < p <= min(min(s.rows) for s in seqs) and all(s.ids[:p] == seqs[0].ids[:p] for s in seqs)
    rows = torch.randn(9, HIDDEN, requires_grad=True)
    fast = target_logits(model, seqs, 0, rows)
    assert any(k[0] == id(model) for k in _PREFIX_KV)
    g_fast = torch.autograd.grad(fast.logsumexp(-1).sum(), rows)[0]
    model.lm_head.weight.requires_grad_(True)  # a model being trained: the whole sequence, every call
    full = target_logits(model, seqs, 0, rows)
    g_full = torch.autograd.grad(full.logsumexp(-1).sum(), rows)[0]
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_fast, g_full, atol=1e-6, rtol=1e-5)


def test_contrastive_term_reads_the_next_records_rows(tiny_model_dir, tmp_path):
    """contrast_weight > 0: each stage-2 step also scores the targets under the next record's rows and logs the
    logistic loss on the per-record gap of mean log-probabilities; mean_logp splits the targets per record."""
    from compressor.distill import mean_logp

    logits = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]))
    got = mean_logp(logits, torch.tensor([0, 0, 1]), [1, 2])
    torch.testing.assert_close(got, torch.tensor([math.log(0.5), (math.log(0.9) + math.log(0.8)) / 2]))
    qa = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris", ("Paris",), (0,)),
          QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion", ("mitochondrion",), (0,))]
    cfg = XRAGConfig(decoder=str(tiny_model_dir), source="decoder", source_layer=2, source_dtype="float32", rows=2,
                     bridge_width=16)
    tc = XRAGTrainConfig(stage1_steps=0, stage2_steps=2, batch_size=2, checkpoint_every=1, precision="fp32",
                         max_answer_tokens=4, stage2_targets="distill", contrast_weight=1.0)
    train_xrag(TEXTS, qa, tmp_path / "a", cfg, tc, progress=False, log=lambda s: None, accept=lambda text, r: True)
    lines = [json.loads(x) for x in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines] == [2, 2]
    assert all(x["contrast"] > 0 and x["logp_gap"] != 0 for x in lines)  # the two records' rows differ
    # a batch of one has no other record's rows: refused up front, naming the fix
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="batch of 1 has none: set batch_size to 2"):
        XRAGTrainConfig(**{**tc.model_dump(), "batch_size": 1})
    XRAGTrainConfig(**{**tc.model_dump(), "batch_size": 1, "contrast_negatives": "zeroed"})  # needs no other rows
    # two copies of one record: the next record's rows are the same rows, the gap 0, the term softplus(0) = log 2
    train_xrag(TEXTS, [qa[0], qa[0]], tmp_path / "c", cfg, tc, progress=False, log=lambda s: None,
               accept=lambda text, r: True)
    for x in (json.loads(x) for x in (tmp_path / "c" / "train_log.jsonl").read_text().splitlines()):
        assert abs(x["logp_gap"]) < 1e-4 and abs(x["contrast"] - math.log(2)) < 1e-4


def test_contrast_with_zeroed_rows_and_the_zeroed_control(tiny_model_dir, tmp_path):
    """contrast_negatives="zeroed": the baseline is the target read with zeroed rows, so a batch of one record (no
    other rows) still gets the term; "both" logs both gaps. Validation scores zeroed rows beside the other control."""
    qa = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris", ("Paris",), (0,)),
          QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion", ("mitochondrion",), (0,))]
    cfg = XRAGConfig(decoder=str(tiny_model_dir), source="decoder", source_layer=2, source_dtype="float32", rows=2,
                     bridge_width=16)
    tc = XRAGTrainConfig(stage1_steps=0, stage2_steps=2, batch_size=1, checkpoint_every=1, precision="fp32",
                         max_answer_tokens=4, stage2_targets="distill", contrast_weight=1.0,
                         contrast_negatives="zeroed")
    calls = []

    def score(answer, r):
        calls.append(answer)
        return {"f1": float("Paris" in answer)}

    train_xrag(TEXTS, qa, tmp_path / "a", cfg, tc, progress=False, log=lambda s: None, accept=lambda text, r: True,
               val=qa[:1], score=score)
    lines = [json.loads(x) for x in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    for x in lines:  # one term, on the gap to zeroed rows (not 0: the bridge's rows are not zero)
        assert "logp_gap" not in x and abs(x["logp_gap_zeroed"]) > 1e-6
        assert abs(x["contrast"] - math.log1p(math.exp(-2.0 * x["logp_gap_zeroed"]))) < 1e-4
    val = [json.loads(x) for x in (tmp_path / "a" / "val_log.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [0, 1, 2] and all("zeroed_f1" in v and "other_f1" in v for v in val)
    assert len(calls) == 3 + 3 + 1  # own and other rows at every checkpoint; zeroed rows once (frozen decoder)
    # both, on two copies of one record: the other rows are the same rows (gap 0, term log 2), so the logged term
    # is the mean of log 2 and the zeroed term
    tc2 = tc.model_copy(update={"batch_size": 2, "contrast_negatives": "both"})
    train_xrag(TEXTS, [qa[0], qa[0]], tmp_path / "b", cfg, tc2, progress=False, log=lambda s: None,
               accept=lambda text, r: True)
    for x in (json.loads(x) for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()):
        assert abs(x["logp_gap"]) < 1e-4 and abs(x["logp_gap_zeroed"]) > 1e-6
        want = (math.log(2) + math.log1p(math.exp(-2.0 * x["logp_gap_zeroed"]))) / 2
        assert abs(x["contrast"] - want) < 1e-4


def test_decoder_lora_trains_with_the_bridge_resumes_and_travels_in_the_artifact(counter, tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    """decoder_lora_r > 0: a decoder LoRA trains with the bridge (its B matrices leave zero), the teacher stays the
    frozen decoder (the targets cached by a run without the adapter are reused as they are), the zeroed control is
    scored at every checkpoint (the adapter reads zeroed rows too), resume restores both, and the artifact carries
    the adapter that backends apply; the rank is fixed by the artifact and a damaged one is refused."""
    from compressor.artifacts import read_artifact, write_artifact

    qa = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris", ("Paris",), (0,)),
          QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion", ("mitochondrion",), (0,))]
    calls = []

    def score(answer, r):
        calls.append(answer)
        return {"f1": float("Paris" in answer)}

    def run(work, r=2, resume=False, val=()):
        cfg = XRAGConfig(decoder=str(tiny_model_dir), source="decoder", source_layer=2, source_dtype="float32",
                         rows=2, bridge_width=16, decoder_lora_r=r)
        tc = XRAGTrainConfig(stage1_steps=0, stage2_steps=3, batch_size=2, checkpoint_every=1, precision="fp32",
                             max_answer_tokens=4, stage2_targets="distill", stage2_lr=1e-2,
                             contrast_weight=1.0, contrast_negatives="zeroed")
        return train_xrag(TEXTS, qa, work, cfg, tc, resume=resume, progress=False, log=lambda s: None,
                          accept=lambda text, r: True, teacher_cache=tmp_path / "teacher", val=val, score=score)

    frozen, _ = run(tmp_path / "f", r=0)
    assert frozen.decoder_adapter() is None and frozen.adapter is None
    full, report = run(tmp_path / "a", val=qa[:1])
    assert report["distill_targets"]["cached"] == len(qa)  # the frozen run's teacher targets, reused
    assert len(calls) == 3 * 4  # own, other and zeroed rows at each of the 4 checkpoints (0..3)
    ad = full.decoder_adapter()
    assert ad is not None and ad.lora["r"] == 2 and ad.name.startswith("xrag-")
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in ad.tensors.items())
    interrupted(monkeypatch, 2, lambda: run(tmp_path / "b"))
    resumed, _ = run(tmp_path / "b", resume=True)
    for k, v in full.bridge.tensors().items():
        assert torch.allclose(v, resumed.bridge.tensors()[k], atol=1e-6), k
    for k, v in ad.tensors.items():
        assert torch.allclose(v, resumed.adapter[k], atol=1e-6), k

    full.save_pretrained(tmp_path / "art", trained=True)
    back = XRAGCompressor.from_pretrained(tmp_path / "art", counter, decoder=str(tiny_model_dir))
    assert back.config.decoder_lora_r == 2 and back._source is None
    for k, v in ad.tensors.items():
        assert torch.equal(v, back.decoder_adapter().tensors[k]), k
    assert "Decoder LoRA: r=2" in (tmp_path / "art" / "README.md").read_text()
    with pytest.raises(ConfigError, match="decoder_lora_r is fixed by the trained bridge"):
        XRAGCompressor.from_pretrained(tmp_path / "art", counter, decoder=str(tiny_model_dir), decoder_lora_r=4)
    cfg, t = read_artifact(tmp_path / "art", "xrag", 2)
    write_artifact(tmp_path / "damaged", cfg, {k: v for k, v in t.items() if not k.startswith("decoder_lora.")}, "damaged")
    with pytest.raises(ArtifactError, match="decoder_lora_r=2 but 0 decoder adapter tensors"):
        XRAGCompressor.from_pretrained(tmp_path / "damaged", counter, decoder=str(tiny_model_dir))


def _tiny_icae(counter, tokenizer, base, tmp_path, name, seed):
    """A small trained-looking icae artifact on ``base`` (4 memory rows), saved under ``tmp_path / name``."""
    from compressor.icae.config import ICAEConfig
    from compressor.icae.model import ICAECompressor, ICAEEncoder
    from compressor.models import load_causal_lm

    enc = ICAEEncoder(load_causal_lm(base, dtype="float32")[0], ICAEConfig(base=str(base), segment_tokens=16,
                                                                          lora_r=4), seed=seed)
    with torch.no_grad():
        for n, p in enc.peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(seed))
    return ICAECompressor(counter, enc, tokenizer).save_pretrained(
        tmp_path / name, trained=True, training={"data": "unit test"})


def test_encoder_source_reads_the_soft_encoders_slots(counter, tiny_model_dir, smol_tokenizer, tmp_path):
    """source="encoder": each of source_runs runs of a passage read by the icae encoder with rows / runs memory
    rows after it (any run length); the residual bridge starts as the identity; training on them validates
    (step 0 = the untrained slots), the artifact records the encoder's hash and refuses another encoder."""
    from compressor.icae.model import ICAECompressor
    from compressor.xrag.features import load_encoder_source, split_runs

    assert split_runs([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4, 5]] and split_runs([7], 3) == [[7], [7], [7]]
    icae = _tiny_icae(counter, smol_tokenizer, tiny_model_dir, tmp_path, "icae", seed=1)
    with pytest.raises(ValueError, match="not a multiple of source_runs"):
        XRAGConfig(source="encoder", rows=3, source_runs=2)
    cfg = XRAGConfig(decoder=str(tiny_model_dir), source="encoder", source_encoder=str(icae), source_runs=2, rows=4,
                     source_dtype="float32", bridge_width=16)
    src = load_encoder_source(cfg)
    enc = ICAECompressor.from_pretrained(icae, base=str(tiny_model_dir), dtype="float32")
    long = " ".join(p.text for p in PASSAGES * 3)  # runs longer than the encoder's 16-token segments
    got = src.encode([PASSAGES[0].text, long])
    assert got.shape == (2, 4, HIDDEN)
    for i, text in enumerate([PASSAGES[0].text, long]):
        runs = split_runs(smol_tokenizer(text, add_special_tokens=False)["input_ids"], 2)
        assert max(len(r) for r in runs) > 16 or i == 0
        want = torch.cat([enc.encoder.encode([r], slots=2)[0] for r in runs])
        torch.testing.assert_close(got[i], want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match="has 4 memory rows"):
        load_encoder_source(cfg.model_copy(update={"rows": 10, "source_runs": 2}))

    qa = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris", ("Paris",), (0,)),
          QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion", ("mitochondrion",), (0,))]
    tc = XRAGTrainConfig(stage1_steps=0, stage2_steps=2, batch_size=2, checkpoint_every=1, precision="fp32",
                         max_answer_tokens=4, stage2_targets="distill")
    untrained, _ = train_xrag([], qa, tmp_path / "w0", cfg, tc.model_copy(update={"stage2_steps": 0}), progress=False,
                              log=lambda s: None, accept=lambda text, r: True)
    assert untrained.bridge.residual and torch.equal(untrained.bridge.fc2.weight, torch.zeros_like(untrained.bridge.fc2.weight))
    ctx = untrained.compress("q?", PASSAGES)
    slots = src.encode([p.text for p in PASSAGES])
    assert all(torch.allclose(p.embeds, slots[i], atol=1e-5) for i, p in enumerate(ctx.passages))
    assert ctx.tokens_out == 12

    comp, report = train_xrag([], qa, tmp_path / "w", cfg, tc, progress=False, log=lambda s: None,
                              accept=lambda text, r: True, val=qa[:1],
                              score=lambda text, r: {"f1": float(r.answer.lower() in text.lower())})
    assert [v["step"] for v in report["validation"]] == [0, 1, 2] and float(comp.bridge.fc2.weight.detach().abs().sum()) > 0
    path = comp.save_pretrained(tmp_path / "art", trained=True, training={"data": "unit test"})
    art = json.loads((path / "compressor_config.json").read_text())
    assert art["encoder"]["sha256"] == enc.artifact_id and art["bridge"]["residual"] is True
    assert art["source"] == {"source": "encoder", "runs": 2, "slots": 4, "dtype": "float32"}
    assert "memory slots (icae encoder sha256" in (path / "README.md").read_text()
    again = XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir))
    a, b = comp.compress("q?", PASSAGES), again.compress("q?", PASSAGES)
    assert all(torch.allclose(x.embeds, y.embeds, atol=1e-5) for x, y in zip(a.passages, b.passages))
    other = _tiny_icae(counter, smol_tokenizer, tiny_model_dir, tmp_path, "icae-other", seed=2)
    wrong = XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir), source_encoder=str(other))
    with pytest.raises(ArtifactError, match="trained on the slots of encoder"):
        wrong.compress("q?", PASSAGES)
    with pytest.raises(ConfigError, match="source_runs is fixed"):
        XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir), source_runs=4)


def test_encoder_finetuned_with_the_bridge_resumes_and_travels_in_the_artifact(counter, tiny_model_dir,
                                                                               smol_tokenizer, tmp_path, monkeypatch):
    """source_finetune: the encoder's LoRA, memory rows and slot projection train with the bridge (they move),
    resume restores them exactly, the artifact carries them (the rows it gives after loading are the trained
    ones, not the base encoder's), the row cache is keyed by them, the setting is fixed by the artifact, a damaged
    artifact and another base encoder are refused, and the option needs source='encoder'."""
    from compressor.artifacts import read_artifact, write_artifact
    from compressor.xrag.features import load_encoder_source

    with pytest.raises(ValueError, match="source_finetune=True fine-tunes the soft encoder"):
        XRAGConfig(source="decoder", source_finetune=True)
    icae = _tiny_icae(counter, smol_tokenizer, tiny_model_dir, tmp_path, "icae", seed=1)
    qa = [QARecord("What is the capital of France?", (PASSAGES[0],), "Paris", ("Paris",), (0,)),
          QARecord("What produces ATP?", (PASSAGES[1], PASSAGES[2]), "the mitochondrion", ("mitochondrion",), (0,))]
    cfg = XRAGConfig(decoder=str(tiny_model_dir), source="encoder", source_encoder=str(icae), rows=2,
                     source_dtype="float32", bridge_width=16, source_finetune=True)

    def run(work, resume=False):
        tc = XRAGTrainConfig(stage1_steps=0, stage2_steps=3, batch_size=2, checkpoint_every=1, precision="fp32",
                             max_answer_tokens=4, stage2_targets="distill", stage2_lr=1e-2, contrast_weight=1.0)
        return train_xrag([], qa, work, cfg, tc, resume=resume, progress=False, log=lambda s: None,
                          accept=lambda text, r: True, teacher_cache=tmp_path / "teacher")

    full, _ = run(tmp_path / "a")
    base = load_encoder_source(cfg.model_copy(update={"source_finetune": False}))
    start = base.comp.encoder.trainable_tensors(("encoder",))
    assert set(full.encoder_tensors) == set(start)
    assert any(not torch.allclose(full.encoder_tensors[k], v) for k, v in start.items() if ".lora_" in k)
    assert not torch.allclose(full.encoder_tensors["memory"], start["memory"])
    interrupted(monkeypatch, 2, lambda: run(tmp_path / "b"))
    resumed, _ = run(tmp_path / "b", resume=True)
    for k, v in full.encoder_tensors.items():
        assert torch.allclose(v, resumed.encoder_tensors[k], atol=1e-6), k

    path = full.save_pretrained(tmp_path / "art", trained=True, training={"data": "unit test"})
    art = json.loads((path / "compressor_config.json").read_text())
    assert art["source"]["finetuned"] is True and len(art["encoder"]["finetuned_sha256"]) == 64
    assert "fine-tuned with the bridge" in (path / "README.md").read_text()
    back = XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir))
    a, b = full.compress("q?", PASSAGES), back.compress("q?", PASSAGES)
    assert all(torch.allclose(x.embeds, y.embeds, atol=1e-5) for x, y in zip(a.passages, b.passages))
    unfinetuned = full.rows(base.encode([p.text for p in PASSAGES]))
    assert not torch.allclose(unfinetuned[0], b.passages[0].embeds, atol=1e-4)
    nudged = {k: v.clone() for k, v in back.encoder_tensors.items()}
    nudged["memory"][0, 0] += 1.0
    base_enc = {"sha256": art["encoder"]["sha256"]}
    assert back._cache_id() != XRAGCompressor(counter, back.config, back.bridge, manifest={"encoder": base_enc},
                                              encoder_tensors=nudged)._cache_id()
    with pytest.raises(ArtifactError, match="do not match their recorded sha256"):
        XRAGCompressor(counter, back.config, back.bridge, manifest={"encoder": dict(art["encoder"])},
                       encoder_tensors=nudged)
    with pytest.raises(ConfigError, match="source_finetune is fixed"):
        XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir), source_finetune=False)
    other = _tiny_icae(counter, smol_tokenizer, tiny_model_dir, tmp_path, "icae-other", seed=2)
    with pytest.raises(ArtifactError, match="trained on the slots of encoder"):
        XRAGCompressor.from_pretrained(path, counter, decoder=str(tiny_model_dir),
                                       source_encoder=str(other)).compress("q?", PASSAGES)
    meta, t = read_artifact(path, "xrag", 2)
    write_artifact(tmp_path / "damaged", meta, {k: v for k, v in t.items() if not k.startswith("encoder.")}, "damaged")
    with pytest.raises(ArtifactError, match="but 0 fine-tuned encoder tensors"):
        XRAGCompressor.from_pretrained(tmp_path / "damaged", counter, decoder=str(tiny_model_dir))
