#!/usr/bin/env bash
# GPU check of ssacli: the code paths that the CPU test suite cannot exercise on a CUDA device.
#
# Run from the repository root on a machine with one CUDA GPU (about 2-5 minutes on an H200):
#
#     bash scripts/gpu_check.sh
#
# Environment: it uses $PYTHON (default: .venv/bin/python if the repo has a .venv, else python3)
# and installs nothing. That Python needs ssacli's dependencies with a CUDA build of torch
# (`pip install -e .` in it does that); ssacli itself is imported from this checkout (the working
# directory is on sys.path), so the code checked is the code here even if another copy is installed.
#
# Steps (every command time-limited, see below); a failure is printed and counted, the next runs:
#   (a) convert the bundled ICL model to SSA (faithful init) on the device; print the fidelity;
#   (b) convert + short fine-tune on the ICL task "every" on the device;
#   (c) train a gpt2-small from scratch with softmax and with SSA (same data, steps, batch, seed);
#       print tokens/s of each from the saved training record, and the SSA/softmax ratio;
#   (d) diagnose the bundled model on the device.
# A PASS/FAIL line per step and an overall one come last; the exit status is 0 only if all passed.
#
# Overrides (for a CPU smoke run: DEVICE=cpu STEPS_SCALE=0.05 bash scripts/gpu_check.sh):
#   DEVICE        cuda (default), cuda:N or cpu; cpu skips the CUDA check
#   STEPS_SCALE   multiplies every step count (default 1; at least 1 step each)
#   DATA          text for (c): a file or folder, or "generate" (default: ../shared/data/
#                 tinyshakespeare.txt when present, else generated)
#   WORK          folder for the outputs (default: a new temporary folder, kept and printed)
#   STEP_TIMEOUT  seconds per ssacli command (default 240; SIGINT first: a training run checkpoints)
#   TOTAL_TIMEOUT seconds for everything (default 540, so the script ends within 10 minutes)
#   PYTHON        the interpreter to use
set -euo pipefail

DEVICE=${DEVICE:-cuda}
STEPS_SCALE=${STEPS_SCALE:-1}
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
TOTAL_TIMEOUT=${TOTAL_TIMEOUT:-540}
DEADLINE=$((SECONDS + TOTAL_TIMEOUT))

if [[ ! -f pyproject.toml || ! -d ssacli ]]; then
    echo "FAIL: run this from the ssacli repository root (scripts/gpu_check.sh)" >&2
    exit 2
fi
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/ssacli-gpu-check.XXXXXX")}
mkdir -p "$WORK"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

log() { printf '\n=== %s ===\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
steps() { "$PYTHON" -c "import sys; print(max(1, round($1 * float(sys.argv[1]))))" "$STEPS_SCALE"; }
ssacli() {  # every ssacli call: at most STEP_TIMEOUT s, and never past the overall deadline
    local left=$((DEADLINE - SECONDS))
    ((left > 15)) || { echo "out of time: TOTAL_TIMEOUT=${TOTAL_TIMEOUT} s is used up" >&2; return 124; }
    timeout --signal=INT --kill-after=10 "$((left < STEP_TIMEOUT ? left - 10 : STEP_TIMEOUT))" \
        "$PYTHON" -m ssacli "$@"
}

# ---- environment -----------------------------------------------------------------------------------

log "environment"
command -v "$PYTHON" >/dev/null || die "no Python at '$PYTHON'; set PYTHON=/path/to/python"
"$PYTHON" - "$DEVICE" <<'EOF' || die "the environment check failed (see above)"
import sys

import torch
import transformers

import ssacli

device = sys.argv[1]
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"ssacli {ssacli.__version__}")
if device.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit(f"DEVICE={device} but torch.cuda.is_available() is False (torch built for CUDA "
                 f"{torch.version.cuda}); use a CUDA build of torch, or DEVICE=cpu for a smoke run")
    index = torch.cuda.current_device() if device == "cuda" else int(device.split(":")[1])
    props = torch.cuda.get_device_properties(index)
    print(f"{device}: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
          f"capability {props.major}.{props.minor}")
    x = torch.randn(256, 256, device=device)
    torch.testing.assert_close((x @ x.T).cpu(), x.cpu() @ x.cpu().T, rtol=1e-2, atol=1e-2)
else:
    print(f"DEVICE={device}: no CUDA check (smoke run)")
EOF
for command in convert train diagnose; do
    "$PYTHON" -m ssacli "$command" --help >/dev/null 2>&1 \
        || die "\`ssacli $command\` is missing or broken (\`$PYTHON -m ssacli $command --help\` fails)"
done
echo "outputs in $WORK; DEVICE=$DEVICE STEPS_SCALE=$STEPS_SCALE STEP_TIMEOUT=$STEP_TIMEOUT"

# ---- the steps (each runs in a subshell with set -e, so its first failing command fails it) ----------

step_convert() {
    ssacli convert builtin:every-softmax --scorer ssa:init=faithful --device "$DEVICE" --out "$WORK/a"
    "$PYTHON" - "$WORK/a" <<'EOF'
import json, math, sys
meta = json.load(open(f"{sys.argv[1]}/ssacli.json"))
fid = meta.get("fidelity") or meta.get("training", {}).get("fidelity")  # ICL folders: under training
assert fid, "ssacli.json records no fidelity"
print("fidelity:", json.dumps(fid))
values = [v for v in fid.values() if isinstance(v, float)]
assert values and all(math.isfinite(v) for v in values), "fidelity has non-finite values"
assert fid.get("kl_per_token", 0) < 1e-3, f"init=faithful should stay close to softmax: {fid}"
assert meta["scorer"].startswith("ssa"), f"saved scorer is {meta['scorer']}"
EOF
}

step_finetune() {
    ssacli convert builtin:every-softmax --scorer ssa:init=faithful --finetune --data icl:every \
        --steps "$(steps 200)" --device "$DEVICE" --out "$WORK/b"
    "$PYTHON" - "$WORK/b" "$(steps 200)" <<'EOF'
import math, sys
from ssacli.models.checkpoint import training_record
rec = training_record(sys.argv[1])
assert rec is not None, f"{sys.argv[1]} has no training record"
assert rec["step"] == int(sys.argv[2]), f"stopped at step {rec['step']} of {sys.argv[2]}"
held = rec["heldout"]
assert held and all(math.isfinite(v) for _, v in held), f"held-out losses: {held}"
print(f"fine-tuned {rec['step']} steps, {rec['tokens_per_s']:,.0f} tokens/s, held-out loss "
      f"{held[0][1]:.4g} -> {held[-1][1]:.4g}")
EOF
}

step_train() {
    local data=${DATA:-../shared/data/tinyshakespeare.txt}
    if [[ $data == generate || ! -e $data ]]; then
        data="$WORK/corpus.txt"  # 40,000 lines from a toy grammar, about 1.5 MB
        "$PYTHON" - "$data" <<'EOF'
import random, sys
rng = random.Random(0)
words = "the a cat dog bird sees chases likes small big red old runs sleeps near under river tree".split()
lines = [
    " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize() + "."
    for _ in range(40000)
]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
    fi
    echo "data: $data"
    local scorer
    for scorer in softmax ssa; do
        ssacli train --arch gpt2 --size small --scorer "$scorer" --data "$data" --steps "$(steps 100)" \
            --batch-size 32 --device "$DEVICE" --seed 0 --out "$WORK/c-$scorer"
    done
    "$PYTHON" - "$WORK/c-softmax" "$WORK/c-ssa" <<'EOF'
import math, sys
from ssacli.models.checkpoint import training_record
records = [training_record(path) for path in sys.argv[1:]]
for name, rec in zip(("softmax", "ssa"), records):
    held = rec["heldout"]
    print(f"{name:>8}: {rec['step']} steps, {rec['tokens']:,} tokens in {rec['seconds']} s, "
          f"{rec['tokens_per_s']:,.0f} tokens/s, held-out loss {held[0][1]:.3f} -> {held[-1][1]:.3f}")
    assert all(math.isfinite(v) for _, v in held), f"{name}: non-finite held-out loss {held}"
    assert held[-1][1] < held[0][1], f"{name}: training did not lower the held-out loss ({held})"
assert records[0]["tokens"] == records[1]["tokens"], "the two runs saw different numbers of tokens"
ratio = records[1]["tokens_per_s"] / records[0]["tokens_per_s"]
print(f"throughput ssa / softmax: {ratio:.2f} (tokens/s over the run, first steps included)")
EOF
}

step_diagnose() {
    ssacli diagnose --device "$DEVICE" --json "$WORK/d.json"
    "$PYTHON" -c "import json, sys; r = json.load(open(sys.argv[1])); assert r, 'empty result'" "$WORK/d.json"
}

declare -a NAMES=() RESULTS=()
run_step() {
    local name=$1 fn=$2 start rc
    log "$name"
    start=$SECONDS
    set +e
    (set -e; "$fn")
    rc=$?
    set -e
    NAMES+=("$name")
    if [[ $rc -eq 0 ]]; then
        RESULTS+=("PASS ($((SECONDS - start)) s)")
    else
        local why="exit $rc"
        if [[ $rc -eq 124 || $rc -eq 130 || $rc -eq 137 ]]; then
            why="timed out or interrupted, exit $rc"
            why+=" (STEP_TIMEOUT=$STEP_TIMEOUT, TOTAL_TIMEOUT=$TOTAL_TIMEOUT)"
        fi
        RESULTS+=("FAIL: $why, $((SECONDS - start)) s")
        printf '!!! step "%s" FAILED (%s)\n' "$name" "$why" >&2
    fi
}

run_step "(a) convert to SSA on $DEVICE" step_convert
run_step "(b) convert + fine-tune on $DEVICE" step_finetune
run_step "(c) train gpt2-small softmax vs ssa on $DEVICE" step_train
run_step "(d) diagnose on $DEVICE" step_diagnose

log "summary"
failed=0
for i in "${!NAMES[@]}"; do
    printf '%-52s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    [[ ${RESULTS[$i]} == PASS* ]] || failed=$((failed + 1))
done
if [[ $failed -eq 0 ]]; then
    echo "PASS: all ${#NAMES[@]} steps (outputs in $WORK)"
else
    echo "FAIL: $failed of ${#NAMES[@]} steps failed (outputs in $WORK)"
    exit 1
fi
