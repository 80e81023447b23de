"""The native kernels on each x86-64 instruction set they have a code path for, on this one machine.
Not part of the test suite, and not a gate: a measured figure (docs/performance.md).

    python benchmarks/instruction_sets.py              # B=1, H=8, D=64, T=1024, causal, fp32
    python benchmarks/instruction_sets.py --repeats 9 --length 2048
    python benchmarks/instruction_sets.py --paths avx2       # one path

Each path runs in a child process that sees a CPU with only that instruction set, as far as this
machine can pretend: ssacli's kernels built with $SSACLI_NATIVE_CFLAGS (the default -march=native;
"-mno-avx512f" for the AVX2 path; "-mno-avx" for plain vector extensions) into a cache of their own,
torch's sgemm (MKL) limited by $MKL_ENABLE_INSTRUCTIONS, and torch's own kernels (SDPA among them)
by $ATEN_CPU_CAPABILITY. Within a child every candidate is timed in interleaved rounds against SDPA
under the same limits, so each row's ratios are side by side; the rows' SDPA times show what the
instruction set costs torch itself. Candidates:

* ssa fwd: ssacli.ssa_attention (the native one-loop forward) over SDPA's forward (softmax);
* ssa fwd+bwd: the same with a backward into q, k, v, b, n, over SDPA's forward+backward;
* stats: diagnose's plain-softmax statistics in one native loop
  (ssacli.kernels.online_stats.softmax_statistics of a plain call) over SDPA's forward.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PATHS = {  # name: (SSACLI_NATIVE_CFLAGS, MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY)
    "avx512": ("", "AVX512", "avx512"),
    "avx2": ("-mno-avx512f", "AVX2", "avx2"),
    "no-avx": ("-mno-avx", "SSE4_2", "default"),
}

CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from _common import interleaved_best
import torch.nn.functional as F
from ssacli.kernels import native
from ssacli.kernels.fused import ssa_attention
from ssacli.kernels.online_stats import softmax_statistics
from ssacli.kernels.stats_call import StatisticsCall

length, repeats = int(sys.argv[2]), int(sys.argv[3])
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 8, length, 64, generator=gen) for _ in range(3))
b, n = torch.full((8,), 0.5), torch.full((8,), 4.0)
leaves = [t.clone().requires_grad_() for t in (q, k, v, b, n)]
sdpa_leaves = [t.clone().requires_grad_() for t in (q, k, v)]

def sdpa():
    with torch.no_grad():
        F.scaled_dot_product_attention(q, k, v, is_causal=True)

def sdpa_train():
    F.scaled_dot_product_attention(*sdpa_leaves, is_causal=True).sum().backward()

def ssa():
    with torch.no_grad():
        ssa_attention(q, k, v, b, n, causal=True)

def ssa_train():
    ssa_attention(*leaves, causal=True).sum().backward()

def stats():
    softmax_statistics(q, k, v, StatisticsCall(scaling=0.125, causal=True))

fns = dict(sdpa=sdpa, sdpa_train=sdpa_train, ssa=ssa, ssa_train=ssa_train)
if native.one_loop_available():  # the one-loop statistics need the native kernels and torch's sgemm
    fns["stats"] = stats
best = interleaved_best(fns, repeats)
print(json.dumps({"flash": native.one_loop_available(), "capability": torch.backends.cpu.get_cpu_capability(),
                  **best}))
"""


def has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated, of " + ", ".join(PATHS))
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    here = str(Path(__file__).resolve().parent)
    threads = os.environ.get("OMP_NUM_THREADS", "all")
    print(f"B=1 H=8 D=64 T={args.length} causal fp32, torch threads {threads}; best of {args.repeats} "
          "interleaved rounds; x = time / SDPA's")  # fmt: skip
    print("| path | torch capability | one loop | SDPA fwd ms | ssa fwd | SDPA fwd+bwd ms | ssa fwd+bwd "
          "| stats |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in paths:
        flags, mkl, aten = PATHS[name]
        if name == "avx512" and not has_avx512():
            print(f"| {name} | – | – | – | – | – | – | – |  (this CPU has no AVX-512)")
            continue
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "SSACLI_NATIVE_CFLAGS": flags, "MKL_ENABLE_INSTRUCTIONS": mkl,
                   "ATEN_CPU_CAPABILITY": aten, "SSACLI_CACHE": cache}  # fmt: skip
            env.pop("SSACLI_BACKEND", None)
            got = None
            for repeats in (1, args.repeats):  # the first run builds this path's kernels, uncounted
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, here, str(args.length), str(repeats)],
                    env=env, capture_output=True, text=True, timeout=1800,
                )  # fmt: skip
                if done.returncode != 0:
                    print(f"{name}: failed: {done.stderr.strip().splitlines()[-1:]}")
                    break
                got = json.loads(done.stdout.strip().splitlines()[-1])
        if got is None:
            continue
        fwd, train = got["sdpa"], got["sdpa_train"]
        stats = f"{got['stats'] / fwd:.2f}x" if "stats" in got else "–"
        print(
            f"| {name} | {got['capability']} | {'yes' if got['flash'] else 'no'} | {fwd * 1e3:.2f} | "
            f"{got['ssa'] / fwd:.2f}x | {train * 1e3:.2f} | {got['ssa_train'] / train:.2f}x | {stats} |"
        )


if __name__ == "__main__":
    main()
