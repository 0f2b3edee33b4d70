"""Training records built from ``../shared/data``, disjoint from the questions the evals use.

Eval convention (every number in the README): the *first* N questions of ``hotpotqa_train_a.jsonl``,
of ``nq-open-oracle-even.jsonl.gz`` and of the answerable SQuAD v2 questions (the Normans article first).
Training therefore draws from:

* HotpotQA: all of ``hotpotqa_train_b.json`` and ``hotpotqa_train_a.jsonl`` from question 100 on;
* NQ-open: questions from index 400 on, with 9 BM25 distractors each (the eval's ``--distractors``);
* SQuAD v2: answerable questions from index 300 on (articles 3-5; the eval's first 100 are articles 1-2),
  with 9 distractor paragraphs each.

xRAG (:func:`xrag_records`) also reads plain text: the abstracts, and HotpotQA / NQ / SQuAD paragraphs of
training questions only; a paragraph whose text also belongs to a held-out eval question is left out.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from compressor.base import Passage
from compressor.errors import InputError

from .datasets import QAExample, add_distractors, answer_sentence_evidence, corpus_of, load_dataset

__all__ = ["EVAL_HOLDOUT", "distill_records", "distill_val_records", "sentinel_examples", "sentinel_records",
           "squad_train", "xrag_records"]

EVAL_HOLDOUT = {"hotpotqa_a": 100, "nq": 400, "squad": 300}
_VAL_FROM = 300  # NQ questions 300..399: the soft families' validation questions (benchmarks read 0..299 at most)


def sentinel_examples(data_dir: str | Path, n_hotpot: int = 200, n_nq: int = 150, n_squad: int = 150,
                      distractors: int = 9, seed: int = 0) -> list[tuple[str, QAExample]]:
    """(source, example) pairs in the order of :func:`sentinel_records`, answers included: for choosing
    options that need a decoder (``research/choose_min_score.py``) on the probe's validation questions."""
    return _sentinel_sources(data_dir, n_hotpot, n_nq, n_squad, distractors, seed)[0]


def _sentinel_sources(data_dir, n_hotpot, n_nq, n_squad, distractors, seed):
    d = Path(data_dir)
    hb = load_dataset("hotpotqa", d / "hotpotqa_train" / "hotpotqa_train_b.json")
    ha = load_dataset("hotpotqa", d / "hotpotqa_train" / "hotpotqa_train_a.jsonl")[EVAL_HOLDOUT["hotpotqa_a"]:]
    hotpot = (hb + ha)[:n_hotpot]
    nq_all = load_dataset("nq", d / "nq_open" / "nq-open-oracle-even.jsonl.gz")
    nq = add_distractors(nq_all[EVAL_HOLDOUT["nq"]: EVAL_HOLDOUT["nq"] + n_nq], corpus_of(nq_all), distractors, seed)
    sq_all = load_dataset("squad", d / "squad_v2_dev_subset" / "squad_v2_dev_first5articles.json")
    sq = add_distractors(sq_all[EVAL_HOLDOUT["squad"]: EVAL_HOLDOUT["squad"] + n_squad], corpus_of(sq_all),
                         distractors, seed)
    pairs = [("hotpotqa", e) for e in hotpot] + [("nq", answer_sentence_evidence(e)) for e in nq]
    pairs += [("squad", answer_sentence_evidence(e)) for e in sq]
    data = {
        "hotpotqa": f"{len(hotpot)} questions: hotpotqa_train_b.json (all) + hotpotqa_train_a.jsonl[100:] "
                    "(labels: supporting_facts)",
        "nq": f"{len(nq)} questions: nq-open-oracle-even.jsonl.gz[{EVAL_HOLDOUT['nq']}:], {distractors} BM25 "
              "distractors each (label: gold-passage sentence holding an answer string)",
        "squad": f"{len(sq)} answerable questions: squad_v2_dev_first5articles.json answerable[{EVAL_HOLDOUT['squad']}:], "
                 f"{distractors} distractors each (label: sentence holding the answer)",
        "eval_holdout": "first 100 of hotpotqa_train_a.jsonl, first 400 NQ, first 300 answerable SQuAD never trained on",
    }
    return pairs, data


def sentinel_records(data_dir: str | Path, n_hotpot: int = 200, n_nq: int = 150, n_squad: int = 150,
                     distractors: int = 9, seed: int = 0) -> tuple[list[tuple[str, str, list[Passage]]], dict]:
    """(source, question, passages-with-evidence) records and a description of where they came from."""
    pairs, data = _sentinel_sources(data_dir, n_hotpot, n_nq, n_squad, distractors, seed)
    return [(src, e.question, e.passages) for src, e in pairs], data


def val_tail(n_val: int) -> int:
    """How many NQ training questions (the last ones) ``n_val`` validation questions take beyond questions
    300..399 of the evaluation hold-out: the soft families then train without them."""
    return max(0, n_val - (EVAL_HOLDOUT["nq"] - _VAL_FROM))


def _qa_sources(data_dir: str | Path, n_val: int = 0) -> tuple[list[QAExample], list[QAExample], list[QAExample],
                                                               list[QAExample], set[str]]:
    """NQ (even lines), answerable SQuAD, HotpotQA train_a and train_b, and the texts of every held-out
    question's passages (never trained on); NQ without the questions ``n_val`` validation records take from its
    end (:func:`val_tail`)."""
    d = Path(data_dir)
    nq_all = load_dataset("nq", d / "nq_open" / "nq-open-oracle-even.jsonl.gz")
    cut = len(nq_all) - val_tail(n_val)
    nq_all, kept_back = nq_all[:cut], nq_all[cut:]
    sq_all = load_dataset("squad", d / "squad_v2_dev_subset" / "squad_v2_dev_first5articles.json")
    ha_all = load_dataset("hotpotqa", d / "hotpotqa_train" / "hotpotqa_train_a.jsonl")
    hb = load_dataset("hotpotqa", d / "hotpotqa_train" / "hotpotqa_train_b.json")
    held_out = {p.text for e in nq_all[: EVAL_HOLDOUT["nq"]] + sq_all[: EVAL_HOLDOUT["squad"]]
                + ha_all[: EVAL_HOLDOUT["hotpotqa_a"]] + kept_back for p in e.passages}
    return nq_all, sq_all, ha_all, hb, held_out


def squad_train(path: str | Path, held_out: set[str], n: int | None = None) -> tuple[list[QAExample], str]:
    """The answerable questions of a SQuAD-format *train* file (``--squad-train``; ``.gz`` read as gzip), those
    whose paragraph is a held-out question's left out, cut to ``n``; and a provenance line naming the file and
    its sha256. ``n`` questions are taken evenly spread over the file (question ``i * len / n``), so a cut still
    covers every article. SQuAD's train and dev splits share no article, so nothing else of the evals can come
    in."""
    import hashlib

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--squad-train {path}: no such file; give a SQuAD-format train file, e.g. "
                         "training/data/squad_v2_train_first10articles.json.gz")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    examples = [e for e in load_dataset("squad", path) if e.answers and e.passages[0].text not in held_out]
    if n is not None and n < len(examples):
        examples = [examples[i * len(examples) // n] for i in range(n)]
    return examples, f"{len(examples)} SQuAD answerable questions of {path.name} (sha256 {sha[:16]})"


def distill_records(data_dir: str | Path, max_distractors: int = 9, n_nq: int | None = None,
                    n_squad: int | None = None, n_hotpot: int | None = 200, seed: int = 0,
                    n_val: int = 0, squad_train_file: str | Path | None = None,
                    n_squad_train: int | None = None) -> tuple[list[Any], dict]:
    """Multi-passage ``QARecord`` s shaped like the benchmark's contexts, for distillation, and their provenance.

    NQ questions 400+ (gold passage, first answer) and answerable SQuAD questions 300+ (paragraph, shortest
    answer) each get k BM25 distractors, k drawn uniformly from 0..``max_distractors`` per question, from the
    passages of training questions only; HotpotQA training questions (train_b, then train_a[100:]) keep their
    ten paragraphs. Passage order is shuffled (seeded); ``evidence`` marks the gold passage(s), which are all
    the distillation teacher reads. A question whose gold passage belongs to a held-out question is left out;
    so are the NQ questions ``n_val`` validation records take (:func:`val_tail`)."""
    from compressor.training import QARecord

    nq_all, sq_all, ha_all, hb, held_out = _qa_sources(data_dir, n_val)
    rng = random.Random(f"{seed}-distill")

    def pool(examples: list[QAExample], want: int | None) -> list[QAExample]:
        return [e for e in examples if e.answers and e.passages[0].text not in held_out][:want]

    def corpus(examples: list[QAExample]) -> list[Passage]:
        return [p for p in corpus_of(examples) if p.text not in held_out]

    nq_train = pool(nq_all[EVAL_HOLDOUT["nq"]:], n_nq)
    sq_train = pool(sq_all[EVAL_HOLDOUT["squad"]:], n_squad)
    groups = [("nq", add_distractors(nq_train, corpus(nq_all[EVAL_HOLDOUT["nq"]:]), max_distractors, seed)),
              ("squad", add_distractors(sq_train, corpus(sq_all[EVAL_HOLDOUT["squad"]:]), max_distractors, seed))]
    hotpot = [e for e in hb + ha_all[EVAL_HOLDOUT["hotpotqa_a"]:] if not {p.text for p in e.passages} & held_out]
    groups.append(("hotpotqa", hotpot[:n_hotpot]))
    extra = None
    if squad_train_file is not None:  # distractors from the same file's other paragraphs
        more, extra = squad_train(squad_train_file, held_out, n_squad_train)
        groups.append(("squad_train", add_distractors(more, corpus(more), max_distractors, seed)))
    records, ks = [], {"nq": [], "squad": [], "squad_train": []}
    for name, examples in groups:
        for e in examples:
            gold = [p for p in e.passages if p.evidence]
            rest = [p for p in e.passages if not p.evidence]
            if name != "hotpotqa":
                ks[name].append(rng.randint(0, min(max_distractors, len(rest))))
                rest = rest[: ks[name][-1]]
            ps = gold + rest
            rng.shuffle(ps)
            answer = min(e.answers, key=len) if name.startswith("squad") else e.answers[0]
            records.append(QARecord(e.question, tuple(Passage(text=p.text, title=p.title) for p in ps), answer,
                                    tuple(e.answers), tuple(i for i, p in enumerate(ps) if p.evidence)))
    n_h = len(groups[2][1])
    data = {
        "stage2": f"{len(records)} multi-passage questions: {len(nq_train)} NQ (nq-open-oracle-even[{EVAL_HOLDOUT['nq']}:], "
                  f"gold passage + k BM25 distractors, first answer), {len(sq_train)} SQuAD answerable"
                  f"[{EVAL_HOLDOUT['squad']}:] (paragraph + k distractor paragraphs, shortest answer), k uniform in "
                  f"0..{max_distractors} (mean NQ {sum(ks['nq']) / max(1, len(ks['nq'])):.2f}, SQuAD "
                  f"{sum(ks['squad']) / max(1, len(ks['squad'])):.2f}); {n_h} HotpotQA (train_b, train_a"
                  f"[{EVAL_HOLDOUT['hotpotqa_a']}:]) with their 10 paragraphs; passage order shuffled (seed {seed}); "
                  "distractors from training questions' passages only"
                  + (f"; + {extra}, paragraph + k distractor paragraphs of that file, k uniform in "
                     f"0..{max_distractors}" if extra else ""),
        "teacher": "the frozen decoder reading only the gold passage (HotpotQA: the paragraphs holding supporting "
                   "facts); its answer is the target where it contains a gold answer, else the gold answer",
        "eval_holdout": "first 400 NQ, first 300 answerable SQuAD, first 100 hotpotqa_train_a questions and their "
                        "passages never trained on",
    }
    return records, data


def distill_val_records(data_dir: str | Path, n: int = 50, distractors: int = 9, seed: int = 0) -> tuple[list[Any], str]:
    """Validation records for the soft families' learning curve: NQ questions 300..300+n (held out from
    training, not among the benchmark's first 100; the benchmark at --limit 300 reads 0..299) and, past 100, the
    last n - 100 NQ questions, which training then leaves out (:func:`val_tail`), with ``distractors`` BM25
    passages from the held-out questions 100..399's passages, order shuffled. Never trained on; the benchmark's
    questions never used."""
    from compressor.training import QARecord

    nq_all = load_dataset("nq", Path(data_dir) / "nq_open" / "nq-open-oracle-even.jsonl.gz")
    lo, hi = _VAL_FROM, min(_VAL_FROM + n, EVAL_HOLDOUT["nq"])
    tail = val_tail(n)
    pool = nq_all[100: EVAL_HOLDOUT["nq"]]
    rng = random.Random(f"{seed}-val")
    out = []
    chosen = nq_all[lo:hi] + nq_all[len(nq_all) - tail:]
    for e in add_distractors([e for e in chosen if e.answers], corpus_of(pool), distractors, seed):
        ps = list(e.passages)
        rng.shuffle(ps)
        out.append(QARecord(e.question, tuple(Passage(text=p.text, title=p.title) for p in ps), e.answers[0],
                            tuple(e.answers), tuple(i for i, p in enumerate(ps) if p.evidence)))
    where = f"[{lo}:{hi}]" + (f" and [{len(nq_all) - tail}:{len(nq_all)}]" if tail else "")
    return out, (f"NQ nq-open-oracle-even{where} + {distractors} BM25 distractors from questions [100:400]'s "
                 "passages (held out from training, not benchmark questions)")


def xrag_records(data_dir: str | Path, n_stage1: int | None = None, n_nq: int | None = None,
                 n_squad: int | None = None, distractors: int = 0, min_words: int = 20,
                 seed: int = 0, n_val: int = 0, squad_train_file: str | Path | None = None,
                 n_squad_train: int | None = None) -> tuple[list[str], list[Any], dict]:
    """Plain records for ``train_xrag``: (stage-1 passage texts, stage-2 ``QARecord`` s, data description).

    Stage 1: abstracts (paragraphs of at least ``min_words`` words), NQ gold passages of questions 400+,
    HotpotQA paragraphs (train_b, train_a[100:]) and SQuAD paragraphs of answerable questions 300+, deduplicated,
    in that order (cut to ``n_stage1``). Stage 2: NQ questions 400+ with their gold passage and first answer,
    then answerable SQuAD questions 300+ with their paragraph and shortest answer. ``distractors`` K > 0 adds K
    BM25 passages (from training questions' passages only) around each NQ gold passage: K + 1 rows, as top-K
    retrieval gives at eval time. The NQ questions ``n_val`` validation records take are left out
    (:func:`val_tail`). ``squad_train_file``: a SQuAD-format train file whose answerable questions (paragraph,
    shortest answer) follow in stage 2 (:func:`squad_train`)."""
    from compressor.xrag.train import QARecord

    nq_all, sq_all, ha_all, hb, held_out = _qa_sources(data_dir, n_val)
    d = Path(data_dir)
    nq, sq = nq_all[EVAL_HOLDOUT["nq"]:], sq_all[EVAL_HOLDOUT["squad"]:]

    abstracts = []
    for f in sorted((d / "abstracts").glob("*.txt")):
        abstracts += [p.strip() for p in re.split(r"\n\s*\n", f.read_text(encoding="utf-8"))
                      if len(p.split()) >= min_words]
    sources = {"abstracts": abstracts, "nq": [p.text for e in nq for p in e.passages],
               "hotpotqa": [p.text for e in hb + ha_all[EVAL_HOLDOUT["hotpotqa_a"]:] for p in e.passages
                            if len(p.text.split()) >= min_words],
               "squad": [e.passages[0].text for e in sq]}
    texts: dict[str, str] = {}
    counts = {}
    for name, items in sources.items():
        before = len(texts)
        for t in items:
            if t not in held_out:
                texts.setdefault(t, name)
        counts[name] = len(texts) - before
    stage1 = list(texts)[:n_stage1]

    nq_train = [e for e in nq if e.passages[0].text not in held_out][:n_nq]
    if distractors:
        nq_train = add_distractors(nq_train, [p for p in corpus_of(nq) if p.text not in held_out], distractors, seed)
    sq_train = [e for e in sq if e.answers and e.passages[0].text not in held_out][:n_squad]
    qa = [QARecord(e.question, tuple(Passage(text=p.text, title=p.title) for p in e.passages), e.answers[0],
                   tuple(e.answers), tuple(i for i, p in enumerate(e.passages) if p.evidence)) for e in nq_train]
    extra, more = None, []
    if squad_train_file is not None:
        more, extra = squad_train(squad_train_file, held_out, n_squad_train)
    qa += [QARecord(e.question, (Passage(text=e.passages[0].text, title=e.passages[0].title),),
                    min(e.answers, key=len), tuple(e.answers)) for e in sq_train + more]
    data = {
        "stage1": f"{len(stage1)} of {len(texts)} passages: abstracts {counts['abstracts']}, NQ gold passages of questions "
                  f"{EVAL_HOLDOUT['nq']}+ {counts['nq']}, HotpotQA paragraphs (train_b, train_a[100:]) "
                  f"{counts['hotpotqa']}, SQuAD paragraphs (answerable[300:]) {counts['squad']}; deduplicated, "
                  "eval passages excluded" + (f", cut to {n_stage1}" if n_stage1 else ""),
        "stage2": f"{len(nq_train)} NQ questions (nq-open-oracle-even[{EVAL_HOLDOUT['nq']}:], gold passage"
                  + (f" + {distractors} BM25 distractors" if distractors else "") + ", first answer) + "
                  f"{len(sq_train)} SQuAD answerable[{EVAL_HOLDOUT['squad']}:] (paragraph, shortest answer)"
                  + (f" + {extra} (paragraph, shortest answer)" if extra else ""),
        "eval_holdout": "first 400 NQ, first 300 answerable SQuAD, first 100 hotpotqa_train_a questions and their "
                        "passages never trained on",
    }
    return stage1, qa, data
