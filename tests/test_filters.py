from __future__ import annotations

import numpy as np
import pytest
from conftest import HOTPOT

from adapters.datasets import load_dataset
from adapters.metrics import evidence_recall
from compressor import Budget, Passage, get_compressor
from compressor.errors import BudgetError, InputError
from compressor.filters import select_within_budget
from compressor.filters.base import Sentence
from compressor.text import split_sentences

PASSAGES = [
    {"title": "Paris", "text": "Paris is the capital of France. It has many museums. The Louvre is the largest."},
    {"title": "Berlin", "text": "Berlin is the capital of Germany. It is known for its techno clubs."},
    {"title": "Cats", "text": "Cats sleep a lot."},
]


def test_select_within_budget():
    assert select_within_budget([0.1, 0.9, 0.5], [5, 5, 5], 10) == [1, 2]
    assert select_within_budget([0.1, 0.9, 0.5], [5, 50, 5], 10) == [0, 2]  # skips what cannot fit
    assert select_within_budget([0.1, 0.9, 0.5], [5, 5, 5], None, threshold=0.4) == [1, 2]
    assert select_within_budget([0.5, 0.5], [5, 5], 5) == [0]  # ties keep the earlier sentence
    assert select_within_budget([0.1, 0.2, 0.3], [5, 5, 5], 10, threshold=0.9) == []
    assert select_within_budget([0.1, 0.2, 0.3], [5, 5, 5], 10, threshold=0.9, min_keep=1) == [2]
    assert select_within_budget([0.1, 0.2, 0.3], [5, 5, 50], 10, threshold=0.9, min_keep=1) == [1]  # best that fits


@pytest.mark.parametrize("method", ["bm25", "minilm"])
@pytest.mark.parametrize("budget", [Budget(ratio=2), Budget(ratio=5), Budget(target_tokens=12), Budget(target_tokens=1)])
def test_budget_kept_or_rounded_to_one_sentence_and_order_kept(counter, method, budget):
    """A target is kept, or, when no sentence fits it, rounded up to the best sentence and said so; a strict
    budget is never exceeded (it refuses instead)."""
    comp = get_compressor(method, counter=counter)
    ctx = comp.compress("What is the capital of France?", PASSAGES, budget)
    cap = budget.max_tokens(ctx.tokens_in)
    if ctx.tokens_out > cap:
        assert ctx.stopped_by == "granularity" and sum(len(p.sentence_ids) for p in ctx.passages) == 1
        with pytest.raises(BudgetError, match="strict budget"):
            comp.compress("What is the capital of France?", PASSAGES, budget.model_copy(update={"strict": True}))
    else:
        assert ctx.stopped_by != "granularity"
        strict = comp.compress("What is the capital of France?", PASSAGES, budget.model_copy(update={"strict": True}))
        assert strict.text == ctx.text
    assert [p.index for p in ctx.passages] == sorted(p.index for p in ctx.passages)
    for cp in ctx.passages:
        src = PASSAGES[cp.index]["text"]
        assert cp.sentence_ids == sorted(cp.sentence_ids)
        assert cp.text == " ".join(src[s:e] for s, e in cp.spans)  # spans map back to the input
        assert counter.count(cp.text) == cp.tokens_out


@pytest.mark.parametrize("method", ["bm25", "minilm"])
def test_relevant_sentence_ranked_first(counter, method):
    ctx = get_compressor(method, counter=counter).compress("What is the capital of France?", PASSAGES,
                                                           Budget(target_tokens=9))
    assert "capital of France" in ctx.text


def test_budget_over_input_is_a_no_op(counter):
    ctx = get_compressor("bm25", counter=counter).compress("q?", PASSAGES, Budget(target_tokens=10_000))
    assert ctx.tokens_out == ctx.tokens_in or ctx.tokens_out <= ctx.tokens_in
    assert len(ctx.passages) == 3 and ctx.passages[2].text == "Cats sleep a lot."


def test_one_sentence_and_unpunctuated_passages(counter):
    ctx = get_compressor("bm25", counter=counter).compress("cats?", ["Cats sleep a lot", "x"], Budget(ratio=1.5))
    assert ctx.tokens_out <= Budget(ratio=1.5).max_tokens(ctx.tokens_in)


def test_threshold_selection(counter):
    ctx = get_compressor("minilm", counter=counter).compress("capital of France", PASSAGES, Budget(threshold=0.5))
    assert all(s >= 0.5 for p in ctx.passages for s in p.scores)


def test_bm25_on_real_hotpotqa_keeps_evidence(counter):
    exs = load_dataset("hotpotqa", HOTPOT, limit=10)
    comp = get_compressor("bm25", counter=counter)
    recalls = [evidence_recall(comp.compress(e.question, e.passages, Budget(ratio=3)), e.passages) for e in exs]
    assert sum(recalls) / len(recalls) > 0.5


def test_min_score_stops_before_the_budget(counter):
    """``min_score`` drops weak sentences even with room left, always keeps the best one, and gives way to a
    budget's own threshold and to a budget that holds the whole input."""
    q = "What is the capital of France?"
    full = get_compressor("bm25", counter=counter).compress(q, PASSAGES, Budget(ratio=1.2))
    comp = get_compressor("bm25", counter=counter, min_score=1e9)
    ctx = comp.compress(q, PASSAGES, Budget(ratio=1.2))
    assert len([i for p in ctx.passages for i in p.sentence_ids]) == 1 < len(full.passages[0].sentence_ids) + 1
    assert "capital of France" in ctx.text
    cut = sorted(s for p in full.passages for s in p.scores)[-2]
    ctx = get_compressor("bm25", counter=counter, min_score=cut).compress(q, PASSAGES, Budget(ratio=1.2))
    assert sorted(s for p in ctx.passages for s in p.scores) == sorted(s for p in full.passages for s in p.scores
                                                                      if s >= cut)
    assert comp.compress(q, PASSAGES, Budget(ratio=1.2, threshold=-1e9)).tokens_out == full.tokens_out
    assert comp.compress(q, PASSAGES, Budget(ratio=1)).tokens_out == full.tokens_in


def test_select_within_budget_completes_links():
    """A kept sentence naming another passage brings that passage's best sentence that fits, right after it,
    whatever its score; a passage already represented, or a link from a sentence not kept, brings nothing."""
    owner = [0, 0, 1, 1, 2]
    links = [[1], [], [], [], []]
    scores = [0.9, 0.1, -1.0, -0.5, 0.3]
    assert select_within_budget(scores, [5] * 5, 100, threshold=0.8) == [0]
    assert select_within_budget(scores, [5] * 5, 100, threshold=0.8, owner=owner, links=links) == [0, 3]
    # the linked passage's best sentence does not fit: its next best that does
    assert select_within_budget(scores, [5, 5, 5, 50, 5], 12, threshold=0.8, owner=owner, links=links) == [0, 2]
    # the link is followed before lower-ranked sentences take the budget
    assert select_within_budget(scores, [5] * 5, 10, owner=owner, links=links) == [0, 3]
    # passage 1 already kept (its sentence outranks the linking one): no second sentence of it
    assert select_within_budget([0.5, 0.1, 0.9, -0.5, 0.3], [5] * 5, 100, threshold=0.4, owner=owner,
                                links=links) == [0, 2]
    # a link from a sentence that did not fit is not followed
    assert select_within_budget(scores, [50, 5, 5, 5, 5], 12, owner=owner, links=links) == [1, 4]
    # a link from a sentence below the threshold is not followed
    assert select_within_budget([0.1, 0.1, 0.9, -0.5, 0.3], [5] * 5, 100, threshold=0.4, owner=owner,
                                links=[[], [], [], [], [0]]) == [2]
    with pytest.raises(InputError, match="owner is required"):
        select_within_budget(scores, [5] * 5, 100, links=links)
    with pytest.raises(InputError, match="one of each per sentence"):
        select_within_budget(scores, [5] * 4, 100)


def test_passage_links_names_other_titles_only():
    from compressor.filters.base import passage_links

    passages = [Passage(title="Coco (film)", text="Coco was made by Pixar. It won an award."),
                Passage(title="Pixar", text="Pixar is a studio. It made Coco in 2017."),
                Passage(title="Pixar", text="Pixar is in Emeryville."),
                Passage(title="Up", text="Pixar made Up and drank cocoa.")]
    sents = [Sentence(pi, j, s, e, p.text[s:e], 0) for pi, p in enumerate(passages)
             for j, (s, e) in enumerate(split_sentences(p.text))]
    got = {s.text: links for s, links in zip(sents, passage_links(passages, sents))}
    assert got["Coco was made by Pixar."] == [1, 2]
    assert got["It made Coco in 2017."] == [0]  # the qualifier "(film)" is dropped from "Coco (film)"
    assert got["Pixar is in Emeryville."] == []  # never its own title, nor another passage sharing it
    # whole words only ("cocoa" does not name "Coco"); a title under 3 characters ("Up") names nothing
    assert got["Pixar made Up and drank cocoa."] == [1, 2]
    assert [links for s, links in zip(sents, passage_links(passages, sents)) if s.passage == 1][0] == []
    assert passage_links(passages, []) == []


def test_complete_links_in_a_compressor(counter):
    """With ``complete_links`` a bridge question keeps the second hop, which shares no word with it, and the
    budget still holds."""
    passages = [Passage(title="Sam Cataldo", text="His district comprises the town of New Durham."),
                Passage(title="New Durham", text="It is a rural place. The population was 2,638 at the 2010 census."),
                Passage(title="Cats", text="Cats sleep a lot. Dogs bark.")]
    q = "What is the population of the town represented by Sam Cataldo?"
    plain = get_compressor("bm25", counter=counter, min_score=1e9).compress(q, passages, Budget(ratio=1.05))
    linked = get_compressor("bm25", counter=counter, min_score=1e9, complete_links=True).compress(
        q, passages, Budget(ratio=1.05))
    assert [p.index for p in plain.passages] == [0]
    assert [p.index for p in linked.passages] == [0, 1]
    assert linked.passages[1].text == "The population was 2,638 at the 2010 census."  # its best sentence only
    assert linked.tokens_out <= Budget(ratio=1.05).max_tokens(linked.tokens_in)
    # room for the first hop and the linked passage's shorter sentence, not its best one: the shorter one is kept
    first, short = "His district comprises the town of New Durham.", "It is a rural place."
    best = "The population was 2,638 at the 2010 census."
    room = counter.count(first) + counter.count(short) + 2
    assert room < counter.count(first) + counter.count(best) + 2
    tight = get_compressor("bm25", counter=counter, min_score=1e9, complete_links=True).compress(
        q, passages, Budget(target_tokens=room))
    assert [p.text for p in tight.passages] == [first, short] and tight.tokens_out <= room


def test_repeated_passages_are_merged_and_counted(counter):
    """Exact and whitespace-variant repeats of a passage are kept once (the first copy) and counted; a sentence
    an earlier passage already holds (overlapping chunks) is left out; tokens_in still counts what was sent."""
    a = {"title": "Ana", "text": "Ana lives in Lisbon. She has a cat named Tux."}
    a_ws = {"title": "Ana", "text": "Ana lives in  Lisbon.\nShe has a cat named Tux. "}
    overlap = {"title": "Ana", "text": "She has a cat named Tux. The cat is black."}
    other = {"title": "Rain", "text": "It rained on Monday. The sun came out later."}
    bm25 = get_compressor("bm25", counter=counter)
    ctx = bm25.compress("What is the cat called?", [a, other, a, a_ws, overlap], Budget(ratio=1.0))
    assert (ctx.duplicates, ctx.duplicate_sentences, ctx.stopped_by) == (2, 1, "input")
    assert [p.index for p in ctx.passages] == [0, 1, 4] and ctx.passages[2].text == "The cat is black."
    assert ctx.tokens_in == sum(counter.count(p["text"]) for p in [a, other, a, a_ws, overlap])
    tight = bm25.compress("What is the cat called?", [a, other, a, a_ws, overlap], Budget(ratio=4))
    assert tight.duplicates == 2 and tight.stopped_by == "budget" and tight.tokens_out <= tight.tokens_in / 4
    kept = [p.text for p in tight.passages]
    assert sum(t.count("Tux") for t in kept) <= 1  # never the same sentence twice


def test_early_stop_is_asked_for_and_the_result_says_why(counter):
    """A min_score given to a filter stops early; a Budget's early_stop turns it on or off per call; a method
    without min_score fills the budget either way."""
    q, ps = "Who wrote Hamlet?", PASSAGES
    cut = get_compressor("bm25", counter=counter, min_score=1e9)
    assert cut.compress(q, ps, Budget(ratio=1.2)).stopped_by == "min_score"
    filled = cut.compress(q, ps, Budget(ratio=1.2, early_stop=False))
    assert filled.stopped_by == "budget" and filled.tokens_out > cut.compress(q, ps, Budget(ratio=1.2)).tokens_out
    plain = get_compressor("bm25", counter=counter)
    assert plain.compress(q, ps, Budget(ratio=1.2, early_stop=True)).stopped_by == "budget"
    assert plain.compress(q, ps, Budget(ratio=1.0)).stopped_by == "input"
    assert plain.compress(q, ps, Budget(threshold=1e9)).stopped_by == "threshold"


def test_back_references_bring_the_referent_and_close_followers():
    """select_sentences with follows: a kept pronoun sentence brings the one it refers to; a kept sentence brings
    its back-referring follower only when that scores within ``close``."""
    from compressor.filters import select_sentences

    scores = np.array([0.5, 0.9, 0.1, 0.45])  # 1 refers back to 0; 3 refers back to 2
    costs = [5, 5, 5, 5]
    follows = [-1, 0, -1, 2]
    assert select_sentences(scores, costs, 5)[0] == [1]
    assert select_sentences(scores, costs, 10, follows=follows)[0] == [0, 1]  # "He ..." brings "Marco ..."
    assert select_sentences(scores, costs, 20, follows=follows, close=0.1)[0] == [0, 1, 2, 3]
    s2 = np.array([0.9, 0.05, 0.3, 0.1])  # 0 kept first; its follower 1 scores far below it
    assert select_sentences(s2, costs, 10, follows=[-1, 0, -1, -1], close=0.1)[0] == [0, 2]
    assert select_sentences(s2, costs, 10, follows=[-1, 0, -1, -1], close=0.9)[0] == [0, 1]


def test_refers_back():
    from compressor.text import refers_back

    assert all(refers_back(t) for t in ["He has two dogs.", "It opened in 1932.", "The company grew.", "Their album."])
    assert not any(refers_back(t) for t in ["The Beatles split.", "Hector left.", "There was rain.", "Items sold."])


def test_merged_repeats_keep_their_evidence_and_referents(counter):
    """Evidence in a merged copy counts as kept where its first copy was kept; a pronoun sentence whose referent
    repeats an earlier passage's sentence still brings it."""
    from adapters.metrics import evidence_recall

    t = "Ana lives in Lisbon. She has a cat named Tux."
    ps = [Passage(title="Ana", text=t, evidence=((0, 20),)), Passage(title="Ana", text=t, evidence=((0, 20),))]
    ctx = get_compressor("bm25", counter=counter).compress("Where does Ana live?", ps, Budget(ratio=1))
    assert ctx.duplicates == 1 and evidence_recall(ctx, ps) == 1.0
    a = Passage(title="A", text="Lisbon is the capital of Portugal. The old city sits by a river.")
    b = Passage(title="B", text="Lisbon is the capital of Portugal. It has yellow trams on steep hills.")
    bm25 = get_compressor("bm25", counter=counter, back_references=True)
    ctx = bm25.compress("Which city has yellow trams?", [a, b], Budget(target_tokens=21))
    kept = " ".join(p.text for p in ctx.passages)
    assert ctx.duplicate_sentences == 1 and "yellow trams" in kept and "Lisbon is the capital" in kept, kept
