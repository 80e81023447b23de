"""The native kernels' other code paths, built on this machine with $SSACLI_NATIVE_CFLAGS: without
AVX-512 (the AVX2 reductions, the portable e^x and log1p) and without AVX (plain vector extensions),
each checked against the torch block math in a fresh process (a build per flag set, in a temporary
cache). The default build's path is checked by the other kernel tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ssacli.kernels import native

SCRIPT = r"""
import json, math, torch
from ssacli.kernels import native
from ssacli.kernels.fused import ssa_attention
from ssacli.kernels.online_stats import plain_softmax_statistics, softmax_statistics

assert native.available(), "the native kernels did not build"
gen = torch.Generator().manual_seed(3)
report = {"flash": native.flash_available()}

# SSA forward and backward, GQA, causal with a KV-cache offset, ragged blocks, logits past exp's range
q = torch.randn(2, 4, 37, 16, generator=gen) * 4
k, v = torch.randn(2, 2, 45, 16, generator=gen) * 4, torch.randn(2, 2, 45, 16, generator=gen)
b, n = torch.tensor([0.8, 1.0, 1.3, 0.6]), torch.tensor([1.5, 6.0, 2.0, 0.5])
up = torch.randn(2, 4, 37, 16, generator=gen)
runs = []
for off in (False, True):
    leaves = [t.clone().requires_grad_() for t in (q, k, v, b, n)]
    if off:
        with native.disabled():
            out = ssa_attention(*leaves, causal=True, block_rows=8, block_keys=16, backend="blocked")
            grads = torch.autograd.grad(out, leaves, up)
    else:
        out = ssa_attention(*leaves, causal=True, block_rows=8, block_keys=16, backend="blocked")
        grads = torch.autograd.grad(out, leaves, up)
    runs.append([out.detach(), *grads])
report["ssa"] = max(((a - b).abs().max() / b.abs().max().clamp_min(1)).item() for a, b in zip(*runs))

# diagnose's statistics: the one loop and the row pass against the torch path
qs, ks, vs = (torch.randn(1, 3, 70, 8, generator=gen) * 3 for _ in range(3))
shown = torch.ones(70, 70, dtype=torch.bool).tril()
count = shown.sum(-1).reshape(1, 1, 70)
args = dict(
    logits=lambda r, c: torch.matmul(qs[:, :, r], ks[:, :, c].transpose(-1, -2)).mul_(0.5),
    visible=lambda r, c: shown[r, c][None, None], transform=lambda x, r: x, count=count,
    key_span=lambda r: [0, 70], top_k=5, block_rows=9, block_keys=23, compile=False,
)
want_out, want = softmax_statistics(vs, 70, native_pass=False, **args)
rows_out, rows = softmax_statistics(vs, 70, native_pass=True, **args)
flash_out, flash = plain_softmax_statistics(qs, ks, vs, 0.5, causal=True, window=None, count=count,
                                            block_rows=9, block_keys=23)
fields = ("max", "total", "spread", "top", "first", "logit_sq", "logit_n")
def relative(a, b):
    same = (a == b) | (a.isnan() & b.isnan())  # -inf where a row sees fewer keys than the top-k
    return torch.where(same, 0.0, (a - b).abs() / b.abs().clamp_min(1)).max().item()
for name, (out, got) in {"row_pass": (rows_out, rows), "one_loop": (flash_out, flash)}.items():
    errors = [relative(getattr(got, f), getattr(want, f)) for f in fields]
    report[name] = max([relative(out, want_out), *errors])
print(json.dumps(report))
"""


@pytest.mark.parametrize("flags", ["-mno-avx512f", "-mno-avx"], ids=["avx2", "no-avx"])
def test_other_instruction_sets_compute_the_same(tmp_path, flags):
    if native.library() is None:
        pytest.skip("the native kernel could not be built here (no C compiler)")
    if "x86" not in os.uname().machine and "amd64" not in os.uname().machine.lower():
        pytest.skip("x86 flags")
    env = {**os.environ, "SSACLI_NATIVE_CFLAGS": flags, "SSACLI_CACHE": str(tmp_path)}
    env.pop("SSACLI_COMPILE", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(tmp_path.rglob("native-*.so")), "no build of its own"
    assert report["ssa"] < 1e-4, report  # outputs and gradients, as tests/kernels/test_fused.py's OUT_TOL
    assert report["row_pass"] < 1e-6 and report["one_loop"] < 1e-6, report
    assert report["flash"] == native.flash_available()
