#!/usr/bin/env bash
# The measurements of the ICAE issue, in one script: reconstruction BLEU (trained vs untrained control) and
# QA with SmolLM2 on held-out SQuAD / NQ (gold passage, and 4 BM25 distractors, each passage compressed on its
# own) against none / no_context, plus the slot cache timed on hits. Writes runs/icae-eval/*.json.
#   bash research/icae_eval.sh [ARTIFACT] [LIMIT]
set -euo pipefail
ART=${1:-compressor/artifacts/icae-smollm2-135m-exp1}
N=${2:-100}
PY=${PY:-.venv/bin/python}
RP=${RP:-.venv/bin/ragpress}
OUT=runs/icae-eval
D=../shared/data
mkdir -p $OUT
[ -d runs/icae-control ] || $RP train icae --stage1-steps 0 --stage2-steps 0 --out runs/icae-control --work-dir runs/icae-control-work
for who in trained control; do
  a=$ART; [ $who = control ] && a=runs/icae-control
  $PY research/icae_reconstruction.py --artifact $a --segment-only --limit ${BLEU_N:-50} --out $OUT/bleu_segment_$who.json
done
$PY research/icae_reconstruction.py --artifact $ART --limit ${BLEU_PARA_N:-20} --out $OUT/bleu_paragraph_trained.json
SQ="--dataset squad --path $D/squad_v2_dev_subset/squad_v2_dev_first5articles.json"
NQ="--dataset nq --path $D/nq_open/nq-open-oracle-even.jsonl.gz"
for ds in squad nq nq-d4; do
  case $ds in squad) args=$SQ;; nq) args=$NQ;; nq-d4) args="$NQ --distractors 4";; esac
  for m in none no_context; do
    [ -f $OUT/${ds}_$m.json ] || $RP eval $args --method $m --limit $N --out $OUT/${ds}_$m.json
  done
  [ -f $OUT/${ds}_icae.json ] || $RP eval $args --method icae --artifact $ART --limit $N --out $OUT/${ds}_icae.json
  [ -f $OUT/${ds}_control.json ] || $RP eval $args --method icae --artifact runs/icae-control --limit $N --out $OUT/${ds}_control.json
done
# slot cache: fill, then the timed run reads every passage from it
rm -rf $OUT/slot-cache
$RP eval $NQ --method icae --artifact $ART --limit $N --slot-cache $OUT/slot-cache --out $OUT/nq_icae_fill.json
$RP eval $NQ --method icae --artifact $ART --limit $N --slot-cache $OUT/slot-cache --out $OUT/nq_icae_cached.json
$PY research/icae_table.py $OUT
