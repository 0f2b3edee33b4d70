"""Loaders for the real QA data in ``../shared/data`` and for a plain JSONL of ``{question, passages, answers}``.

Every loader yields :class:`QAExample` objects whose passages carry ``evidence`` spans where the data labels
them (HotpotQA supporting facts; the gold passage under ``distractors``), used only for evidence recall and
the ``oracle`` method.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from compressor.base import Passage
from compressor.errors import InputError

__all__ = ["QAExample", "load_dataset", "add_distractors", "DATASETS"]

DATASETS = ("hotpotqa", "nq", "squad", "jsonl")


class QAExample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    question: str
    answers: list[str] = Field(description="Gold answers; empty for an unanswerable question.")
    passages: list[Passage]
    gold_sentences: list[str] = Field(default_factory=list, description="Sentences holding the evidence.")


def _hotpot_records(path: Path) -> Iterator[dict]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        yield from json.loads(text)
    else:
        for line in text.splitlines():
            if line.strip():
                yield json.loads(line)


def _hotpot(path: Path) -> Iterator[QAExample]:
    for r in _hotpot_records(path):
        sup = {(t, int(i)) for t, i in r["supporting_facts"]}
        passages, gold = [], []
        for title, sents in r["context"]:
            text, spans, pos = "", [], 0
            for j, s in enumerate(sents):
                text += s
                if (title, j) in sup and s.strip():
                    lead = len(s) - len(s.lstrip())
                    spans.append((pos + lead, pos + len(s.rstrip())))
                    gold.append(s.strip())
                pos += len(s)
            if not text.strip():
                continue
            passages.append(Passage(text=text, title=title,
                                    evidence=tuple(spans) if spans else None))
        yield QAExample(id=r["_id"], question=r["question"], answers=[r["answer"]], passages=passages,
                        gold_sentences=gold)


def _nq(path: Path) -> Iterator[QAExample]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f):
            r = json.loads(line)
            ps = []
            for c in r["ctxs"]:
                ev = ((0, len(c["text"].rstrip())),) if c.get("isgold") or c.get("hasanswer") else None
                ps.append(Passage(text=c["text"], title=c.get("title"), evidence=ev))
            yield QAExample(id=f"nq-{n}", question=r["question"], answers=list(r["answers"]), passages=ps)


def _squad(path: Path, unanswerable: bool) -> Iterator[QAExample]:
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    for art in data:
        for para in art["paragraphs"]:
            ctx = para["context"]
            for qa in para["qas"]:
                impossible = qa.get("is_impossible", False)
                if impossible and not unanswerable:
                    continue
                answers = [] if impossible else sorted({a["text"] for a in qa["answers"]})
                yield QAExample(id=qa["id"], question=qa["question"], answers=answers,
                                passages=[Passage(text=ctx, title=art.get("title", "").replace("_", " ") or None,
                                                  evidence=((0, len(ctx.rstrip())),))])


def _jsonl(path: Path) -> Iterator[QAExample]:
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            ps = [Passage(text=p) if isinstance(p, str) else Passage(**p) for p in r["passages"]]
            yield QAExample(id=str(r.get("id", n)), question=r["question"], answers=list(r.get("answers", [])),
                            passages=ps)
        except Exception as e:
            raise InputError(f"{path}:{n + 1}: expected {{question, passages, answers}}: {e}") from None


def load_dataset(
    name: Literal["hotpotqa", "nq", "squad", "jsonl"],
    path: str | Path,
    limit: int | None = None,
    unanswerable: bool = False,
) -> list[QAExample]:
    """Load ``limit`` examples (in file order) of a dataset. SQuAD keeps answerable questions unless
    ``unanswerable`` is set."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"--path {path} does not exist")
    if name == "hotpotqa":
        it = _hotpot(path)
    elif name == "nq":
        it = _nq(path)
    elif name == "squad":
        it = _squad(path, unanswerable)
    elif name == "jsonl":
        it = _jsonl(path)
    else:
        raise InputError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    out = []
    for ex in it:
        if limit is not None and len(out) >= limit:
            break
        out.append(ex)
    return out


def add_distractors(examples: list[QAExample], corpus: list[Passage], k: int, seed: int = 0) -> list[QAExample]:
    """Add ``k`` BM25-ranked distractor passages from ``corpus`` to each (single-passage) example, excluding
    its gold passage, and put the gold passage at a seeded random position."""
    import bm25s

    if k < 1:
        return examples
    uniq: dict[str, Passage] = {}
    for p in corpus:
        uniq.setdefault(p.text, p)
    docs = list(uniq.values())
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([f"{p.title or ''} {p.text}" for p in docs], stopwords="en", show_progress=False),
                    show_progress=False)
    rng = random.Random(seed)
    out = []
    for ex in examples:
        gold_texts = {p.text for p in ex.passages}
        res, _ = retriever.retrieve(bm25s.tokenize([ex.question], stopwords="en", show_progress=False),
                                    k=min(len(docs), k + len(gold_texts) + 2), show_progress=False)
        distract = [Passage(text=docs[j].text, title=docs[j].title) for j in res[0] if docs[j].text not in gold_texts][:k]
        gold = ex.passages[0]
        pos = rng.randrange(len(distract) + 1)
        passages = distract[:pos] + [gold] + distract[pos:]
        out.append(ex.model_copy(update={"passages": passages}))
    return out


def corpus_of(examples: list[QAExample]) -> list[Passage]:
    """All passages of a set of examples (the retrieval corpus for NQ/SQuAD distractors)."""
    return [Passage(text=p.text, title=p.title) for ex in examples for p in ex.passages]


def answer_sentence_evidence(ex: QAExample) -> QAExample:
    """Relabel evidence as the sentences of the gold passage(s) that contain a gold answer string (the
    sentence-level label for NQ and SQuAD). A gold passage whose sentences hold no answer string keeps no
    evidence."""
    from compressor.text import split_sentences

    answers = [a.lower() for a in ex.answers if a.strip()]
    out = []
    for p in ex.passages:
        if not p.evidence:
            out.append(p)
            continue
        spans = tuple((s, e) for s, e in split_sentences(p.text) if any(a in p.text[s:e].lower() for a in answers))
        out.append(p.model_copy(update={"evidence": spans or None}))
    return ex.model_copy(update={"passages": out})
