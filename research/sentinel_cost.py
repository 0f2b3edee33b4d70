"""Sentinel's compression time against the full-context prefill, side by side on the same questions in one run:
per question, the SmolLM2 decoder's time to first token on the full context (HF backend, bf16, as the benchmark
times ``none``), then sentinel compressing at ratio 5 with every sentence embedded, with ``embed_share`` 0.5, and
with the index-time cache (filled before anything is timed). The benchmark's first ``n`` HotpotQA questions and
NQ with 9 distractors: nothing here is tuned, only timed.

    python research/sentinel_cost.py --n 50 --out runs/sentinel-cost.json [--methods sentinel sentinel_l1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.datasets import load_examples, parse_dataset_label  # noqa: E402
from adapters.decoders.base import GenerationParams  # noqa: E402
from adapters.decoders.hf import HFBackend  # noqa: E402
from compressor import Budget, TokenCounter, get_compressor  # noqa: E402
from compressor.prompt import PromptBuilder  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--datasets", nargs="+", default=["hotpotqa", "nq-d9"])
    ap.add_argument("--out", type=Path, default=Path("runs/sentinel-cost.json"))
    ap.add_argument("--methods", nargs="+", default=["sentinel"],
                    help="registered sentinel probes to time, each three ways (e.g. sentinel sentinel_l1)")
    args = ap.parse_args()
    if bad := [m for m in args.methods if not m.startswith("sentinel")]:
        ap.error(f"--methods {' '.join(bad)}: only sentinel probes are timed here (e.g. sentinel sentinel_l1)")
    backend = HFBackend.load("smollm2-135m-instruct")
    counter = TokenCounter.from_tokenizer(backend.tokenizer)
    builder = PromptBuilder(backend.tokenizer)
    cache = tempfile.mkdtemp(prefix="sentinel-cost-")
    none = get_compressor("none", counter=counter)
    variants = {}
    for m in args.methods:
        variants |= {m: get_compressor(m, counter=counter),
                     f"{m}, embed_share 0.5": get_compressor(m, counter=counter, embed_share=0.5),
                     f"{m}@cache": get_compressor(m, counter=counter, cache_dir=cache)}
    out = {}
    for label in args.datasets:
        exs = load_examples(parse_dataset_label(label, DATA), limit=args.n + 1).examples
        for m in args.methods:
            variants[f"{m}@cache"].index([p for ex in exs for p in ex.passages])
        times: dict[str, list[float]] = {"prefill (none)": [], **{k: [] for k in variants}}
        for i, ex in enumerate(exs):
            full = none.compress(ex.question, ex.passages)
            g = backend.generate([builder.build(full)], GenerationParams(max_new_tokens=1))[0]
            rows = {"prefill (none)": g.ttft_s}
            for k, comp in variants.items():
                t = time.perf_counter()
                comp.compress(ex.question, ex.passages, Budget(ratio=5))
                rows[k] = time.perf_counter() - t
            if i:  # the first question warms every model up
                for k, v in rows.items():
                    times[k].append(v)
        pre = statistics.fmean(times["prefill (none)"])
        out[label] = {k: {"mean_s": statistics.fmean(v), "share_of_prefill": statistics.fmean(v) / pre}
                      for k, v in times.items()}
        for k, v in out[label].items():
            print(f"{label} | {k} | {v['mean_s']:.3f} s | {100 * v['share_of_prefill']:.1f}%", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"n": args.n, "results": out}, indent=2))


if __name__ == "__main__":
    main()
