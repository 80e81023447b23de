#!/usr/bin/env bash
# Fused SSA attention on one CUDA GPU: correctness first, then the timing table of
# benchmarks/attention.py (SSA eager and fused vs softmax eager and SDPA/FlashAttention).
#
#     bash scripts/gpu_bench.sh            # from the repository root; about 3-5 minutes on an H100
#
# Steps (each time-limited; a failure is printed and the next step still runs):
#   (a) environment: torch, CUDA, the GPU;
#   (b) python benchmarks/attention.py --check --device cuda: the fused kernels (flex_attention and
#       the blocked kernel) against the eager scorer, outputs and the gradients of q, k, v, b, n on
#       causal, padded, GQA and q_len < kv_len shapes (flex's learnable captured tensors have had
#       bugs: pytorch#145208; this is where they would show);
#   (b2) python benchmarks/gpu_stats.py --device cuda: diagnose's fused statistics against its eager
#       statistics (every metric, float32 and bfloat16, collapse-driven probes, 32,768 tokens through
#       SmolLM2-135M's configuration) and their time and peak memory against an SDPA forward;
#   (c) python benchmarks/attention.py --device cuda: B in {1, 8}, H 8, D 64, T in {256, 1024, 4096},
#       causal and not, fwd and fwd+bwd, bf16, ratios to SDPA; goals <= 1.3x fwd, <= 1.5x fwd+bwd at
#       T = 1024; peak memory from torch.cuda.max_memory_allocated.
# Exit status 0 only if every step passed.
#
# Environment: $PYTHON (default .venv/bin/python if present, else python3) with ssacli's dependencies
# and a CUDA build of torch; ssacli is imported from this checkout. STEP_TIMEOUT (default 270 s).
set -uo pipefail

STEP_TIMEOUT=${STEP_TIMEOUT:-270}
if [[ ! -f pyproject.toml || ! -d ssacli ]]; then
    echo "FAIL: run this from the ssacli repository root (scripts/gpu_bench.sh)" >&2
    exit 2
fi
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0
step() {  # step NAME COMMAND...: run with a time limit, report PASS/FAIL
    local name=$1
    shift
    printf '\n=== %s ===\n' "$name"
    if timeout --kill-after=10 "$STEP_TIMEOUT" "$@"; then
        echo "PASS: $name"
    else
        echo "FAIL: $name (exit $?)"
        failed=$((failed + 1))
    fi
}

step "environment" "$PYTHON" -c "
import sys, torch
print('torch', torch.__version__, 'CUDA', torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit('no CUDA device: this script is for a GPU machine (the CPU table: python benchmarks/attention.py)')
print('GPU', torch.cuda.get_device_name())
"
if ((failed)); then
    echo "FAIL: no usable GPU; nothing else was run"
    exit 1
fi
step "diagnose's fused statistics on the GPU (exactness, time, memory, 32k tokens)" \
    "$PYTHON" benchmarks/gpu_stats.py --device cuda
step "fused vs eager on the GPU (outputs, gradients)" "$PYTHON" benchmarks/attention.py --check --device cuda
step "timing table" "$PYTHON" benchmarks/attention.py --device cuda --repeats 10 --eager-max-gb 8
printf '\n%s\n' "$([[ $failed == 0 ]] && echo 'ALL PASSED' || echo "$failed step(s) FAILED")"
exit $((failed > 0))
