from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import HOTPOT, make_tiny_llama

from adapters.datasets import load_dataset
from compressor import ArtifactError, BaseModelMismatchError, Budget, ConfigError, Passage, get_compressor
from compressor.errors import InputError
from compressor.sentinel import SHIPPED_ARTIFACT, SentinelCompressor, SentinelConfig, SentinelProbe
from compressor.sentinel.config import DEFAULT_LAYOUT, FORMAT_VERSION, V1_LAYOUT, FeatureLayout
from compressor.sentinel.probe import AttentionReader, select_columns
from compressor.text import split_sentences

PASSAGES = [
    Passage(title="Paris", text="Paris is the capital of France. It has many museums. The Louvre is the largest."),
    Passage(title="Berlin", text="Berlin is the capital of Germany. It is known for techno."),
    Passage(title="Cats", text="Cats sleep a lot"),
]


def _spans(ps):
    return [split_sentences(p.text) for p in ps]


@pytest.fixture(scope="module")
def tiny_reader(tiny_model_dir):
    return AttentionReader.load(str(tiny_model_dir), dtype="float32")


def _eager_rows(model, ids, positions):
    """Reference: full attention maps from the eager implementation, rows at ``positions`` averaged."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        model.set_attn_implementation("ragpress_probe")
    return [a[0, :, positions, :].mean(1) for a in out.attentions]


def _zlog(means):
    logm = np.log(np.stack(means).astype(np.float64) + 1e-6)
    return (logm - logm.mean(0)) / (logm.std(0) + 1e-6)


def test_features_match_eager_attention(tiny_reader):
    q = "What is the capital of France?"
    f = tiny_reader.features(q, PASSAGES, _spans(PASSAGES))
    n_sent = sum(len(s) for s in _spans(PASSAGES))
    LH = 2 * 4
    assert f.x.shape == (n_sent, 4 * LH + 13) == (n_sent, DEFAULT_LAYOUT.width(2, 4))
    text, ranges, (qa, qb), pranges = tiny_reader._prompt(q, PASSAGES, _spans(PASSAGES))
    enc = tiny_reader.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    qpos = [i for i, (s, e) in enumerate(offs) if e > qa and s < qb]
    last = list(range(len(ids) - tiny_reader.m, len(ids)))
    toks = lambda a, b: [i for i, (s, e) in enumerate(offs) if e > a and s < b]  # noqa: E731
    owner = [pi for pi, sp in enumerate(_spans(PASSAGES)) for _ in sp]
    for block, positions in ((0, qpos), (1, last)):
        rows = _eager_rows(tiny_reader.model, ids, positions)
        mean = lambda t, rows=rows: torch.stack([r[:, t].mean(1) for r in rows]).reshape(-1).numpy()  # noqa: E731
        z = _zlog([mean(toks(a, b)) for a, b in ranges])
        np.testing.assert_allclose(f.x[:, block * LH:(block + 1) * LH], z, rtol=1e-3, atol=1e-3)
        # passage blocks: the passage's title line and sentences, z-scored over passages, one row per sentence
        zp = _zlog([mean(toks(a, b)) for a, b in pranges])
        np.testing.assert_allclose(f.x[:, (2 + block) * LH:(3 + block) * LH], zp[owner], rtol=1e-3, atol=1e-3)
    assert tiny_reader._prompt(q, PASSAGES, _spans(PASSAGES))[3][0][0] == text.index("Paris: ")


def test_structure_and_lexical_scalars(tiny_reader):
    f = tiny_reader.features("What is the capital of France?", PASSAGES, _spans(PASSAGES))
    ex = dict(zip(DEFAULT_LAYOUT.extra, f.x[:, -len(DEFAULT_LAYOUT.extra):].T))
    # sentences: Paris x3, Berlin x2, Cats x1
    assert ex["first_in_passage"].tolist() == [1, 0, 0, 1, 0, 1]
    np.testing.assert_allclose(ex["log1p_index_in_passage"], np.log1p([0, 1, 2, 0, 1, 0]), rtol=1e-6)
    # content words of the question: {capital, france}
    np.testing.assert_allclose(ex["question_overlap"], [1.0, 0, 0, 0.5, 0, 0])
    np.testing.assert_allclose(ex["title_overlap"], [0, 0, 0, 0, 0, 0])
    assert ex["bm25_z"].argmax() == 0 and abs(ex["bm25_z"].mean()) < 1e-5
    # embedder similarity: MiniLM cosine of the title-prefixed sentence to the question, raw and z-scored
    from compressor.embed import get_embedder

    sents = [f"{p.title}: {p.text[a:b]}" for p in PASSAGES for a, b in split_sentences(p.text)]
    v = get_embedder("minilm-l6").encode(["What is the capital of France?"] + sents)
    np.testing.assert_allclose(ex["embed_cos"], (v[1:] @ v[0]).numpy(), rtol=1e-4, atol=1e-5)
    assert ex["embed_cos"].argmax() == 0 and abs(ex["embed_z"].mean()) < 1e-5
    np.testing.assert_allclose(ex["embed_z"], (ex["embed_cos"] - ex["embed_cos"].mean()) / (ex["embed_cos"].std()
                                                                                            + 1e-6), rtol=1e-4)
    # a layout reads only its named columns, in its order
    lay = FeatureLayout(("final:zlogmean",), ("bm25_z", "first_in_passage"))
    g = tiny_reader.features("What is the capital of France?", PASSAGES, _spans(PASSAGES), layout=lay)
    np.testing.assert_allclose(g.x, f.x[:, select_columns(DEFAULT_LAYOUT, 2, lay, 2, 4)], rtol=1e-6)
    assert g.x.shape[1] == lay.width(2, 4) == 8 + 2


def test_index_fills_the_embedding_cache_ahead_of_questions(counter, tiny_reader, tmp_path):
    """Index time: each passage's sentence embeddings go to cache_dir, keyed as compress reads them, so a
    question embeds only itself; the kept text is the uncached compressor's; indexing again computes only new
    passages; a compressor without cache_dir, or a method without a cache, refuses to index."""
    q, budget = "What is the capital of France?", Budget(ratio=2)
    plain = _trained(counter, tiny_reader).compress(q, PASSAGES, budget)
    comp = _trained(counter, tiny_reader, cache_dir=str(tmp_path / "emb"))
    try:
        rep = comp.index(PASSAGES)
        assert (rep.method, rep.passages, rep.computed, rep.cached, rep.skipped) == ("sentinel", 3, 3, 0, 0)
        cache = tiny_reader.embed_cache
        hits, misses = cache.hits, cache.misses
        got = comp.compress(q, PASSAGES, budget)
        assert (cache.hits - hits, cache.misses - misses) == (3, 0)  # every passage read, none embedded
        rep = comp.index([*PASSAGES, PASSAGES[0], Passage(title="New", text="A passage the corpus gained later.")])
        assert (rep.passages, rep.computed, rep.cached, rep.duplicates, rep.skipped) == (5, 1, 3, 1, 0)
    finally:
        tiny_reader.embed_cache_dir = None
    assert [(p.index, p.text) for p in got.passages] == [(p.index, p.text) for p in plain.passages]
    with pytest.raises(ConfigError, match="sentinel has no cache_dir: set cache_dir"):
        _trained(counter, tiny_reader).index(PASSAGES)
    with pytest.raises(ConfigError, match="'bm25' keeps no per-passage cache"):
        get_compressor("bm25", counter=counter).index(PASSAGES)
    with pytest.raises(ConfigError, match="use no sentence embeddings"):
        _trained(counter, tiny_reader, layout=V1_LAYOUT, cache_dir=str(tmp_path / "v1")).index(PASSAGES)
    tiny_reader.embed_cache_dir = None


def test_cli_index_then_compress_reads_the_cache(counter, tiny_reader, tiny_model_dir, tmp_path, capsys):
    """`ragpress index` fills a method's cache from a JSONL of passages; a second run finds them all cached; a
    method without a cache and a malformed line are refused with the fix."""
    from serving.cli import main

    art = _trained(counter, tiny_reader).save_pretrained(tmp_path / "art", training={"data": "unit test"})
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(p) for p in [{"title": p.title, "text": p.text} for p in PASSAGES]
                                 + ["An untitled passage. With two sentences."]) + "\n\n")
    args = ["index", "--method", "sentinel", "--artifact", str(art), "--passages", str(corpus), "--cache-dir",
            str(tmp_path / "emb"), "--decoder", str(tiny_model_dir), "--option", f"proxy={tiny_model_dir}"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (first["passages"], first["computed"], first["cached"]) == (4, 4, 0)
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (again["computed"], again["cached"]) == (0, 4)
    assert main(["index", "--method", "bm25", "--passages", str(corpus), "--cache-dir", str(tmp_path / "x")]) == 2
    assert "bm25 keeps no per-passage cache" in capsys.readouterr().err
    corpus.write_text('"fine"\n{"title": "broken"\n')
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(f"ragpress: error: {corpus}:2: not JSON")


def test_passage_link_scalars(tiny_reader):
    """A passage named by a question-relevant passage (the second hop of a bridge question) gets ``link_in``; the
    sentence naming it gets ``link_out``; titles match as whole words, without a trailing qualifier."""
    ps = [Passage(title="Ed Wood (film)", text="Ed Wood is a 1994 film by Tim Burton. It stars Johnny Depp."),
          Passage(title="Johnny Depp", text="John Depp is an American actor. He was born in Kentucky."),
          Passage(title="Tim", text="Timothy is a name."),
          Passage(title="", text="Nothing here names Johnny Depp.")]
    q = "Where was the star of the 1994 film Ed Wood born?"
    f = tiny_reader.features(q, ps, _spans(ps))
    ex = dict(zip(DEFAULT_LAYOUT.extra, f.x[:, -len(DEFAULT_LAYOUT.extra):].T))
    bm = ex["bm25_z"]  # sentences: Ed Wood x2, Johnny Depp x2, Tim x1, untitled x1
    best = [bm[0:2].max()] * 2 + [bm[2:4].max()] * 2 + [bm[4]] + [bm[5]]
    np.testing.assert_allclose(ex["passage_bm25"], best, rtol=1e-5)
    # Johnny Depp is named by Ed Wood and by the untitled passage; "Tim" (in "Tim Burton") by Ed Wood only
    np.testing.assert_allclose(ex["link_in"], [-3, -3, max(best[0], best[5]), max(best[0], best[5]), best[0], -3],
                               rtol=1e-5)
    np.testing.assert_allclose(ex["link_out"], [best[4], best[2], -3, -3, -3, best[2]], rtol=1e-5)
    np.testing.assert_allclose(ex["log1p_mentions"], np.log1p([0, 0, 2, 2, 1, 0]), rtol=1e-6)


def test_sentence_embedding_cache(tiny_reader, tmp_path):
    """With a cache folder the embed_* features are unchanged; a passage's sentences are embedded once."""
    q = "What is the capital of France?"
    plain = tiny_reader.features(q, PASSAGES, _spans(PASSAGES)).x
    tiny_reader.embed_cache_dir = str(tmp_path)
    try:
        first = tiny_reader.features(q, PASSAGES, _spans(PASSAGES)).x
        cache = tiny_reader.embed_cache
        assert (cache.hits, cache.misses) == (0, 3) and len(list(tmp_path.rglob("*.safetensors"))) == 3
        again = tiny_reader.features("Which city has the Louvre?", PASSAGES, _spans(PASSAGES)).x
        assert (cache.hits, cache.misses) == (3, 3)
    finally:
        tiny_reader.embed_cache_dir, tiny_reader._embed_cache = None, None
    np.testing.assert_allclose(first, plain, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(again, tiny_reader.features("Which city has the Louvre?", PASSAGES,
                                                          _spans(PASSAGES)).x, rtol=1e-4, atol=1e-4)


def test_static_embedder_reader_keeps_no_cache(counter, tiny_reader, tiny_model_dir, tmp_path):
    """With the static embedder (minilm-l6-static) the embed_* features are its cosines; a cache folder is not
    used (its vectors are a lookup), index stores nothing, and the features are the same with the folder set."""
    from compressor.embed import get_embedder

    reader = AttentionReader.load(str(tiny_model_dir), dtype="float32", embedder="minilm-l6-static")
    q = "What is the capital of France?"
    plain = reader.features(q, PASSAGES, _spans(PASSAGES))
    docs = reader.embed_docs(PASSAGES, _spans(PASSAGES))[0]
    col = len(DEFAULT_LAYOUT.pooling) * reader.n_layers * reader.n_heads + DEFAULT_LAYOUT.extra.index("embed_cos")
    np.testing.assert_allclose(plain.x[:, col], get_embedder("minilm-l6-static").similarity(q, docs), atol=1e-6)
    assert reader.embeds_by_lookup and not tiny_reader.embeds_by_lookup
    comp = _trained(counter, reader, cache_dir=str(tmp_path / "emb"), embedder="minilm-l6-static")
    assert reader.embed_cache is None
    rep = comp.index(PASSAGES)
    assert (rep.computed, rep.cached) == (0, 0) and not list(tmp_path.rglob("*.safetensors"))
    np.testing.assert_array_equal(reader.features(q, PASSAGES, _spans(PASSAGES)).x, plain.x)


TOWNS = [Passage(title=f"Town {i}", text=" ".join(f"Town {i} fact {j}: it has {i * j} bridges and a {w} market."
                                                  for j, w in enumerate(["fish", "book", "flower", "cheese"])))
        for i in range(6)]  # 24 sentences


def test_embed_share_embeds_the_screened_share_and_maps_the_rest(counter, tiny_reader, monkeypatch):
    """embed_share < 1 without a cache: the probe ranks every sentence on the screen embedder's cosines, MiniLM
    embeds the question and the best ceil(share * n) sentences (8 at least), the others' cosines come from a
    least-squares line on the screened ones, embed_z is recomputed over all; share 1 embeds every sentence."""
    from compressor.embed import get_embedder

    q = "Which town has a cheese market with many bridges?"
    minilm = get_embedder("minilm-l6", "float32")
    calls = []
    real = type(minilm).encode
    monkeypatch.setattr(type(minilm), "encode", lambda self, texts, *a, **k: calls.append(list(texts)) or
                        real(self, texts, *a, **k))
    full = _trained(counter, tiny_reader)
    sents = full.sentences(TOWNS)
    exact = full.score_sentences(q, TOWNS, sents)
    assert len(calls[-1]) == 1 + 24
    part = _trained(counter, tiny_reader, embed_share=0.4)
    got = part.score_sentences(q, TOWNS, sents)
    assert len(calls[-1]) == 1 + 10 and calls[-1][0] == q  # ceil(0.4 * 24)
    # rebuild the features the screened path scores, from its pieces
    spans, layout = _spans(TOWNS), DEFAULT_LAYOUT
    docs = tiny_reader.embed_docs(TOWNS, spans)[0]
    screen = get_embedder("minilm-l6-static").similarity(q, docs)
    x = tiny_reader.features_batch([(q, TOWNS, spans)], cos=[screen])[0].x.astype(np.float64)
    pick = np.sort(np.argsort(-part.probe(x), kind="stable")[:10])
    assert calls[-1][1:] == [docs[i] for i in pick]
    v = minilm.encode([q, *docs])
    true = (v[1:] @ v[0]).numpy().astype(np.float64)
    slope, icept = np.polyfit(screen[pick], true[pick], 1)
    cos = np.clip(slope * screen + icept, -1.0, true[pick].max()) if slope > 0 else np.full(24, true[pick].mean())
    cos[pick] = true[pick]
    width = len(layout.pooling) * 2 * 4  # attention blocks of 2 layers x 4 heads, then the scalars
    ci, zi = width + layout.extra.index("embed_cos"), width + layout.extra.index("embed_z")
    assert (ci, zi) == (layout.column("embed_cos", 2, 4), layout.column("embed_z", 2, 4))
    x[:, ci], x[:, zi] = cos, (cos - cos.mean()) / (cos.std() + 1e-6)
    np.testing.assert_allclose(got, part.probe(x), atol=1e-4)
    assert not np.allclose(got, exact)  # the mapped cosines differ from the exact ones
    part.score_sentences(q, TOWNS[:1], part.sentences(TOWNS[:1]))
    assert len(calls[-1]) == 1 + 4  # 8 sentences or fewer: all embedded
    small = _trained(counter, tiny_reader, embed_share=0.1)
    small.score_sentences(q, TOWNS, sents)
    assert len(calls[-1]) == 1 + 8  # ceil(0.1 * 24) = 3, raised to 8


def test_embed_share_reads_the_cache_exactly(counter, tiny_reader, tmp_path):
    """With an embedding cache every sentence's vector is a read: embed_share does not apply."""
    q = "Which town has a cheese market?"
    exact = _trained(counter, tiny_reader).score_sentences(q, TOWNS, _trained(counter, tiny_reader).sentences(TOWNS))
    comp = _trained(counter, tiny_reader, embed_share=0.25, cache_dir=str(tmp_path))
    try:
        np.testing.assert_allclose(comp.score_sentences(q, TOWNS, comp.sentences(TOWNS)), exact, atol=1e-4)
    finally:
        tiny_reader.embed_cache_dir = None


def test_layout_names_are_validated():
    with pytest.raises(ConfigError, match="unknown or repeated names.*choose from"):
        FeatureLayout(("question:zlogmean", "typo"), ())
    with pytest.raises(ConfigError, match="repeated"):
        FeatureLayout((), ("bm25_z", "bm25_z"))


def test_early_exit_runs_fewer_layers(tiny_reader):
    calls = []
    hooks = [layer.register_forward_hook(lambda *a: calls.append(1)) for layer in tiny_reader.model.model.layers]
    try:
        f1 = tiny_reader.features("q?", PASSAGES, _spans(PASSAGES), layers=1)
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == 0  # layer 0 raised inside attention: its decoder layer never finished
    full = tiny_reader.features("q?", PASSAGES, _spans(PASSAGES))
    np.testing.assert_allclose(full.x[:, select_columns(DEFAULT_LAYOUT, 2, DEFAULT_LAYOUT, 1, 4)], f1.x, rtol=1e-5,
                               atol=1e-7)


def test_capture_is_linear_in_length(tiny_reader):
    """Rows are [heads, L] per layer; a [heads, L, L] map is never kept."""
    from compressor.sentinel import probe as P

    seen = []
    orig = P._Capture.__init__

    def spy(self, *a, **k):
        orig(self, *a, **k)
        seen.append(self)

    P._Capture.__init__ = spy
    try:
        f = tiny_reader.features("q?", PASSAGES, _spans(PASSAGES))
    finally:
        P._Capture.__init__ = orig
    assert all(tuple(r.shape) == (4, f.prompt_tokens)  # per layer, per batch element, per group
               for per_item in seen[0].rows.values() for rows in per_item for r in rows)


LONG = [Passage(title=f"Town {k}", text=" ".join(f"Town {k} fact {j} is about the river and the old mill."
                                                  for j in range(4))) for k in range(6)]
LONG.insert(3, Passage(title="Big", text=" ".join(f"Big sentence {j} tells of the harbour." for j in range(30))))


def _assert_windows_cover_and_fit(reader, q, passages, spans, wins, limit):
    """Every sentence is read once, in order, and every window's prompt is within ``limit`` tokens."""
    flat = [(i, j) for w in wins for i, a, b in w for j in range(a, b)]
    assert flat == [(i, j) for i, sp in enumerate(spans) for j in range(len(sp))]
    for w in wins:
        ps, sp = AttentionReader._window(passages, spans, w)
        assert reader._n_tokens(reader._prompt(q, ps, sp)[0]) <= limit


def test_long_context_is_read_in_windows(tiny_reader, monkeypatch):
    """Over max_context_tokens the proxy reads consecutive windows of whole passages (a passage too long to fit
    alone, in runs of its sentences), each prompt within the limit; every sentence gets one row, in order, and
    the scalars are the whole context's."""
    q = "Which town has the old mill?"
    spans = _spans(LONG)
    whole = tiny_reader.features(q, LONG, spans)
    assert tiny_reader.windows(q, LONG, spans) == [[(i, 0, len(sp)) for i, sp in enumerate(spans)]]
    limit = 200
    assert whole.prompt_tokens > 3 * limit
    monkeypatch.setattr(tiny_reader, "max_context_tokens", limit)
    wins = tiny_reader.windows(q, LONG, spans)
    assert len(wins) > 3
    _assert_windows_cover_and_fit(tiny_reader, q, LONG, spans, wins, limit)
    pieces = [piece for w in wins for piece in w]
    assert len([p for p in pieces if p[0] == 3]) > 1  # the long passage is split into sentence runs
    assert all(b - a == len(spans[i]) for i, a, b in pieces if i != 3)  # the others stay whole
    assert any(len(w) > 1 for w in wins)  # and are packed several to a window
    with pytest.warns(RuntimeWarning, match="holds only one passage"):  # the long passage's runs, read alone
        got = tiny_reader.features(q, LONG, spans)
    assert got.x.shape == whole.x.shape and np.isfinite(got.x).all()
    assert got.prompt_tokens > whole.prompt_tokens  # the question is read once per window
    width = len(DEFAULT_LAYOUT.extra)
    np.testing.assert_allclose(got.x[:, -width:], whole.x[:, -width:], rtol=1e-5, atol=1e-5)
    # the attention of a window is z-scored within it: every window's rows are those of a one-pass read of its
    # own pieces (whole passages, or a run of the long passage's sentences under its title)
    att = len(DEFAULT_LAYOUT.pooling) * 2 * 4
    row = 0
    for w in wins:
        ps, sp = tiny_reader._window(LONG, spans, w)
        alone = tiny_reader.features(q, ps, sp)
        assert len(alone.x) == sum(b - a for _, a, b in w)
        # the windows go through one right-padded pass: float32 rounding of the padded kernels moves a z-scored
        # log-attention feature by up to ~2e-4 (measured), not more
        np.testing.assert_allclose(got.x[row: row + len(alone.x), :att], alone.x[:, :att], rtol=1e-3, atol=1e-3)
        row += len(alone.x)
    assert row == len(got.x)


def test_windows_packed_too_full_are_split_by_the_exact_count(tiny_reader, monkeypatch):
    """The packing estimates; when it over-packs (here: a negative join margin), the exact count splits windows
    of several passages and runs of one passage's sentences until each fits."""
    q = "Which town has the old mill?"
    spans = _spans(LONG)
    limit = 200
    monkeypatch.setattr(tiny_reader, "max_context_tokens", limit)
    planned = tiny_reader.windows(q, LONG, spans)
    tried = []
    orig = tiny_reader._window
    monkeypatch.setattr(tiny_reader, "_window", lambda ps, sp, w: (tried.append(list(w)), orig(ps, sp, w))[1])
    monkeypatch.setattr(tiny_reader, "join_margin", -60)
    wins = tiny_reader.windows(q, LONG, spans)
    _assert_windows_cover_and_fit(tiny_reader, q, LONG, spans, wins, limit)
    rejected = [w for w in tried if w not in wins]
    assert any(len(w) > 1 for w in rejected)  # a window of several pieces was halved
    assert any(len(w) == 1 and w[0][0] == 3 for w in rejected)  # a run of the long passage was halved
    assert wins != planned


def test_sentence_too_long_for_a_window_is_refused(tiny_reader, monkeypatch):
    """Only a sentence that cannot fit with the question is refused, named by passage and index; a context of
    short sentences at the same limit is read in windows."""
    monkeypatch.setattr(tiny_reader, "max_context_tokens", 80)
    short = [Passage(title="Small", text="A short one. Another short one."), Passage(title="Also", text="Fine.")]
    short = short + [Passage(title=f"P{k}", text="Word word word. " * 3) for k in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert tiny_reader.features("q?", short, _spans(short)).x.shape[0] == sum(len(sp) for sp in _spans(short))
    ps = [Passage(title="Ok", text="Short."), Passage(title="Huge", text="Fine here. " + "word " * 80 + "end.")]
    with pytest.raises(InputError, match="sentence 1 of passage 1 \\('Huge'\\).*max_context_tokens=80"):
        tiny_reader.features("q?", ps, _spans(ps))


def test_question_leaving_no_room_is_refused_as_such(tiny_reader, monkeypatch):
    monkeypatch.setattr(tiny_reader, "max_context_tokens", 40)
    ps = [Passage(title="Tiny", text="end.")]
    with pytest.raises(InputError, match="the question .* leaving no room .*max_context_tokens=40"):
        tiny_reader.features("q?", ps, _spans(ps))


def test_a_window_of_one_sentence_warns(tiny_reader, monkeypatch):
    ps = [Passage(title=f"P{k}", text=f"Fact {k} is long enough to need a window of its own here.") for k in range(3)]
    q = "q?"
    one = tiny_reader._n_tokens(tiny_reader._prompt(q, ps[:1], _spans(ps[:1]))[0])
    monkeypatch.setattr(tiny_reader, "max_context_tokens", one + 2)
    assert len(tiny_reader.windows(q, ps, _spans(ps))) == 3
    with pytest.warns(RuntimeWarning, match="holds only one sentence"):
        f = tiny_reader.features(q, ps, _spans(ps))
    att = len(DEFAULT_LAYOUT.pooling) * 2 * 4
    assert np.all(f.x[:, :att] == 0)  # no contrast within a one-sentence window


def test_compressor_refuses_a_reader_built_for_another_limit(tiny_reader, monkeypatch, counter):
    monkeypatch.setattr(tiny_reader, "max_context_tokens", 1000)
    with pytest.raises(ConfigError, match="max_context_tokens=1000 but the config names max_context_tokens=8192"):
        _trained(counter, tiny_reader)


def test_works_on_gemma3_architecture(smol_tokenizer, tmp_path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=8, sliding_window=8,
                           max_position_embeddings=4096)
    Gemma3ForCausalLM(cfg).save_pretrained(tmp_path)
    smol_tokenizer.save_pretrained(tmp_path)
    reader = AttentionReader.load(str(tmp_path), dtype="float32")
    f = reader.features("What is the capital of France?", PASSAGES, _spans(PASSAGES))
    assert f.x.shape[1] == 4 * 3 * 4 + 13 == DEFAULT_LAYOUT.width(3, 4) and np.isfinite(f.x).all()
    # sliding-window layers are masked like the model masks them: features match eager attention
    text, ranges, (qa, qb), _ = reader._prompt("What is the capital of France?", PASSAGES, _spans(PASSAGES))
    enc = reader.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    last = list(range(len(enc["input_ids"]) - reader.m, len(enc["input_ids"])))
    rows = _eager_rows(reader.model, enc["input_ids"], last)
    means = []
    for a, b in ranges:
        toks = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > a and s < b]
        means.append(torch.stack([r[:, toks].mean(1) for r in rows]).reshape(-1).numpy())
    logm = np.log(np.stack(means).astype(np.float64) + 1e-6)
    np.testing.assert_allclose(f.x[:, 12:24], (logm - logm.mean(0)) / (logm.std(0) + 1e-6), rtol=1e-3, atol=1e-3)


def _trained(counter, tiny_reader, layout=DEFAULT_LAYOUT, **options):
    rng = np.random.default_rng(0)
    width = layout.width(2, 4)
    probe = SentinelProbe(rng.normal(size=width), np.abs(rng.normal(size=width)) + 0.1, rng.normal(size=width), 0.1)
    return SentinelCompressor(counter, SentinelConfig(proxy=str(tiny_reader.model.name_or_path), dtype="float32",
                                                      **options), probe, tiny_reader, layout=layout)


@pytest.mark.parametrize("options", [{}, {"complete_links": True, "min_score": 0.0}])
@pytest.mark.parametrize("budget", [Budget(ratio=2), Budget(ratio=5), Budget(target_tokens=10)])
def test_budget_order_and_spans(counter, tiny_reader, budget, options):
    comp = _trained(counter, tiny_reader, **options)
    ctx = comp.compress("What is the capital of France?", PASSAGES, budget)
    assert ctx.tokens_out <= budget.max_tokens(ctx.tokens_in)
    assert [p.index for p in ctx.passages] == sorted(p.index for p in ctx.passages)
    for cp in ctx.passages:
        assert cp.text == " ".join(PASSAGES[cp.index].text[s:e] for s, e in cp.spans)
        assert len(cp.scores) == len(cp.sentence_ids)


def test_complete_links_keeps_the_named_passages(counter, tiny_reader):
    """With ``complete_links`` and a cut that keeps only the best sentence, the passages that sentence names come
    with it (every sentence here names another passage)."""
    from compressor.filters import passage_links

    passages = [Passage(title="Sam Cataldo", text="He lives near Rinconada. His district holds New Durham."),
                Passage(title="New Durham", text="It is a town near Rinconada. Sam Cataldo represents it."),
                Passage(title="Rinconada", text="It is near New Durham, population 2,489. Sam Cataldo visited it.")]
    comp = _trained(counter, tiny_reader, complete_links=True, min_score=1e9)
    q = "What is the population of the town Sam Cataldo represents?"
    sents = comp.sentences(passages)
    best = int(np.argmax(comp.score_sentences(q, passages, sents)))
    ctx = comp.compress(q, passages, Budget(ratio=1.01))
    named = passage_links(passages, sents)[best]
    assert named and {p.index for p in ctx.passages} == {sents[best].passage, *named}
    assert ctx.tokens_out <= Budget(ratio=1.01).max_tokens(ctx.tokens_in)


def test_artifact_round_trip_and_mismatch(counter, tiny_reader, tmp_path, smol_tokenizer):
    comp = _trained(counter, tiny_reader)
    path = comp.save_pretrained(tmp_path / "art", training={"data": "unit test"}, scores={"val_auc": 0.5})
    cfg = json.loads((path / "compressor_config.json").read_text())
    assert cfg["type"] == "sentinel" and len(cfg["proxy"]["sha256"]) == 64 and cfg["scores"]["val_auc"] == 0.5
    again = SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader)
    a = comp.compress("capital of France?", PASSAGES, Budget(ratio=2))
    b = again.compress("capital of France?", PASSAGES, Budget(ratio=2))
    assert a.text == b.text
    flat = lambda c: [s for p in c.passages for s in p.scores]  # noqa: E731
    assert flat(a) == pytest.approx(flat(b), rel=1e-5)
    assert again.layout == DEFAULT_LAYOUT and cfg["features"]["n_features"] == DEFAULT_LAYOUT.width(2, 4)
    with pytest.raises(ConfigError, match="fixed by the trained probe"):
        SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader, layers=1)
    # the embedder of the embed_* features is recorded by hash and checked like the proxy
    assert cfg["embedder"]["id"] == "minilm-l6" and len(cfg["embedder"]["sha256"]) == 64
    (path / "compressor_config.json").write_text(json.dumps({**cfg, "embedder": {"id": "minilm-l6", "sha256": "0" * 64}}))
    with pytest.raises(BaseModelMismatchError, match="trained with embedder 'minilm-l6'"):
        SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader)
    (path / "compressor_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="embeds with 'minilm-l6' but the config names embedder='other'"):
        SentinelCompressor(counter, comp.config.model_copy(update={"embedder": "other"}), comp.probe, tiny_reader)
    other = tmp_path / "other-proxy"
    make_tiny_llama(len(smol_tokenizer), seed=1).save_pretrained(other)
    with pytest.raises(BaseModelMismatchError, match="trained with proxy"):
        SentinelCompressor.from_pretrained(path, counter, proxy=str(other))


def test_format1_artifact_reads_with_its_layout(counter, tiny_reader, tmp_path):
    """A probe saved before layouts were named (format 1, sentence attention only) still loads and scores."""
    comp = _trained(counter, tiny_reader, layout=V1_LAYOUT)
    path = comp.save_pretrained(tmp_path / "v1", training={}, scores={})
    cfg = json.loads((path / "compressor_config.json").read_text())
    assert cfg["features"]["pooling"] == ["question:zlogmean", "final:zlogmean"]
    (path / "compressor_config.json").write_text(json.dumps({**cfg, "format_version": 1}))
    again = SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader)
    assert again.layout == V1_LAYOUT
    assert again.compress("capital?", PASSAGES, Budget(ratio=2)).text == comp.compress("capital?", PASSAGES,
                                                                                         Budget(ratio=2)).text
    with pytest.raises(ConfigError, match="the probe has 18 weights but the feature layout"):
        SentinelCompressor(counter, comp.config, comp.probe, tiny_reader, layout=DEFAULT_LAYOUT)


def test_corrupt_and_future_artifacts_refused(counter, tiny_reader, tmp_path):
    path = _trained(counter, tiny_reader).save_pretrained(tmp_path / "art", training={}, scores={})
    cfg = json.loads((path / "compressor_config.json").read_text())
    (path / "compressor_config.json").write_text(json.dumps({**cfg, "format_version": 99}))
    with pytest.raises(ArtifactError, match="newer than this ragpress"):
        SentinelCompressor.from_pretrained(path, counter, proxy=cfg["proxy"]["id"], attention=tiny_reader)
    (path / "compressor_config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="corrupt"):
        SentinelCompressor.from_pretrained(path, counter, proxy=cfg["proxy"]["id"], attention=tiny_reader)
    (path / "evil.pkl").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="pickle"):
        SentinelCompressor.from_pretrained(path, counter, proxy=cfg["proxy"]["id"], attention=tiny_reader)


BRIDGE = [
    Passage(title="Sam Cataldo", text="Sam Cataldo is a state senator. His district holds the town of New Durham."),
    Passage(title="New Durham, New Hampshire", text="New Durham is a town. The population was 2,638 at the census."),
    Passage(title="Rinconada (department)", text="Its population in 2010 was 2,489."),
]


def _bridge_texts():
    owner, sents = [], []
    for pi, p in enumerate(BRIDGE):
        for s, e in split_sentences(p.text):
            owner.append(pi)
            sents.append(p.text[s:e])
    return owner, sents


def test_rerank_features_follow_the_bridge():
    """The second stage sees that a sentence the first stage trusts names another passage's title: every
    sentence of that passage gets hop_in / hop_top; a passage nobody names gets neither."""
    from compressor.sentinel.rerank import NO_HOP, RERANK_FEATURES, rerank_features

    owner, sents = _bridge_texts()
    assert owner == [0, 0, 1, 1, 2]
    scores = np.array([3.0, 2.0, 0.0, -1.0, 0.5])  # the first stage trusts Sam Cataldo's sentences
    x = rerank_features("What is the population of the town Sam Cataldo represents?", BRIDGE, owner, sents, scores)
    col = {n: x[:, i] for i, n in enumerate(RERANK_FEATURES)}
    assert x.shape == (5, len(RERANK_FEATURES))
    z = (scores - scores.mean()) / (scores.std() + 1e-6)
    # only a trailing "(qualifier)" is dropped from a title: "New Durham, New Hampshire" is not named here
    assert col["hop_in"][2] == NO_HOP and col["hop_top"][2] == 0
    renamed = [BRIDGE[0], Passage(title="New Durham (town)", text=BRIDGE[1].text), BRIDGE[2]]
    x = rerank_features("What is the population of the town Sam Cataldo represents?", renamed, owner, sents, scores)
    col = {n: x[:, i] for i, n in enumerate(RERANK_FEATURES)}
    assert col["hop_in"][2] == col["hop_in"][3] == pytest.approx(z[1])  # named by the 2nd sentence
    assert list(col["hop_top"]) == [0, 0, 1, 1, 0] and list(col["hop_top_x_first"]) == [0, 0, 1, 0, 0]
    assert col["hop_in"][0] == col["hop_in"][4] == NO_HOP  # nobody names Sam Cataldo or Rinconada
    assert col["passage_max"][3] == pytest.approx(z[2]) and col["score"][1] == 2.0
    # the expanded query (question + top sentences) reaches "New Durham" sentences the question alone does not
    assert col["hop_bm25"][2] > col["hop_bm25"][4]
    assert rerank_features("q", BRIDGE, [], [], np.zeros(0)).shape == (0, len(RERANK_FEATURES))
    one = rerank_features("population?", BRIDGE[2:], [0], [BRIDGE[2].text], np.array([1.0]))
    assert one.shape == (1, len(RERANK_FEATURES)) and np.isfinite(one).all()
    with pytest.raises(InputError, match="owner has 5 entries, sents 5, scores 4"):
        rerank_features("q", BRIDGE, owner, sents, scores[:4])
    with pytest.raises(InputError, match="hold 1 NaN/inf"):
        rerank_features("q", BRIDGE, owner, sents, np.r_[scores[:4], np.nan])


def test_title_mentions_match_the_title_pattern():
    """The fast substring search agrees with the whole-word, case-insensitive regex on awkward text: word
    boundaries at digits, underscores and accents, a qualifier dropped, text that lower-casing lengthens."""
    from compressor.text import title_mentions, title_pattern

    titles = ["Up (film)", "New Durham", "Ab", None, "Café Müller", "R2-D2", "İstanbul", "x_y", "Istanbul", "Sams",
              "Kin", "μ Arae"]
    texts = ["Up is a film.", "up-to-date", "upper", "The town of NEW DURHAM.", "New Durhams", "cafÉ müller ok",
             "R2-D2s", "istanbul", "x_yz x_y", "", "pup", "Café Müller_", "up\nnew durham", "µ Arae", "ΜΑ"]
    folded = ["ıstanbul", "ſams", "\u212ain", "İSTANBUL"]  # the regex folds these onto ASCII letters, lower() does not
    for group in (texts, texts[:7], texts + folded[:1], texts + folded[1:2], texts + folded[2:3], texts + folded[3:]):
        got = title_mentions(titles, group)
        want = np.array([[title_pattern(ti) is not None and title_pattern(ti).search(t) is not None for ti in titles]
                         for t in group])
        np.testing.assert_array_equal(got, want)
    assert title_mentions(titles, []).shape == (0, len(titles))


def _reranker(seed=0):
    from compressor.sentinel.rerank import RERANK_FEATURES, HopReranker

    rng = np.random.default_rng(seed)
    n = len(RERANK_FEATURES)
    return HopReranker(SentinelProbe(rng.normal(size=n), np.abs(rng.normal(size=n)) + 0.1, rng.normal(size=n), 0.0))


def test_two_stage_artifact_round_trip_and_checks(counter, tiny_reader, tmp_path):
    from compressor.sentinel.rerank import HopReranker

    first = _trained(counter, tiny_reader)
    comp = SentinelCompressor(counter, first.config.model_copy(update={"complete_links": True}), first.probe,
                              tiny_reader, reranker=_reranker())
    q = "What is the population of the town Sam Cataldo represents?"
    sents = comp.sentences(BRIDGE)
    s1, s2 = first.score_sentences(q, BRIDGE, sents), comp.score_sentences(q, BRIDGE, sents)
    assert s1.shape == s2.shape and not np.allclose(s1, s2)
    path = comp.save_pretrained(tmp_path / "two", training={}, scores={})
    cfg = json.loads((path / "compressor_config.json").read_text())
    assert cfg["format_version"] == FORMAT_VERSION and cfg["rerank"]["top_k"] == 2
    again = SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader)
    assert again.reranker is not None and again.config.complete_links
    # a format-5 artifact (no complete_links in its config) loads with the selection it was made for
    (path / "compressor_config.json").write_text(json.dumps(
        {**cfg, "format_version": 5, "config": {k: v for k, v in cfg["config"].items() if k != "complete_links"}}))
    assert not SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy,
                                                  attention=tiny_reader).config.complete_links
    (path / "compressor_config.json").write_text(json.dumps(cfg))
    np.testing.assert_allclose(again.score_sentences(q, BRIDGE, sents), s2, rtol=1e-5)
    budget = Budget(ratio=2)
    assert again.compress(q, BRIDGE, budget).tokens_out <= budget.max_tokens(again.compress(q, BRIDGE, budget).tokens_in)
    # a one-stage artifact loads without a reranker; tensors and manifest must agree
    assert SentinelCompressor.from_pretrained(first.save_pretrained(tmp_path / "one"), counter,
                                              proxy=comp.config.proxy, attention=tiny_reader).reranker is None
    (path / "compressor_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "rerank"}))
    with pytest.raises(ArtifactError, match=r"unexpected tensors \['rerank.coef'"):
        SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader)
    (path / "compressor_config.json").write_text(json.dumps({**cfg, "rerank": {"features": ["score"], "top_k": 2}}))
    with pytest.raises(ArtifactError, match="retrain with `ragpress train sentinel`"):
        SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader)
    for bad in (0, True, "2"):
        (path / "compressor_config.json").write_text(json.dumps({**cfg, "rerank": {**cfg["rerank"], "top_k": bad}}))
        with pytest.raises(ArtifactError, match="integer rerank.top_k >= 1"):
            SentinelCompressor.from_pretrained(path, counter, proxy=comp.config.proxy, attention=tiny_reader)
    with pytest.raises(ConfigError, match="the reranker's classifier has 3 weights"):
        HopReranker(SentinelProbe(np.zeros(3), np.ones(3), np.zeros(3), 0.0))
    with pytest.raises(ConfigError, match="top_k=0"):
        HopReranker(_reranker().classifier, top_k=0)


@pytest.mark.real_model
@pytest.mark.skipif(not (SHIPPED_ARTIFACT / "compressor_config.json").exists(), reason="no shipped probe yet")
def test_shipped_probe_on_real_hotpotqa(counter):
    from adapters.metrics import evidence_recall

    comp = get_compressor("sentinel", counter=counter, min_score=None)  # fill the budget: the ranking alone
    assert comp.manifest["scores"]["val_auc"] > 0.8
    exs = load_dataset("hotpotqa", HOTPOT, limit=10)  # held out from training
    recalls = []
    for e in exs:
        ctx = comp.compress(e.question, e.passages, Budget(ratio=3))
        assert ctx.tokens_out <= Budget(ratio=3).max_tokens(ctx.tokens_in)
        recalls.append(evidence_recall(ctx, e.passages))
    # about 0.9 on the first 100 (bench); a random third of the sentences would keep about 0.39
    assert np.mean(recalls) > 0.6
    # the shipped min_score stops early: fewer tokens, never more
    tight = get_compressor("sentinel", counter=counter)
    assert tight.config.min_score is not None
    e = exs[0]
    assert tight.compress(e.question, e.passages, Budget(ratio=3)).tokens_out <= \
        comp.compress(e.question, e.passages, Budget(ratio=3)).tokens_out
    # a proxy limit below the context's length: read in windows, the ranking nearly unchanged (on the 100 held-out
    # questions, recall@20% 0.883 in one pass, 0.882 in 2.6 windows a question, 0.876 in 4.3)
    windowed = get_compressor("sentinel", counter=counter, min_score=None, max_context_tokens=600)
    win = []
    for e in exs:
        with warnings.catch_warnings():  # a window of one long passage warns that it has no passage contrast
            warnings.simplefilter("ignore", RuntimeWarning)
            ctx = windowed.compress(e.question, e.passages, Budget(ratio=3))
        assert ctx.tokens_out <= Budget(ratio=3).max_tokens(ctx.tokens_in)
        win.append(evidence_recall(ctx, e.passages))
    assert np.mean(win) > np.mean(recalls) - 0.1


def test_train_sentinel_forced_depth_and_feature_cache(counter, tiny_model_dir, tmp_path):
    """`ragpress train sentinel` on a tiny proxy: the forced depth is shipped, the feature cache is written once
    and read back (the same probe), and the embedder layout records its embedder."""
    from compressor.sentinel.config import EMBED_EXTRAS
    from compressor.sentinel.train import load_features, train_sentinel

    facts = ["Paris is the capital of France.", "Berlin is the capital of Germany.", "Rome is the capital of Italy.",
             "Madrid is the capital of Spain."]
    filler = "It rained on Tuesday. The bus was late again. A cat slept on the mat. Tea was served at noon."
    records = []
    for i in range(24):
        fact = facts[i % 4]
        text = f"{filler} {fact}" if i % 2 else f"{fact} {filler}"
        start = text.index(fact)
        gold = Passage(title="Capitals", text=text, evidence=((start, start + len(fact)),))
        records.append(("unit", f"What is the capital named in fact {i % 4}?", [gold, Passage(title="Misc", text=filler)]))
    layouts = {"v1": V1_LAYOUT, "embed": FeatureLayout(V1_LAYOUT.pooling, V1_LAYOUT.extra + EMBED_EXTRAS)}
    cache = tmp_path / "feats.npz"
    logs: list[str] = []
    kw = dict(proxy=str(tiny_model_dir), layer_grid=(1, 2), c_grid=(0.1,), layouts=layouts, features_cache=cache,
              progress=False, layers=1, log=logs.append)
    comp, report = train_sentinel(records, counter, **kw)
    assert comp.config.layers == 1 and report["chosen"]["layers"] == 1 and cache.exists()
    assert {r["layers"] for r in report["grid"]} == {1, 2} and report["n_val_questions"] == 3
    feats = load_features(cache, FeatureLayout(V1_LAYOUT.pooling, V1_LAYOUT.extra + EMBED_EXTRAS))
    assert len(feats) == 24 and all(int(q.y.sum()) == 1 for q in feats)
    again, _ = train_sentinel(records, counter, **kw)
    assert any("features loaded" in m for m in logs)
    np.testing.assert_allclose(again.probe.coef, comp.probe.coef)
    if comp.layout.uses_embedder:
        cfg = json.loads((comp.save_pretrained(tmp_path / "art") / "compressor_config.json").read_text())
        assert cfg["embedder"]["id"] == "minilm-l6"
    with pytest.raises(ValueError, match="layers=5: the proxy has 2 layers"):
        train_sentinel(records, counter, **{**kw, "layers": 5})
    # min_score is stored in the artifact's config and comes back with it
    tuned, _ = train_sentinel(records, counter, **{**kw, "min_score": 0.5})
    path = tuned.save_pretrained(tmp_path / "tuned")
    assert SentinelCompressor.from_pretrained(path, counter, proxy=str(tiny_model_dir)).config.min_score == 0.5
    # the second stage: scored next to the first stage alone (nested CV and validation), kept when asked
    rr = report["rerank"]
    assert {"cv", "cv_first_stage", "val", "val_first_stage", "kept"} <= rr.keys()
    assert 0 <= rr["cv"]["recall@20%"] <= 1 and "recall@20%_unit" in rr["cv"]
    two, _ = train_sentinel(records, counter, **{**kw, "rerank": True})
    one, r1 = train_sentinel(records, counter, **{**kw, "rerank": False})
    assert two.reranker is not None and one.reranker is None and r1["rerank"]["kept"] is False
    again = SentinelCompressor.from_pretrained(two.save_pretrained(tmp_path / "two"), counter, proxy=str(tiny_model_dir))
    np.testing.assert_allclose(again.reranker.classifier.coef, two.reranker.classifier.coef, rtol=1e-6)


@pytest.mark.parametrize("name, layers", [("sentinel", 2), ("sentinel_l4", 4), ("sentinel_l1", 1)])
def test_named_probes_ship_the_depth_their_name_says(name, layers):
    """Each registered probe's shipped artifact reads the proxy depth its name promises. sentinel_l1 was trained
    with the default's command but for the depth, so its settings are the default's; sentinel_l4 predates
    back-references and the early stop (their defaults apply), so only the settings it stores are compared."""
    from compressor.registry import get_spec

    cfg = json.loads((get_spec(name).artifact / "compressor_config.json").read_text())["config"]
    assert cfg["layers"] == layers
    shipped = json.loads((SHIPPED_ARTIFACT / "compressor_config.json").read_text())["config"]
    if name == "sentinel_l1":
        assert {k: v for k, v in cfg.items() if k != "layers"} == {k: v for k, v in shipped.items() if k != "layers"}
    for key in ("min_score", "complete_links", "query_positions", "dtype"):
        assert cfg[key] == shipped[key], key
