#!/usr/bin/env bash
# Every GPU goal of ssacli on one CUDA GPU (H100 or H200), sized for a short slot: by default six steps in
# at most 8 minutes (TOTAL, 480 s). Each step is time-limited and prints each row as it finishes, so a
# step cut by its limit still reports; a failure is printed and the next step still runs. The whole
# output is also written to a log under docs/results/ (LOG), to commit.
#
#     bash scripts/gpu_bench.sh                 # from the repository root, on the GPU machine
#     DRY_RUN=1 bash scripts/gpu_bench.sh       # every step at a tiny size on this CPU (the Triton
#                                               # interpreter): each step reached, its budget printed
#     STEPS=core,finetune bash scripts/gpu_bench.sh   # some steps; the older ones are listed below
#
# Default steps, most important first (device seconds: the budget of each on the GPU):
#   smoke         (40) torch, CUDA and triton versions, the APIs used, the Triton SSA kernels compiled,
#                      ssa_attention(backend="triton") against float64 on two shapes, gradients too
#                      (benchmarks/triton_ssa.py --sections smoke).
#   stats-parity  (50) diagnose's statistics on every GPU path (the Triton statistics kernel and the
#                      torch block math) against float64 on two shapes, every RowStatistics field; SSA
#                      attention's forward on every GPU path (triton, flex, torch-blocks) on the same
#                      shapes (benchmarks/triton_stats.py --sections parity).
#   stats-time    (70) one attention call's statistics (Triton kernel, softmax and SSA; the torch block
#                      math up to 8k) against SDPA's forward pinned to FlashAttention (fp32: the
#                      memory-efficient kernel; FlashAttention takes no fp32) at T = 4k, 8k, 32k, bf16
#                      and fp32, with peak memory; goals: <= 1.5x time, <= 2x memory in bf16
#                      (benchmarks/triton_stats.py --sections time).
#   core         (150) issue 40's goal grid of the Triton SSA kernels: B*T = 32,768 tokens, D = 128 and
#                      64, T in {1k, 4k, 16k}, bf16, causal, forward and forward+backward, against the
#                      same kernels as softmax, SDPA pinned to FlashAttention and SDPA's default
#                      (benchmarks/triton_ssa.py --sections core).
#   finetune      (70) one AdamW step of a SmolLM2-135M-config model at T = 8,192, SSA (n learned) against
#                      softmax, goal <= 1.3x (benchmarks/triton_ssa.py --sections finetune).
#   stats         (90) diagnose itself, fused statistics (now the Triton kernel) and eager ones against a
#                      plain SDPA forward of the benchmark Llama at 4k, 8k, 32k tokens, bf16 and fp32,
#                      peak memory; then, if time is left, every metric fused vs eager on seven
#                      families (benchmarks/gpu_stats.py --sections time,exact).
# Older steps (STEPS=...): rest (flex's atomic cost, the non-causal grid, a block-size sweep),
# stats-long, length-1b, check, table (see benchmarks/README.md).
# Exit status 0 only if every step run passed.
#
# Environment: $PYTHON (default .venv/bin/python if present, else python3) with ssacli's dependencies
# and a CUDA build of torch; ssacli is imported from this checkout. STEP_TIMEOUT (a factor) scales
# every step's limit (default 1; DRY_RUN: 12, for the interpreter on a shared CPU); TOTAL (seconds)
# caps them all together (default 480; DRY_RUN: 3600); LOG the log file (default
# docs/results/gpu/gpu_bench-<UTC time>.log, DRY_RUN: docs/results/gpu/cpu-dry-run.log; "-": none).
set -uo pipefail

DRY_RUN=${DRY_RUN:-}
if [[ -n "$DRY_RUN" ]]; then
    DEVICE=cpu QUICK=1 SCALE=${STEP_TIMEOUT:-12} TOTAL=${TOTAL:-3600}
    LOG=${LOG:-docs/results/gpu/cpu-dry-run.log}
else
    DEVICE=${DEVICE:-cuda} QUICK=${QUICK:-} SCALE=${STEP_TIMEOUT:-1} TOTAL=${TOTAL:-480}
    LOG=${LOG:-docs/results/gpu/gpu_bench-$(date -u +%Y-%m-%dT%H%M).log}
fi
STEPS=${STEPS:-smoke,stats-parity,stats-time,core,finetune,stats}
DEADLINE=$((SECONDS + TOTAL))
if [[ ! -f pyproject.toml || ! -d ssacli ]]; then
    echo "FAIL: run this from the ssacli repository root (scripts/gpu_bench.sh)" >&2
    exit 2
fi
if [[ "$LOG" != "-" ]]; then
    mkdir -p "$(dirname "$LOG")"
    exec > >(tee "$LOG") 2>&1
fi
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0
summary=()
declare -A BUDGET=([smoke]=40 [stats-parity]=50 [stats-time]=70 [core]=150 [finetune]=70 [stats]=90
    [rest]=170 [stats-long]=200 [length-1b]=150 [check]=120 [table]=120)
step() {  # step NAME COMMAND...: run if NAME is in STEPS, within its budget (x SCALE); PASS/FAIL
    local name=$1 budget=${BUDGET[$1]}
    shift
    [[ ",$STEPS," == *",$name,"* ]] || return 0
    local limit
    limit=$(awk -v a="$budget" -v b="$SCALE" -v left=$((DEADLINE - SECONDS)) \
        'BEGIN { x = a * b; if (x > left) x = left; printf "%d", x }')
    if ((limit <= 0)); then
        echo "FAIL: $name not run (TOTAL=$TOTAL s spent)"
        summary+=("$(printf '%-13s %6s %6s %6s  %s' "$name" "$budget" 0 - 'NOT RUN (out of time)')")
        failed=$((failed + 1))
        return 0
    fi
    printf '\n=== %s (device budget %s s; limit here %s s) ===\n' "$name" "$budget" "$limit"
    local began=$SECONDS status
    if timeout --kill-after=10 "$limit" "$@"; then status=PASS; else status="FAIL (exit $?)"; fi
    echo "$status: $name ($((SECONDS - began)) s)"
    [[ $status == PASS ]] || failed=$((failed + 1))
    summary+=("$(printf '%-13s %6s %6s %6s  %s' "$name" "$budget" "$limit" $((SECONDS - began)) "$status")")
}

echo "gpu_bench $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')," \
    "steps $STEPS, TOTAL $TOTAL s${DRY_RUN:+, DRY RUN on the CPU (tiny sizes, the Triton interpreter)}"
"$PYTHON" -c "
import platform, sys, torch, transformers
print('python', platform.python_version(), 'torch', torch.__version__, 'CUDA', torch.version.cuda,
      'transformers', transformers.__version__)
try:
    import triton
    print('triton', triton.__version__)
except ImportError:
    print('triton MISSING')
if '$DEVICE' == 'cuda' and not torch.cuda.is_available():
    sys.exit('no CUDA device: this script is for a GPU machine (DRY_RUN=1 runs it on the CPU)')
print('device', torch.cuda.get_device_name() if '$DEVICE' == 'cuda' else 'cpu')
" || { echo "FAIL: no usable device; nothing else was run"; exit 1; }
printf 'plan (device seconds): '
for name in ${STEPS//,/ }; do printf '%s %s  ' "$name" "${BUDGET[$name]:-?}"; done
echo

quick=() long=(--long-length 32768) slice=() lengths=(--lengths 4096,8192,32768 --eager-max 4096)
one_b=(--start 8192 --longest 131072 --level-seconds 30) table=(--lengths 1024,4096 --repeats 5)
if [[ -n "$QUICK" ]]; then
    quick=(--quick) long=() lengths=() one_b=() table=(--lengths 64,128 --repeats 1)
fi
[[ -f runs/smollm2-slice/ids.json ]] && slice=(--long-weights runs/smollm2-slice)
triton=("$PYTHON" benchmarks/triton_ssa.py --device "$DEVICE")
stats=("$PYTHON" benchmarks/triton_stats.py --device "$DEVICE")
if [[ -n "$QUICK" ]]; then
    triton+=(--quick --repeats 1 --warmup 0)
    stats+=(--quick --repeats 1 --warmup 0)
fi
scaled() { awk -v a="$1" -v b="$SCALE" 'BEGIN { printf "%d", a * b }'; }  # an in-step budget
step smoke "${triton[@]}" --sections smoke
step stats-parity "${stats[@]}" --sections parity --budget "$(scaled 40)"
step stats-time "${stats[@]}" --sections time --budget "$(scaled 60)"
step core "${triton[@]}" --sections core --budget "$(scaled 135)"
step finetune "${triton[@]}" --sections finetune --budget "$(scaled 60)"
step stats "$PYTHON" benchmarks/gpu_stats.py --device "$DEVICE" --sections time,exact \
    "${lengths[@]}" --repeats 2 "${quick[@]}"
step rest "${triton[@]}" --sections flex,non-causal,sweep --budget "$(scaled 150)"
step stats-long "$PYTHON" benchmarks/gpu_stats.py --device "$DEVICE" --sections long \
    "${long[@]}" "${slice[@]}" "${quick[@]}"
step length-1b "$PYTHON" benchmarks/long_context.py --device "$DEVICE" --budget-gb 24 \
    "${one_b[@]}" "${quick[@]}"
step check "$PYTHON" benchmarks/attention.py --check --device "$DEVICE"
step table "$PYTHON" benchmarks/attention.py --device "$DEVICE" --quick "${table[@]}" --eager-max-gb 8

printf '\n%-13s %6s %6s %6s  %s\n' step budget limit used status
printf '%s\n' "${summary[@]}"
printf '%s in %s s%s\n' "$([[ $failed == 0 ]] && echo 'ALL PASSED' || echo "$failed step(s) FAILED")" \
    "$SECONDS" "${LOG:+; log: $LOG}"
exit $((failed > 0))
