"""The native kernels' elementary functions (ssacli/kernels/native_math.h: log1p and log2(1 + z) for
z >= 0, e^x and 2^x for x <= 0) on each code path this machine can build, against torch's float64
over their whole input range: 0, denormals, the table logarithms' interval edges, powers of two,
random values, the float range's ends, infinities and NaN. Each path's functions are compiled into a
probe library of their own with the native build's flags and the path's extra ones, so every
approximation is checked where it is used: the AVX-512 tables, the AVX2 tables and exp2, the
portable Cephes log1p and Cody-Waite e^x (tests/kernels/test_native_portable.py checks the kernels
built from them end to end).

The bounds, in float32's unit of rounding u = 2^-24: a logarithm within 3u·(1 + |log|) (rounding
1 + z costs u absolutely, rounding the result u relatively, and the polynomial less), e^x within 4u
relatively wherever it is a normal float, 2^x within 4u·(1 + |x| ln 2) (the portable 2^x is e^x of
x·ln 2 rounded, which costs what rounding x would); below that 0, never a denormal."""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from ssacli.kernels import native_build
from tests.kernels.test_native_portable import PATHS, _has_avx512

CC = native_build.compiler()
HEADER_DIR = Path(native_build.__file__).parent
UNIT = 2.0**-24
FLT_MAX = float(np.finfo(np.float32).max)
EXP_FLOOR = float(np.float32(-87.3))  # exp_nonpositive's: below it, 0
EXP2_FLOOR = -126.0  # exp2_nonpositive's (the portable one, e^(x ln 2), stops at -125.95)

PROBE = r"""
#include "native_math.h"
/* which: 0 log1p, 1 log2(1 + z), 2 e^x, 3 2^x, 4 e^(t - 1), 5 2^(t2 - 1) for t = ssa_transform(x, 1.5)
 * and t2 = ssa_transform2(x, 1.5): a weight of the forward kernels */
void probe(int which, const float *x, float *out, int64_t n) {
    for (int64_t c = 0; c < n; c += W) {
        vf v = c + W <= n ? load(x, c) : load_tail(x, c, n), r;
        switch (which) {
        case 0: r = log1p_nonnegative(v); break;
        case 1: r = log2_1p_nonnegative(v); break;
        case 2: r = exp_nonpositive(v); break;
        case 3: r = exp2_nonpositive(v); break;
        case 4: r = exp_nonpositive(ssa_transform(v, splat(1.5f)) - 1.0f); break;
        default: r = exp2_nonpositive(ssa_transform2(v, splat(1.5f)) - 1.0f); break;
        }
        if (c + W <= n) store(out, c, r); else store_tail(out, c, n, r);
    }
}
"""


def _paths() -> list[str]:
    if "x86" not in os.uname().machine and "amd64" not in os.uname().machine.lower():
        return ["native"]  # the machine's own build only: the x86 flags mean nothing here
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    found = ["no-avx"]
    if " avx2" in cpu:
        found.append("avx2")
    if _has_avx512():
        found.append("avx512")
    return found


@pytest.fixture(scope="module", params=_paths())
def probe(request, tmp_path_factory):
    """probe(which, array) -> array: the path's functions, compiled with the native build's flags."""
    if CC is None:
        pytest.skip("no C compiler ($CC, cc, gcc or clang)")
    extra = PATHS[request.param][0] if request.param in PATHS else ""
    folder = tmp_path_factory.mktemp(f"probe-{request.param}")
    (folder / "probe.c").write_text(PROBE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSACLI_NATIVE_CFLAGS", extra)
        flag_sets = [[f for f in flags if f != "-fopenmp"] for flags in native_build._flag_sets()]
    for flags in flag_sets:
        built = subprocess.run(
            [CC, *flags, "-shared", "-fPIC", f"-I{HEADER_DIR}", "-o", str(folder / "probe.so"),
             str(folder / "probe.c"), "-lm"],
            capture_output=True, text=True,
        )  # fmt: skip
        if built.returncode == 0:
            break
    else:
        pytest.fail(f"{request.param}: the probe did not build: {built.stderr[-2000:]}")
    lib = ctypes.CDLL(str(folder / "probe.so"))

    def run(which: int, values) -> np.ndarray:
        x = np.ascontiguousarray(values, dtype=np.float32)
        out = np.empty_like(x)
        lib.probe(ctypes.c_int(which), x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                  ctypes.c_int64(x.size))  # fmt: skip
        return out

    return run


def _nonnegative() -> np.ndarray:
    rng = np.random.default_rng(0)
    edges = np.concatenate([1 + np.arange(64) / 64, 2.0 ** np.arange(-30, 127)]).astype(np.float32)
    return np.concatenate([
        [0.0, 1e-45, 1e-40, 1.2e-38, 1e-20, 6e-8, 1e-7, FLT_MAX],
        edges, np.nextafter(edges, np.float32(0)), np.nextafter(edges, np.float32(np.inf)),
        np.logspace(-38, 38.5, 100_000), rng.random(100_000) * 8, rng.random(20_000) * 1e-3,
    ]).astype(np.float32)  # fmt: skip


def _nonpositive() -> np.ndarray:
    rng = np.random.default_rng(1)
    return -np.concatenate([
        [0.0, 1e-45, 1e-30, 1e-7, 0.5, 1.0, 87.0, 87.3, 87.4, 125.5, 126.0, 126.5, 127.0, 150.0, 1e30],
        [FLT_MAX],
        np.arange(0, 130, 0.25), np.logspace(-30, 2.2, 100_000), rng.random(100_000) * 130,
    ]).astype(np.float32)  # fmt: skip


@pytest.mark.parametrize("which, base", [(0, math.e), (1, 2.0)], ids=["log1p", "log2_1p"])
def test_logarithms_within_float32_rounding(probe, which, base):
    z = _nonnegative()
    got = torch.from_numpy(probe(which, z)).double()
    want = torch.log1p(torch.from_numpy(z).double()) / math.log(base)
    excess = (got - want).abs() / (3 * UNIT * (1 + want.abs()))
    worst = int(excess.argmax())
    assert excess.max() <= 1, f"log1p({z[worst]!r}) in base {base:.3g}: {got[worst]} against {want[worst]}"
    special = probe(which, np.array([np.inf, np.nan], np.float32))
    assert special[0] == np.inf
    assert not np.isfinite(special[1])  # NaN (AVX2) or +inf (the others): never a finite logarithm


@pytest.mark.parametrize("which, floor", [(2, EXP_FLOOR), (3, EXP2_FLOOR)], ids=["exp", "exp2"])
def test_exponentials_within_float32_rounding_and_never_denormal(probe, which, floor):
    x = _nonpositive()
    got = torch.from_numpy(probe(which, x)).double()
    xd = torch.from_numpy(x).double()
    want = torch.exp(xd) if which == 2 else torch.exp2(xd)
    normal = xd >= floor + (0.1 if which == 3 else 0.0)  # e^(x ln 2) stops just above -126
    # within 4u, or what rounding x itself would cost (the portable 2^x is e^x of x·ln 2, rounded)
    bound = 4 * UNIT * (1 + xd.abs() * math.log(2)) if which == 3 else torch.full_like(xd, 4 * UNIT)
    excess = ((got - want).abs() / want / bound)[normal]
    worst = int(excess.argmax())
    assert excess.max() <= 1, f"x = {x[normal.numpy()][worst]!r}: {got[normal][worst]}"
    assert bool((got[xd < floor] == 0).all()), "below the floor: 0"
    tiny = got[(got != 0)]
    assert bool((tiny >= np.finfo(np.float32).tiny).all()), "a denormal weight"
    special = probe(which, np.array([-np.inf, np.nan, 0.0], np.float32))
    assert special[0] == 0 and np.isnan(special[1]) and special[2] == 1


@pytest.mark.parametrize("which", [4, 5], ids=["natural", "base2"])
def test_a_nan_logit_of_either_sign_never_gets_a_finite_weight(probe, which):
    """A NaN logit's weight is NaN (or +inf, on the paths whose logarithm of NaN is +inf), which makes
    its row NaN: never 0, which would hide it."""
    nans = np.array([0x7FC00000, 0xFFC00000], np.uint32).view(np.float32)  # sign bit clear, set
    got = probe(which, np.concatenate([nans, np.array([0.0, -3.0], np.float32)]))
    assert not np.isfinite(got[0]) and not np.isfinite(got[1]), got
    shift = 1.0 if which == 4 else math.log(2)  # the probe's - 1, in its base

    def weight(y):
        return math.exp(1.5 * math.copysign(math.log1p(abs(y)), y) - shift)

    assert got[2] == pytest.approx(weight(0.0), rel=1e-6) and got[3] == pytest.approx(weight(-3.0), rel=1e-6)
