"""The native kernels' other code paths, built on this machine with $SSACLI_NATIVE_CFLAGS: AVX-512 where
the CPU has it, without AVX-512 (the AVX2 reductions, the portable e^x and log1p) and without AVX
(plain vector extensions). Each runs in a fresh process with a temporary cache of its own and MKL
limited to the same instruction set ($MKL_ENABLE_INSTRUCTIONS; torch's own kernels by
$ATEN_CPU_CAPABILITY), so torch's sgemm, which forms the one-loop kernels' logit tiles, blocks and
rounds as it would on such a CPU; each is checked against a
float64 computation from the same float32 inputs, within what float32 rounding can do in any
summation order (tests/helpers/float_reference.py), not against torch's own float32 tiles, which
round differently on other CPUs and BLAS builds. On the builds that differ from this machine's own,
`ssacli check --init`'s gates for the bundled LM, measured on this machine's build, must pass: another
instruction set is a harmless change (issue 51; tests/check/test_gates.py has the other rows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ssacli.kernels import native

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, math, sys, torch
sys.path.insert(0, sys.argv[1])
from ssacli.kernels import native
from ssacli.kernels.fused import ssa_attention
from ssacli.kernels.online_stats import softmax_statistics
from ssacli.kernels.stats_call import StatisticsCall
from tests.helpers.float_reference import excess, plain_softmax_reference
from tests.kernels.test_fused import naive_ssa

assert native.available(), "the native kernels did not build"
gen = torch.Generator().manual_seed(3)
report = {"flash": native.one_loop_available()}

# SSA forward and backward, GQA, causal with a KV-cache offset, ragged blocks, logits past exp's range,
# against the naive formula in float64 (outputs and gradients relative to their largest entry)
q = torch.randn(2, 4, 37, 16, generator=gen) * 4
k, v = torch.randn(2, 2, 45, 16, generator=gen) * 4, torch.randn(2, 2, 45, 16, generator=gen)
b, n = torch.tensor([0.8, 1.0, 1.3, 0.6]), torch.tensor([1.5, 6.0, 2.0, 0.5])
up = torch.randn(2, 4, 37, 16, generator=gen)
leaves = [t.clone().requires_grad_() for t in (q, k, v, b, n)]
out = ssa_attention(*leaves, scale=0.25, causal=True, block_rows=8, block_keys=16, backend="auto")
got = [out.detach(), *torch.autograd.grad(out, leaves, up)]
leaves = [t.double().requires_grad_() for t in (q, k, v, b, n)]
out = naive_ssa(*leaves, scale=0.25, causal=True)
want = [out.detach(), *torch.autograd.grad(out, leaves, up.double())]
report["ssa"] = max(((a - b).abs().max() / b.abs().max().clamp_min(1)).item() for a, b in zip(got, want))

# diagnose's statistics, the row pass (on torch.matmul's logits) and the one loop (on sgemm tiles)
qs, ks, vs = (torch.randn(1, 3, 70, 8, generator=gen) * 3 for _ in range(3))
shown = torch.ones(70, 70, dtype=torch.bool).tril()
want, bound = plain_softmax_reference(qs, ks, vs, 0.5, shown, None, top_k=5)
call = StatisticsCall(scaling=0.5, causal=True, top_k=5)
# the row pass, on torch.matmul's logits
row_pass = softmax_statistics(qs, ks, vs, call, block_rows=9, block_keys=23, backend="native-blocks")
runs = {"row_pass": row_pass}
if native.one_loop_available():
    runs["one_loop"] = softmax_statistics(qs, ks, vs, call, block_rows=9, block_keys=23)
fields = ("max", "total", "spread", "top", "first", "logit_sq", "logit_n")
for name, (out, got) in runs.items():
    gaps = [excess(out, want["out"], bound["out"])]
    gaps += [excess(getattr(got, f), want[f], bound[f]) for f in fields]
    report[name] = max(gaps)  # <= 0: every value within its bound

# check --init's gates, measured in the parent on this machine's own build, checked on this build
if len(sys.argv) > 2:
    from ssacli.check.settings import check_settings

    checked = check_settings("builtin:wikitext-softmax", config=sys.argv[2]).run()
    report["gates"] = [o.message for o in checked.outcomes if not o.passed]
print(json.dumps(report))
"""

# The build flags of each path, and the MKL instruction set and torch CPU capability of a CPU that
# has only that path (benchmarks/instruction_sets.py times them).
PATHS = {
    "avx512": ("", "AVX512", "avx512"),
    "avx2": ("-mno-avx512f", "AVX2", "avx2"),
    "no-avx": ("-mno-avx", "SSE4_2", "default"),
}


def _has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def gates(tmp_path_factory) -> Path:
    """`ssacli check --init`'s ssacli.toml for the bundled LM, measured on this machine's own build."""
    import ssacli

    path = tmp_path_factory.mktemp("gates") / "ssacli.toml"
    ssacli.write_check_config("builtin:wikitext-softmax", path)
    return path


@pytest.mark.parametrize("path", list(PATHS))
def test_every_instruction_set_computes_the_float64_reference(tmp_path, path, request):
    if native.library() is None:
        pytest.skip("the native kernel could not be built here (no C compiler)")
    if "x86" not in os.uname().machine and "amd64" not in os.uname().machine.lower():
        pytest.skip("x86 flags")
    if path == "avx512" and not _has_avx512():
        pytest.skip("this CPU has no AVX-512")
    flags, mkl, aten = PATHS[path]
    env = {**os.environ, "SSACLI_NATIVE_CFLAGS": flags, "SSACLI_CACHE": str(tmp_path)}
    env.update(MKL_ENABLE_INSTRUCTIONS=mkl, ATEN_CPU_CAPABILITY=aten)
    env.pop("SSACLI_BACKEND", None)
    own = path == "avx512" or (path == "avx2" and not _has_avx512())  # this machine's own build
    extra = [] if own else [str(request.getfixturevalue("gates"))]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(tmp_path.rglob("native-*.so")), "no build of its own"
    assert report["ssa"] < 1e-4, report  # outputs and gradients, as tests/kernels/test_fused.py's OUT_TOL
    assert report["row_pass"] <= 0, report
    if report["flash"]:
        assert report["one_loop"] <= 0, report
    if extra:
        assert report["gates"] == [], report  # no gate fails on another instruction set
