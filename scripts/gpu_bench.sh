#!/usr/bin/env bash
# Fused SSA attention and diagnose's fused statistics on one CUDA GPU: exactness first, then time
# and memory. Each step is time-limited; a failure is printed and the next step still runs.
#
#     bash scripts/gpu_bench.sh                       # from the repository root, every step
#     STEPS=stats-long,length-1b bash scripts/gpu_bench.sh   # some steps
#     QUICK=1 bash scripts/gpu_bench.sh               # every step at a tiny size (also on a CPU: DEVICE=cpu)
#
# Steps (STEPS, comma-separated; default all, in this order):
#   stats-long  python benchmarks/gpu_stats.py --sections long: diagnose's fused statistics against its
#               eager statistics on 32,768 tokens, float32 and bfloat16, probes that drive rows to
#               collapse; on SmolLM2-135M-Instruct's real first layers over real text when
#               runs/smollm2-slice exists (python scripts/smollm2_slice.py makes it), else on a
#               random-init model of SmolLM2's configuration.
#   length-1b   python benchmarks/long_context.py: the length probe on a 1B-class random-init Llama,
#               doubling from 8,192 tokens within a 24 GB budget (model included).
#   stats       python benchmarks/gpu_stats.py --sections exact,time: every metric fused vs eager on
#               seven families and dtypes; one probe level against an SDPA forward at 1,024-8,192
#               tokens (goals: <= 1.5x SDPA at 4,096, peak <= 2x SDPA's at 8,192).
#   check       python benchmarks/attention.py --check: the fused SSA kernels (flex_attention and the
#               blocked kernel) against the eager scorer, outputs and the gradients of q, k, v, b, n.
#   table       python benchmarks/attention.py: B = 1, T in {1,024, 4,096}, causal and not, fwd and
#               fwd+bwd, bf16, ratios to SDPA (goals <= 1.3x fwd, <= 1.8x fwd+bwd at T = 1,024).
# Exit status 0 only if every step run passed.
#
# Environment: $PYTHON (default .venv/bin/python if present, else python3) with ssacli's dependencies
# and a CUDA build of torch; ssacli is imported from this checkout. STEP_TIMEOUT (seconds) scales
# every step's limit (default 1: the limits below).
set -uo pipefail

STEPS=${STEPS:-stats-long,length-1b,stats,check,table}
SCALE=${STEP_TIMEOUT:-1}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
if [[ ! -f pyproject.toml || ! -d ssacli ]]; then
    echo "FAIL: run this from the ssacli repository root (scripts/gpu_bench.sh)" >&2
    exit 2
fi
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0
step() {  # step NAME SECONDS COMMAND...: run if NAME is in STEPS, with a time limit; PASS/FAIL
    local name=$1 limit=$2
    shift 2
    [[ ",$STEPS," == *",$name,"* ]] || return 0
    limit=$(awk -v a="$limit" -v b="$SCALE" 'BEGIN { printf "%d", a * b }')
    printf '\n=== %s (limit %s s) ===\n' "$name" "$limit"
    local began=$SECONDS
    if timeout --kill-after=10 "$limit" "$@"; then
        echo "PASS: $name ($((SECONDS - began)) s)"
    else
        echo "FAIL: $name (exit $?, $((SECONDS - began)) s)"
        failed=$((failed + 1))
    fi
}

"$PYTHON" -c "
import sys, torch
print('torch', torch.__version__, 'CUDA', torch.version.cuda)
if '$DEVICE' == 'cuda' and not torch.cuda.is_available():
    sys.exit('no CUDA device: this script is for a GPU machine (DEVICE=cpu runs it on the CPU)')
print('device', torch.cuda.get_device_name() if '$DEVICE' == 'cuda' else 'cpu')
" || { echo "FAIL: no usable device; nothing else was run"; exit 1; }

quick=() long=(--long-length 32768) slice=() lengths=(--lengths 1024,4096,8192 --eager-max 4096)
one_b=(--start 8192 --longest 131072 --level-seconds 30) table=(--lengths 1024,4096 --repeats 5)
if [[ -n "$QUICK" ]]; then
    quick=(--quick) long=() lengths=() one_b=() table=(--lengths 64,128 --repeats 1)
fi
[[ -f runs/smollm2-slice/ids.json ]] && slice=(--long-weights runs/smollm2-slice)
step stats-long 200 "$PYTHON" benchmarks/gpu_stats.py --device "$DEVICE" --sections long \
    "${long[@]}" "${slice[@]}" "${quick[@]}"
step length-1b 150 "$PYTHON" benchmarks/long_context.py --device "$DEVICE" --budget-gb 24 \
    "${one_b[@]}" "${quick[@]}"
step stats 150 "$PYTHON" benchmarks/gpu_stats.py --device "$DEVICE" --sections exact,time \
    "${lengths[@]}" --repeats 2 "${quick[@]}"
step check 120 "$PYTHON" benchmarks/attention.py --check --device "$DEVICE"
step table 120 "$PYTHON" benchmarks/attention.py --device "$DEVICE" --quick "${table[@]}" --eager-max-gb 8
printf '\n%s\n' "$([[ $failed == 0 ]] && echo 'ALL PASSED' || echo "$failed step(s) FAILED")"
exit $((failed > 0))
