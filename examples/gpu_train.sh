#!/usr/bin/env bash
# Given one GPU for about 10 minutes: continue the committed ICAE v2 run at GPU speed (the same schedule, so the
# CPU can resume it after), then score the new artifact's validation curve on the CPU side.
#
#   bash examples/gpu_train.sh          # on the GPU machine, from the repository root, after `make install`
#
# The chunk stops after MAX_HOURS (default 0.13 h, ~8 minutes of steps, leaving time for set-up and teacher
# targets); training/icae-v2-dec8/checkpoint and runs/icae-v2-dec8 come back (both under 60 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda} MAX_HOURS=${MAX_HOURS:-0.13} bash examples/train_chunk.sh
