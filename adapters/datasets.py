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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from compressor.base import Passage
from compressor.errors import InputError

__all__ = ["QAExample", "DatasetSpec", "LoadedDataset", "load_dataset", "load_examples", "load_passages",
           "parse_dataset_label", "add_distractors", "corpus_of", "DATASETS", "DATA_FILES"]

DATASETS = ("hotpotqa", "nq", "squad", "jsonl")
# The file of each dataset in the shared data folder (``--data``), for the benchmark's dataset labels.
DATA_FILES = {
    "hotpotqa": "hotpotqa_train/hotpotqa_train_a.jsonl",
    "nq": "nq_open/nq-open-oracle-even.jsonl.gz",
    "squad": "squad_v2_dev_subset/squad_v2_dev_first5articles.json",
}


class QAExample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    question: str
    answers: list[str] = Field(description="Gold answers; empty for an unanswerable question.")
    passages: list[Passage]
    gold_sentences: list[str] = Field(default_factory=list, description="Sentences holding the evidence.")


# -- the records as the files hold them: validated one by one, so a bad one is named by file, line and field --
# Ids are taken as strings (the public HotpotQA dev file has integer ``_id``s); unknown fields are ignored.

class _Raw(BaseModel):
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)


class _HotpotRecord(_Raw):
    id: str = Field(alias="_id")
    question: str
    answer: str
    supporting_facts: list[tuple[str, int]]
    context: list[tuple[str, list[str]]]


class _NQContext(_Raw):
    text: str
    title: str | None = None
    isgold: bool = False
    hasanswer: bool = False


class _NQRecord(_Raw):
    question: str
    answers: list[str]
    ctxs: list[_NQContext]


class _SquadAnswer(_Raw):
    text: str


class _SquadQuestion(_Raw):
    id: str
    question: str
    answers: list[_SquadAnswer] = Field(default_factory=list)
    is_impossible: bool = False


class _SquadParagraph(_Raw):
    context: str
    qas: list[_SquadQuestion]


class _SquadArticle(_Raw):
    title: str = ""
    paragraphs: list[_SquadParagraph]


class _JsonlRecord(_Raw):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    id: str | None = None
    question: str
    passages: list[Any]
    answers: list[str] = Field(default_factory=list)


_FIX = {
    "hotpotqa": "a HotpotQA record has _id, question, answer, supporting_facts [[title, i]] and context "
                "[[title, [sentences]]]",
    "nq": "an NQ-open record has question, answers [..] and ctxs [{title, text}]",
    "squad": "a SQuAD v2 file is {\"data\": [{title, paragraphs: [{context, qas: [{id, question, answers}]}]}]}",
    "jsonl": 'write one {"id", "question", "passages": [text or {"title", "text"}], "answers": [..]} per line',
    "passages": 'write one passage per line: a JSON string or {"title": ..., "text": ...}',
}


def _validate(model: type[BaseModel], obj: Any, where: str, kind: str, prefix: str = "") -> Any:
    """``obj`` as ``model``; the first problem becomes one line naming ``where`` and the field (``prefix``: the
    path of ``obj`` inside its record)."""
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        loc = prefix + (".".join(str(x) for x in err["loc"]) or "(the record)")
        raise InputError(f"{where}: field {loc!r}: {err['msg']}; {_FIX[kind]}") from None


def _json_lines(path: Path, kind: str) -> Iterator[tuple[str, Any]]:
    """``(where, object)`` per non-blank line of a JSON-lines file (``.gz`` read as gzip)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{n}: not JSON ({e.msg}); {_FIX[kind]}") from None
                yield f"{path}:{n}", obj
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise InputError(f"{path}: cannot be read as UTF-8 JSON lines ({type(e).__name__}: {e}); {_FIX[kind]}") from None


def _json_file(path: Path, kind: str) -> Any:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not JSON ({e.msg}); {_FIX[kind]}") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e}); {_FIX[kind]}") from None
    except (OSError, EOFError) as e:  # a .gz that is not gzip, or cut short
        raise InputError(f"{path}: cannot be read as gzip ({type(e).__name__}: {e}); {_FIX[kind]}") from None


def _hotpot_records(path: Path) -> Iterator[tuple[str, Any]]:
    """A JSON array (the official files; records named by their index) or JSON lines."""
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(64).lstrip()
    if head.startswith("["):
        records = _json_file(path, "hotpotqa")
        yield from ((f"{path}: record {i}", r) for i, r in enumerate(records))
    else:
        yield from _json_lines(path, "hotpotqa")


def _hotpot(path: Path) -> Iterator[QAExample]:
    for where, obj in _hotpot_records(path):
        r = _validate(_HotpotRecord, obj, where, "hotpotqa")
        sup = set(r.supporting_facts)
        passages, gold = [], []
        for title, sents in r.context:
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
        yield QAExample(id=r.id, question=r.question, answers=[r.answer], passages=passages,
                        gold_sentences=gold)


def _nq(path: Path) -> Iterator[QAExample]:
    for n, (where, obj) in enumerate(_json_lines(path, "nq")):
        r = _validate(_NQRecord, obj, where, "nq")
        ps = [Passage(text=c.text, title=c.title,
                      evidence=((0, len(c.text.rstrip())),) if c.isgold or c.hasanswer else None) for c in r.ctxs]
        yield QAExample(id=f"nq-{n}", question=r.question, answers=list(r.answers), passages=ps)


def _squad(path: Path, unanswerable: bool) -> Iterator[QAExample]:
    doc = _json_file(path, "squad")
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise InputError(f"{path}: field 'data': missing or not a list; {_FIX['squad']}")
    for i, obj in enumerate(data):
        art = _validate(_SquadArticle, obj, f"{path}: data[{i}]", "squad")
        title = art.title.replace("_", " ") or None
        for para in art.paragraphs:
            ctx = para.context
            for qa in para.qas:
                if qa.is_impossible and not unanswerable:
                    continue
                answers = [] if qa.is_impossible else sorted({a.text for a in qa.answers})
                yield QAExample(id=qa.id, question=qa.question, answers=answers,
                                passages=[Passage(text=ctx, title=title, evidence=((0, len(ctx.rstrip())),))])


def _jsonl(path: Path) -> Iterator[QAExample]:
    for n, (where, obj) in enumerate(_json_lines(path, "jsonl")):
        r = _validate(_JsonlRecord, obj, where, "jsonl")
        ps = [_passage(p, where, "jsonl", f"passages.{i}.") for i, p in enumerate(r.passages)]
        yield QAExample(id=r.id if r.id is not None else str(n), question=r.question, answers=r.answers, passages=ps)


def load_dataset(
    name: Literal["hotpotqa", "nq", "squad", "jsonl"],
    path: str | Path,
    limit: int | None = None,
    unanswerable: bool = False,
) -> list[QAExample]:
    """Load ``limit`` examples (in file order) of a dataset. SQuAD keeps answerable questions unless
    ``unanswerable`` is set. A malformed record raises :class:`InputError` naming the file, the line (or the
    record's index in a JSON file) and the field."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--path {path} does not exist; give the dataset file")
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


def load_passages(path: str | Path) -> list[Passage]:
    """The passages of a JSONL file, one per line: a JSON string or ``{"title", "text"}``; blank lines are
    skipped. A bad line raises :class:`InputError` naming the file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--passages {path}: no such file; give a JSONL file of passages")
    return [_passage(obj, where, "passages") for where, obj in _json_lines(path, "passages")]


def _passage(obj: Any, where: str, kind: str, prefix: str = "") -> Passage:
    """A passage given as a string or as an object; a bad one is named by ``where`` and its field."""
    return _validate(Passage, {"text": obj} if isinstance(obj, str) else obj, where, kind, prefix)


# -- one loading path for eval, index and the benchmark --------------------------------------------------------

class DatasetSpec(BaseModel):
    """A dataset as eval and the benchmark read it: a file, and how its passages are put together."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(description="Name in tables, e.g. 'nq-d9'.")
    kind: Literal["hotpotqa", "nq", "squad", "jsonl"]
    path: Path
    distractors: int = Field(default=0, ge=0, le=50, description="nq/squad: K BM25 distractor passages added "
                             "around each gold passage.")
    unanswerable: bool = Field(default=False, description="squad: include the unanswerable questions.")
    retrieve: int = Field(default=0, ge=0, le=50, description="nq: top-k passages retrieved (MiniLM) from the "
                          "corpus of all the file's passages instead of the gold passage (0: off).")

    @model_validator(mode="after")
    def _check(self) -> DatasetSpec:
        if self.distractors and self.kind not in ("nq", "squad"):
            raise ValueError(f"dataset {self.label!r}: distractors apply to nq or squad, not {self.kind}")
        if self.unanswerable and self.kind != "squad":
            raise ValueError(f"dataset {self.label!r}: unanswerable applies to squad, not {self.kind}")
        if self.retrieve and (self.kind != "nq" or self.distractors):
            raise ValueError(f"dataset {self.label!r}: retrieve applies to nq without distractors")
        return self


@dataclass
class LoadedDataset:
    """The examples of a :class:`DatasetSpec`; ``index`` is the retrieval index when ``retrieve`` is set (the
    xrag family reads its document vectors), ``info`` what the summary records about the retrieval."""

    examples: list[QAExample]
    index: Any = None
    info: dict[str, Any] = field(default_factory=dict)


def load_examples(spec: DatasetSpec, limit: int | None = None, seed: int = 0) -> LoadedDataset:
    """The first ``limit`` questions of ``spec``, with distractors or retrieved passages when it asks for them
    (distractors and the retrieval corpus come from the whole file)."""
    if spec.retrieve:
        from .retrieval import retrieve_examples

        examples, index, info = retrieve_examples(load_dataset("nq", spec.path), limit, spec.retrieve)
        return LoadedDataset(examples, index, {"retrieve": spec.retrieve,
                                               "gold_recall_at_k": info["gold_recall_at_k"], "index": info["index"]})
    if spec.distractors:
        everything = load_dataset(spec.kind, spec.path, unanswerable=spec.unanswerable)
        return LoadedDataset(add_distractors(everything[:limit], corpus_of(everything), spec.distractors, seed=seed))
    return LoadedDataset(load_dataset(spec.kind, spec.path, limit=limit, unanswerable=spec.unanswerable))


def parse_dataset_label(label: str, data: str | Path) -> DatasetSpec:
    """'nq-d9' -> NQ with 9 distractors; 'nq-r3' -> NQ with the top 3 retrieved passages; 'squad-d4-u' ->
    SQuAD with unanswerable questions too; a path ending in '.jsonl' -> your own records (see the README).
    ``data`` is the shared data folder holding :data:`DATA_FILES`."""
    if label.endswith(".jsonl"):
        if not Path(label).is_file():
            raise InputError(f"bench dataset {label!r}: no such file; give the path of a JSONL file of records")
        return DatasetSpec(label=Path(label).stem, kind="jsonl", path=Path(label))
    parts = label.split("-")
    kind = parts[0]
    if kind not in DATA_FILES:
        raise InputError(f"unknown bench dataset {label!r}: use hotpotqa, nq or squad, with -dK, -rK (nq) and -u "
                         "suffixes, or the path of a .jsonl file")
    k, r, u = 0, 0, False
    for p in parts[1:]:
        if p[:1] in ("d", "r") and p[1:].isdigit():
            k, r = (int(p[1:]), r) if p[0] == "d" else (k, int(p[1:]))
        elif p == "u":
            u = True
        else:
            raise InputError(f"unknown suffix {p!r} in bench dataset {label!r}: use -dK, -rK or -u")
    return make_spec(label=label, kind=kind, path=Path(data) / DATA_FILES[kind], distractors=k, unanswerable=u,
                     retrieve=r)


def make_spec(**fields: Any) -> DatasetSpec:
    """A :class:`DatasetSpec`, its validation turned into one line naming the bad combination."""
    try:
        return DatasetSpec(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        loc = ".".join(str(x) for x in err["loc"])
        raise InputError(msg if not loc else f"dataset {fields.get('label')!r}: field {loc!r}: {msg}") from None


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
