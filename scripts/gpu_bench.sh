#!/usr/bin/env bash
# SSA attention on one CUDA GPU, sized for a short GPU slot: by default three steps in at most 6 minutes
# (TOTAL, 360 s), the first a 30-second smoke, so a slot of 15 minutes leaves room for a rerun. Each
# step is time-limited and prints each configuration as it finishes, so a step cut by its limit still
# reports; a failure is printed and the next step still runs.
#
#     bash scripts/gpu_bench.sh 2>&1 | tee gpu_bench.log   # from the repository root: the default steps
#     STEPS=check,table bash scripts/gpu_bench.sh         # other steps (the older ones below)
#     QUICK=1 DEVICE=cpu bash scripts/gpu_bench.sh       # every default step at a tiny size, on a CPU
#                                                        # (the Triton interpreter; about a minute)
#
# Default steps (benchmarks/triton_ssa.py, issue 40; needs triton, bundled with CUDA builds of torch):
#   smoke  (40 s) torch, CUDA and triton versions, the APIs used, the Triton kernels compiled, and
#                 ssa_attention(backend="triton") against float64 on two shapes (bf16 GQA causal
#                 padded; fp32 MQA decoding): output and the gradients of q, k, v, b, n.
#   core  (150 s) the goal grid, causal: B·T = 32,768 tokens, H = 16 at D = 128 and H = 32 at D = 64,
#                 T in {1k, 4k, 16k}, bf16, forward and forward+backward; SSA-Triton, softmax-Triton
#                 (the same kernels, transform off), SDPA pinned to FlashAttention and SDPA's default;
#                 then the goals: SSA-Triton / softmax-Triton <= 1.3x fwd at D = 128, <= 1.6x at D = 64,
#                 <= 1.2x / <= 1.4x fwd+bwd; softmax-Triton / FlashAttention <= 1.2x.
#   rest  (170 s) in this order, as long as its time lasts: flex (why backend="auto" sends a learned n
#                 away from flex_attention: flex with n learned and fixed, blocked, Triton), finetune
#                 (one AdamW step of a SmolLM2-135M-config model at T = 8,192, SSA <= 1.3x softmax),
#                 non-causal (the grid again), sweep (block sizes of each Triton kernel).
# Older steps (STEPS=...): stats-long, length-1b, stats (diagnose's fused statistics, see
# benchmarks/gpu_stats.py and benchmarks/long_context.py), check (the fused kernels against the eager
# scorer, benchmarks/attention.py --check), table (benchmarks/attention.py's SSA table).
# Exit status 0 only if every step run passed.
#
# Environment: $PYTHON (default .venv/bin/python if present, else python3) with ssacli's dependencies
# and a CUDA build of torch; ssacli is imported from this checkout. STEP_TIMEOUT (a factor) scales
# every step's limit (default 1: the limits above); TOTAL (seconds) caps them all together.
set -uo pipefail

STEPS=${STEPS:-smoke,core,rest}
SCALE=${STEP_TIMEOUT:-1}
TOTAL=${TOTAL:-360}
DEADLINE=$((SECONDS + TOTAL))
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
    limit=$(awk -v a="$limit" -v b="$SCALE" -v left=$((DEADLINE - SECONDS)) \
        'BEGIN { x = a * b; if (x > left) x = left; printf "%d", x }')
    if ((limit <= 0)); then
        echo "FAIL: $name not run (TOTAL=$TOTAL s spent)"
        failed=$((failed + 1))
        return 0
    fi
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
triton=("$PYTHON" benchmarks/triton_ssa.py --device "$DEVICE")
[[ -n "$QUICK" ]] && triton+=(--quick --repeats 1 --warmup 0)
step smoke 40 "${triton[@]}" --sections smoke
step core 150 "${triton[@]}" --sections core --budget 135
step rest 170 "${triton[@]}" --sections flex,finetune,non-causal,sweep --budget 150
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
