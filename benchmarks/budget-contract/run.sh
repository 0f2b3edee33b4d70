#!/usr/bin/env bash
# The budget contract on every NQ question of ../shared/data (1,328, the gold passage alone and with 9 BM25
# distractors): icae at ratio 4 answered (slots cached from the gold run, which the d9 run reuses), and the
# sentence filters at ratios 2, 5, 20 and target_tokens 16, compress only. Every run must complete; the
# summaries (reached ratio, n_rounded, n_errors, stopped_by) land here, the samples under runs/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=.venv/bin
NQ=../shared/data/nq_open/nq-open-oracle-even.jsonl.gz
RUNS=runs/budget-contract
OUT=benchmarks/budget-contract
mkdir -p "$RUNS" "$OUT"
run() {  # name, then ragpress eval arguments
  local name=$1; shift
  [ -f "$OUT/$name.json" ] && { echo "have $name"; return; }
  echo "== $name"
  $BIN/ragpress eval --dataset nq --path "$NQ" --out "$RUNS/$name.json" "$@" | tail -2
  cp "$RUNS/$name.json" "$OUT/$name.json"
}
run icae-nq-r4 --method icae --ratio 4 --slot-cache "$RUNS/slot-cache"
run icae-nq-d9-r4 --method icae --ratio 4 --distractors 9 --slot-cache "$RUNS/slot-cache"
for m in bm25 minilm sentinel; do
  for d in 0 9; do
    tag=$([ $d = 0 ] && echo nq || echo nq-d9)
    for r in 2 5 20; do run "$m-$tag-r$r" --method $m --ratio $r --distractors $d --no-generate; done
    run "$m-$tag-t16" --method $m --target-tokens 16 --distractors $d --no-generate
  done
done
echo "all done"
