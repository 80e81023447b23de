#!/usr/bin/env bash
# The SmolLM2-135M-Instruct before/after study (docs/results/convert-smollm2.md).
# Resumable: rerun it and finished steps are skipped, an interrupted arm continues from its last
# checkpoint (--resume). Usage: bash scripts/study_convert_smollm2.sh [convert|finetune|report|all]
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
R=runs/convert-smollm2
M=runs/smollm2-135m-instruct
WT=../shared/data/wikitext2
D=$WT/valid.txt                     # fine-tuning data (last tenth held out)
STEPS=${STEPS:-100}
FT="--data $D --steps $STEPS --batch-size 4 --seq-len 128 --lr 1e-4 --checkpoint-every 25 --log-every 5 --quiet"
mkdir -p $R/logs
stage=${1:-all}
timed() { local name=$1; shift; local t0=$(date +%s.%N); "$@"; echo "$name $(echo "$(date +%s.%N) - $t0" | bc) s" >> $R/logs/walltimes.txt; }

if [[ $stage == convert || $stage == all ]]; then
  [[ -d $M ]] || timed dequantize python scripts/dequantize_smollm2.py
  [[ -d $R/conv-faithful ]] || timed convert-faithful ssacli convert $M --scorer ssa:init=faithful,learn=n --text $D --out $R/conv-faithful
  [[ -d $R/conv-authors ]] || timed convert-authors ssacli convert $M --scorer ssa:preset=authors --text $D --out $R/conv-authors
  [[ -d $R/conv-softmax ]] || timed convert-softmax ssacli convert $M --scorer softmax --text $D --out $R/conv-softmax
fi
if [[ $stage == finetune || $stage == all ]]; then
  arm() {  # name source extra-options
    local name=$1 src=$2; shift 2
    if python -c "import json,sys; r=json.load(open('$R/$name/ssacli.json'))['training']; sys.exit(r['step']!=r['steps'])" 2>/dev/null; then return; fi
    timed ft-$name ssacli finetune $R/$src --out $R/$name --resume $FT "$@" > $R/logs/$name.log 2>&1
  }
  arm ft-faithful-anneal-all conv-faithful --anneal-n 1.5 --train all
  arm ft-authors-all conv-authors --train all
  arm ft-faithful-anneal-scorer conv-faithful --anneal-n 1.5 --train scorer
  arm ft-authors-scorer conv-authors --train scorer
  arm ft-softmax-all conv-softmax --train all   # the equal-budget softmax control
fi
if [[ $stage == report || $stage == all ]]; then
  REP="--text-id $WT/test.txt --text-ood ../shared/data/tinyshakespeare.txt --pairs ../shared/data/blimp"
  REP="$REP --pairs-limit ${PAIRS:-50} --max-tokens ${TOKENS:-8192}"
  for a in conv-faithful ft-faithful-anneal-all ft-authors-all ft-faithful-anneal-scorer ft-authors-scorer ft-softmax-all conv-authors; do
    [[ -d $R/$a ]] || continue
    [[ -f $R/report-$a.json ]] || timed report-$a ssacli report $M $R/$a $REP --json $R/report-$a.json --html $R/report-$a.html > $R/logs/report-$a.log 2>&1
  done
fi
