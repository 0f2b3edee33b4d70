"""The static embedder distilled from MiniLM (compressor/static_embed.py)."""

from __future__ import annotations

import json

import pytest
import torch

from compressor import models as M
from compressor import static_embed as S
from compressor.embed import get_embedder


@pytest.fixture(scope="module")
def static():
    return get_embedder("minilm-l6-static")


@pytest.mark.real_model
def test_table_rows_are_the_encoders_token_readout(static):
    model, tok = M.load_embedder("minilm-l6")
    ids = [tok.convert_tokens_to_ids(t) for t in ("paris", "the", "##ing")]
    inp = torch.tensor([[tok.cls_token_id, i, tok.sep_token_id] for i in ids])
    with torch.inference_mode():
        rows = model(input_ids=inp, attention_mask=torch.ones_like(inp)).last_hidden_state[:, 1].float()
    # centred: each row is the readout minus one shared vector
    shift = rows - static.table[ids]
    assert torch.allclose(shift[0], shift[1], atol=1e-4) and torch.allclose(shift[0], shift[2], atol=1e-4)
    # SIF: a frequent token weighs less than a rare one; a token the counts never saw weighs 1
    the, paris = static.weights[ids[1]], static.weights[ids[0]]
    assert 0 < the < paris <= 1
    unseen = [i for i, w in enumerate(static.weights.tolist()) if w == 1.0]
    assert unseen and static.table.shape == (len(tok), 384)
    assert all(static.weights[i] == 0 for i in tok.all_special_ids)  # [UNK], [CLS], ... carry no meaning
    assert float(static.encode(["\u2603\u2603"]).norm()) == 0.0  # only [UNK]s: a zero row, not the [UNK] row


@pytest.mark.real_model
def test_encode_is_the_weighted_mean_of_every_token(static):
    text = "The tower was completed in 1889 and named after its engineer. " * 60  # ~780 tokens: no truncation
    ids = static.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 512
    w = static.weights[ids]
    manual = torch.nn.functional.normalize((w[:, None] * static.table[ids]).sum(0), dim=0)
    got = static.encode([text, "x", ""])
    assert torch.allclose(got[0], manual, atol=1e-5)
    assert torch.allclose(got.norm(dim=-1), torch.tensor([1.0, 1.0, 0.0]), atol=1e-5)
    short = static.encode([static.tokenizer.decode(ids[:256])])[0]
    assert not torch.allclose(short, got[0], atol=1e-4)  # the tail counted


@pytest.mark.real_model
def test_similarity_ranks_the_relevant_sentence_first(static):
    docs = ["The Eiffel Tower is a wrought-iron lattice tower in Paris.",
            "Photosynthesis converts light energy into chemical energy in plants.",
            "Hamlet is a tragedy written by William Shakespeare around 1600."]
    for q, best in (("who wrote hamlet", 2), ("how do plants make energy from sunlight", 1),
                    ("what is the iron tower in paris called", 0)):
        sims = static.similarity(q, docs)
        assert sims.argmax() == best, (q, sims)


@pytest.mark.real_model
def test_identity_is_of_the_inputs_and_a_stale_table_is_redone(static, tmp_path, monkeypatch):
    base_sha = M.model_fingerprint("minilm-l6")
    assert M.model_fingerprint("minilm-l6-static") == S.static_identity(base_sha)
    assert M.resolve_model("minilm-l6-static") == M.ragpress_home() / "models" / "minilm-l6-static"
    # a folder derived from other inputs is derived again, not trusted
    monkeypatch.setenv("RAGPRESS_HOME", str(tmp_path))
    stale = tmp_path / "models" / "minilm-l6-static"
    stale.mkdir(parents=True)
    (stale / M.SOURCE_FILE).write_text(json.dumps({"sha256": "0" * 64}))
    calls = []
    monkeypatch.setattr(S, "derive_static", lambda name, base, final: calls.append((name, base, final)))
    M.resolve_model("minilm-l6-static")
    assert calls == [("minilm-l6-static", "minilm-l6", stale)] and not stale.exists()
    assert not list(stale.parent.glob(".minilm-l6-static-stale-*"))  # the stale copy is gone, not left aside
    # an up-to-date folder is used as it is
    stale.mkdir()
    (stale / M.SOURCE_FILE).write_text(json.dumps({"sha256": S.static_identity(base_sha)}))
    assert M.resolve_model("minilm-l6-static") == stale and len(calls) == 1


def test_counts_record_their_sources():
    counts, sha = S._counts()
    assert len(sha) == 64 and counts["the"] > counts["paris"] > 0
    assert all(isinstance(v, int) and v > 0 for v in counts.values())
