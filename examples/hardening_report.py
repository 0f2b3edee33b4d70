"""The proxy's hardening report (``make harden``): a bounded load test, the upstream fault matrix and
schemathesis fuzzing, each limited in time and on loopback only, summed up in one markdown table.

* load: ``--requests`` chat requests with documents from ``--concurrency`` clients against the proxy in a
  child process, in front of the fake decoder and of a stub remote upstream (and of the real in-process
  decoder with ``--embedded``); requests/s, latency percentiles, errors, the proxy's RSS after warm-up and
  after the run;
* faults: :data:`serving.harden.faults.SCENARIOS` against a stub upstream (down, slow, 5xx, malformed,
  streams cut): the right error, no hang, recovery;
* fuzz: schemathesis on ``/openapi.json`` (positive and negative cases), ``--fuzz-examples`` per operation
  and mode, at most ``--fuzz-seconds``.

Exits 1 if any request failed, any fault was not survived or the fuzzer found anything (details on stderr).

    .venv/bin/python examples/hardening_report.py [--requests 1000] [--concurrency 8] [--embedded]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from compressor.models import load_tokenizer
from serving.harden.faults import SCENARIOS, run_fault_matrix
from serving.harden.fuzz import build_fuzz_app, run_fuzz
from serving.harden.load import run_load

MODEL = "smollm2-135m-instruct"
COLUMNS = ["check", "requests served", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms", "RSS before → after MB",
           "fuzz cases", "5xx found", "faults survived", "s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests per load run (after a warm-up of 20)")
    ap.add_argument("--concurrency", type=int, default=8, help="concurrent clients")
    ap.add_argument("--load-seconds", type=float, default=120.0, help="stop a load run after this long")
    ap.add_argument("--embedded", action="store_true", help="also load-test the real in-process decoder")
    ap.add_argument("--embedded-requests", type=int, default=40)
    ap.add_argument("--fault-timeout", type=float, default=1.0, help="the proxy's upstream timeout in the matrix")
    ap.add_argument("--fuzz-examples", type=int, default=200, help="cases per operation and mode")
    ap.add_argument("--fuzz-seconds", type=float, default=90.0)
    ap.add_argument("--json", help="also write every number here")
    args = ap.parse_args()

    rows, problems, out = [], [], {}
    for mode, n, label in [("fake", args.requests, "load: fake decoder"), ("stub", args.requests, "load: stub upstream"),
                           *([("embedded", args.embedded_requests, f"load: embedded {MODEL}")] if args.embedded else [])]:
        print(f"... {label}: {n} requests, {args.concurrency} clients", file=sys.stderr, flush=True)
        r = run_load(mode, requests=n, concurrency=args.concurrency, max_seconds=args.load_seconds, model=MODEL)
        out[f"load_{mode}"] = r.as_dict()
        rows.append([f"{label} ({r.concurrency} clients)", f"{r.served}/{r.requests}", r.errors, r.rps, r.p50_ms,
                     r.p95_ms, r.p99_ms, f"{r.rss_before_mb:.0f} → {r.rss_after_mb:.0f}", "–", "–", "–", r.seconds])
        if r.errors or r.served < n:
            problems.append(f"{label}: {r.errors} errors, {r.served}/{n} served; first: {r.first_error}")

    tok = load_tokenizer(MODEL)
    print(f"... fault matrix: {len(SCENARIOS)} faults", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    faults = run_fault_matrix(tok, timeout_s=args.fault_timeout)
    survived = sum(f.survived for f in faults)
    out["faults"] = [f.__dict__ for f in faults]
    rows.append(["fault matrix (stub upstream)", "–", sum(not f.survived for f in faults), "–", "–", "–", "–", "–", "–",
                 "–", f"{survived}/{len(faults)}", round(time.perf_counter() - t0, 1)])
    problems += [f"fault '{f.name}': want {f.expected}, got {f.got}, recovered={f.recovered}"
                 for f in faults if not f.survived]

    print(f"... fuzzing: {args.fuzz_examples} cases per operation and mode, {args.fuzz_seconds:g} s at most",
          file=sys.stderr, flush=True)
    fz = run_fuzz(build_fuzz_app(tok), max_examples=args.fuzz_examples, max_seconds=args.fuzz_seconds)
    out["fuzz"] = {**fz.__dict__, "by_status": {str(k): v for k, v in fz.by_status.items()}}
    rows.append(["fuzz: schemathesis, /openapi.json", "–", fz.bad_errors + fz.check_failures, "–", "–", "–", "–", "–",
                 fz.cases, fz.server_errors, "–", fz.seconds])
    problems += [f"fuzz: {e}" for e in fz.examples]

    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
