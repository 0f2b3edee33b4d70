"""Training records built from ``../shared/data``, disjoint from the questions the evals use.

Eval convention (every number in the README): the *first* N questions of ``hotpotqa_train_a.jsonl``,
of ``nq-open-oracle-even.jsonl.gz`` and of the answerable SQuAD v2 questions (the Normans article first).
Training therefore draws from:

* HotpotQA: all of ``hotpotqa_train_b.json`` and ``hotpotqa_train_a.jsonl`` from question 100 on;
* NQ-open: questions from index 400 on, with 9 BM25 distractors each (the eval's ``--distractors``);
* SQuAD v2: answerable questions from index 300 on (articles 3-5; the eval's first 100 are articles 1-2),
  with 9 distractor paragraphs each.
"""

from __future__ import annotations

from pathlib import Path

from compressor.base import Passage

from .datasets import add_distractors, answer_sentence_evidence, corpus_of, load_dataset

__all__ = ["EVAL_HOLDOUT", "sentinel_records"]

EVAL_HOLDOUT = {"hotpotqa_a": 100, "nq": 400, "squad": 300}


def sentinel_records(data_dir: str | Path, n_hotpot: int = 200, n_nq: int = 150, n_squad: int = 150,
                     distractors: int = 9, seed: int = 0) -> tuple[list[tuple[str, str, list[Passage]]], dict]:
    """(source, question, passages-with-evidence) records and a description of where they came from."""
    d = Path(data_dir)
    hb = load_dataset("hotpotqa", d / "hotpotqa_train" / "hotpotqa_train_b.json")
    ha = load_dataset("hotpotqa", d / "hotpotqa_train" / "hotpotqa_train_a.jsonl")[EVAL_HOLDOUT["hotpotqa_a"]:]
    hotpot = (hb + ha)[:n_hotpot]
    nq_all = load_dataset("nq", d / "nq_open" / "nq-open-oracle-even.jsonl.gz")
    nq = add_distractors(nq_all[EVAL_HOLDOUT["nq"]: EVAL_HOLDOUT["nq"] + n_nq], corpus_of(nq_all), distractors, seed)
    sq_all = load_dataset("squad", d / "squad_v2_dev_subset" / "squad_v2_dev_first5articles.json")
    sq = add_distractors(sq_all[EVAL_HOLDOUT["squad"]: EVAL_HOLDOUT["squad"] + n_squad], corpus_of(sq_all),
                         distractors, seed)
    records = [("hotpotqa", e.question, e.passages) for e in hotpot]
    records += [("nq", e.question, answer_sentence_evidence(e).passages) for e in nq]
    records += [("squad", e.question, answer_sentence_evidence(e).passages) for e in sq]
    data = {
        "hotpotqa": f"{len(hotpot)} questions: hotpotqa_train_b.json (all) + hotpotqa_train_a.jsonl[100:] "
                    "(labels: supporting_facts)",
        "nq": f"{len(nq)} questions: nq-open-oracle-even.jsonl.gz[{EVAL_HOLDOUT['nq']}:], {distractors} BM25 "
              "distractors each (label: gold-passage sentence holding an answer string)",
        "squad": f"{len(sq)} answerable questions: squad_v2_dev_first5articles.json answerable[{EVAL_HOLDOUT['squad']}:], "
                 f"{distractors} distractors each (label: sentence holding the answer)",
        "eval_holdout": "first 100 of hotpotqa_train_a.jsonl, first 400 NQ, first 300 answerable SQuAD never trained on",
    }
    return records, data
