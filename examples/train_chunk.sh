#!/usr/bin/env bash
# One chunk of a long soft-family training run, on a CPU or a GPU, continuing the committed checkpoint exactly.
#
#   bash examples/train_chunk.sh                          # CPU, 2.5 hours, runs the committed run further
#   DEVICE=cuda MAX_HOURS=0.15 bash examples/train_chunk.sh   # one GPU for ~10 minutes (examples/gpu_train.sh)
#
# RUN names a folder under training/ holding args.txt (the run's fixed settings: changing one starts another
# run) and checkpoint/ (trainable tensors + AdamW moments, committed between sessions). The chunk resumes from
# that checkpoint, stops after MAX_HOURS at a checkpoint, copies the new checkpoint back into training/RUN/ (to
# commit) and writes the artifact of the weights so far to OUT (default runs/RUN), which a CPU loads and scores.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-icae-v2-dec8}
FAMILY=${FAMILY:-icae}
DEVICE=${DEVICE:-cpu}
MAX_HOURS=${MAX_HOURS:-2.5}
RAGPRESS=${RAGPRESS:-.venv/bin/ragpress}
SRC=${SRC:-training/$RUN}
WORK=${WORK:-runs/$RUN-work}
OUT=${OUT:-runs/$RUN}
[ -f "$SRC/args.txt" ] || { echo "train_chunk: no $SRC/args.txt (the run's settings)" >&2; exit 2; }
mkdir -p "$WORK"
if [ -f "$SRC/checkpoint/compressor_config.json" ] && [ ! -f "$WORK/checkpoint/compressor_config.json" ]; then
  rm -rf "$WORK/checkpoint" && cp -r "$SRC/checkpoint" "$WORK/checkpoint"
  [ -f "$SRC/train_log.jsonl" ] && cp "$SRC/train_log.jsonl" "$WORK/"
  [ -f "$SRC/val_log.jsonl" ] && cp "$SRC/val_log.jsonl" "$WORK/"
fi
# shellcheck disable=SC2046  # args.txt is a list of flags, split on whitespace on purpose
"$RAGPRESS" train "$FAMILY" --out "$OUT" --work-dir "$WORK" --resume --device "$DEVICE" --max-hours "$MAX_HOURS" \
  $(cat "$SRC/args.txt") ${EXTRA_ARGS:-}
if [ -f "$WORK/checkpoint/compressor_config.json" ]; then
  rm -rf "$SRC/checkpoint.new" && cp -r "$WORK/checkpoint" "$SRC/checkpoint.new"
  rm -rf "$SRC/checkpoint" && mv "$SRC/checkpoint.new" "$SRC/checkpoint"
fi
for f in train_log.jsonl val_log.jsonl; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$SRC/$f"; done
size=$(du -sm "$OUT" | cut -f1)
echo "train_chunk: $OUT is $size MB; checkpoint copied to $SRC/checkpoint (commit it)"
[ "$size" -lt 60 ] || { echo "train_chunk: $OUT is over 60 MB" >&2; exit 1; }
