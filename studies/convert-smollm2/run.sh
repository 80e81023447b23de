#!/usr/bin/env bash
# The SmolLM2-135M-Instruct before/after study (docs/results/convert-smollm2.md).
# Resumable: rerun it and finished steps are skipped, an interrupted arm continues from its last
# checkpoint (--resume). Usage: bash studies/convert-smollm2/run.sh [convert|finetune|report|all]
set -uo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
R=runs/convert-smollm2
M=runs/smollm2-135m-instruct
WT=../shared/data/wikitext2
D=$WT/valid.txt                     # fine-tuning data (last tenth held out)
STEPS=${STEPS:-100}
FT="--data $D --steps $STEPS --batch-size 4 --seq-len 128 --lr 1e-4 --checkpoint-every 25 --log-every 5 --quiet"
SCORER_ONLY="--train scorer --lr 1e-2 --steps ${SCORER_STEPS:-30}"  # 30–270 scalars: a larger lr, fewer steps
mkdir -p $R/logs
stage=${1:-all}
timed() { local name=$1; shift; local t0=$(date +%s.%N); "$@" || echo "$name FAILED ($?)" >> $R/logs/walltimes.txt
          echo "$name $(echo "$(date +%s.%N) - $t0" | bc) s" >> $R/logs/walltimes.txt; }
conv() { [[ -d $R/$1 ]] || timed convert-${1#conv-} ssacli convert $M --scorer $2 --text $D --out $R/$1 > $R/logs/$1.log 2>&1; }

if [[ $stage == convert || $stage == finetune || $stage == all ]]; then
  [[ -d $M ]] || timed dequantize python scripts/dequantize_smollm2.py
  conv conv-faithful ssa:init=faithful,learn=n          # m=auto
  conv conv-authors ssa:preset=authors
  conv conv-softmax softmax
  conv conv-faithful-bn ssa:init=faithful,learn=b+n     # m=auto; b learned per head under --train scorer
fi
if [[ $stage == finetune || $stage == all ]]; then
  arm() {  # name source extra-options
    local name=$1 src=$2; shift 2
    if python -c "import json,sys; r=json.load(open('$R/$name/ssacli.json'))['training']; sys.exit(r['step']!=r['steps'])" 2>/dev/null; then return; fi
    timed $name ssacli finetune $R/$src --out $R/$name --resume $FT "$@" > $R/logs/$name.log 2>&1
  }
  arm ft-faithful-anneal-all conv-faithful --anneal-n 1.5 --train all
  arm ft-authors-all conv-authors --train all
  arm ft-authors-scorer conv-authors $SCORER_ONLY
  arm ft-faithful-bn-anneal-scorer conv-faithful-bn --anneal-n 1.5 $SCORER_ONLY
  # the equal-budget softmax control (CONTROL=1; it did not fit the 2-core budget of the study)
  [[ ${CONTROL:-0} == 1 ]] && arm ft-softmax-all conv-softmax --train all
fi
if [[ $stage == report || $stage == all ]]; then
  REP="--text-id $WT/test.txt --text-ood ../shared/data/tinyshakespeare.txt --pairs ../shared/data/blimp"
  REP="$REP --pairs-limit ${PAIRS:-50} --max-tokens ${TOKENS:-8192} --samples ${SAMPLES:-4}"
  # every probe at its default levels, but inputs at most 16× longer (1,024 tokens): the ×32…×128
  # levels of the length probe (up to 8,192 tokens through 30 eager layers) cost ~20 CPU-min each.
  for p in embed-scale outlier key-scale logit-scale dominant-key length:1,2,4,8,16 numeric; do REP="$REP --probe $p"; done
  # The first report measures BEFORE (the original) in full; the others reuse its BEFORE side.
  for a in conv-faithful ft-faithful-anneal-all ft-authors-all ft-authors-scorer ft-faithful-bn-anneal-scorer ft-softmax-all conv-authors; do
    [[ -d $R/$a ]] || continue
    if [[ $a == ft-* ]] && ! python -c "import json,sys; r=json.load(open('$R/$a/ssacli.json'))['training']; sys.exit(r['step']!=r['steps'])" 2>/dev/null; then continue; fi
    reuse=""; [[ -f $R/report-conv-faithful.json ]] && reuse="--reuse-before $R/report-conv-faithful.json"
    [[ -f $R/report-$a.json ]] || timed report-$a ssacli report $M $R/$a $REP $reuse --json $R/report-$a.json --html $R/report-$a.html > $R/logs/report-$a.log 2>&1
  done
fi
