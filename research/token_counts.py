"""Token frequencies for the static embedder's SIF weights (``compressor/data/token_counts_wordpiece.json.gz``).

Counts MiniLM's WordPiece tokens over the project's training text only: the pretraining abstracts, the NQ-open
oracle passages after the held-out questions, the HotpotQA ``train_b`` paragraphs and the SQuAD paragraphs after
the held-out articles' questions (never a passage of a held-out or benchmark question). Keyed by token string, so any
tokenizer that shares the vocabulary's strings can use them; the file records its sources and their sha256.

    python research/token_counts.py
"""

from __future__ import annotations

import collections
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.datasets import DATA_FILES, load_dataset  # noqa: E402
from adapters.training_data import EVAL_HOLDOUT  # noqa: E402
from compressor.models import file_sha256 as sha256  # noqa: E402
from compressor.models import load_tokenizer  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
OUT = Path(__file__).resolve().parents[1] / "compressor" / "data" / "token_counts_wordpiece.json.gz"


def main() -> None:
    tok = load_tokenizer("minilm-l6")
    texts, sources = [], {}
    for f in sorted((DATA / "abstracts").glob("*.txt")):
        texts += [p for p in f.read_text().split("\n\n") if p.strip()]
        sources[f"abstracts/{f.name}"] = sha256(f)
    nq = load_dataset("nq", DATA / DATA_FILES["nq"])[EVAL_HOLDOUT["nq"]:]
    texts += list({p.text: None for ex in nq for p in ex.passages})
    sources[f"{DATA_FILES['nq']} [{EVAL_HOLDOUT['nq']}:] passages"] = sha256(DATA / DATA_FILES["nq"])
    hp = DATA / "hotpotqa_train" / "hotpotqa_train_b.json"
    texts += list({p.text: None for ex in load_dataset("hotpotqa", hp) for p in ex.passages})
    sources["hotpotqa_train/hotpotqa_train_b.json paragraphs"] = sha256(hp)
    sq = load_dataset("squad", DATA / DATA_FILES["squad"])[EVAL_HOLDOUT["squad"]:]
    texts += list({p.text: None for ex in sq for p in ex.passages})
    sources[f"{DATA_FILES['squad']} [{EVAL_HOLDOUT['squad']}:] paragraphs"] = sha256(DATA / DATA_FILES["squad"])
    held_out = {p.text for kind, n in (("nq", EVAL_HOLDOUT["nq"]), ("squad", EVAL_HOLDOUT["squad"]),
                                       ("hotpotqa", EVAL_HOLDOUT["hotpotqa_a"]))
                for ex in load_dataset(kind, DATA / DATA_FILES[kind])[:n] for p in ex.passages}
    texts = [t for t in texts if t not in held_out]  # a held-out question's passage is never counted
    counts: collections.Counter[str] = collections.Counter()
    for i in range(0, len(texts), 256):
        for ids in tok(texts[i:i + 256], add_special_tokens=False)["input_ids"]:
            counts.update(tok.convert_ids_to_tokens(ids))
    record = {"tokenizer": "minilm-l6 (bert-base-uncased WordPiece)", "texts": len(texts),
              "tokens": sum(counts.values()), "sources": sources, "counts": dict(counts.most_common())}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:
        f.write(json.dumps(record, sort_keys=False).encode())
    print(f"{OUT}: {len(texts)} texts, {record['tokens']} tokens, {len(counts)} distinct")


if __name__ == "__main__":
    main()
