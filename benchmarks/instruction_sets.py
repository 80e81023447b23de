"""The native kernels on each x86-64 instruction set they have a code path for, on this one machine,
this tree's kernels against another revision's ("before"). Not part of the test suite, and not a gate:
a measured figure (docs/performance.md).

    python benchmarks/instruction_sets.py              # B=1, H=8, D=64, T=1024, causal, fp32; before = main
    python benchmarks/instruction_sets.py --rounds 9 --length 4096
    python benchmarks/instruction_sets.py --paths avx2 --before none     # one path, this tree only

Each path runs in child processes that see a CPU with only that instruction set, as far as this
machine can pretend: ssacli's kernels built with $SSACLI_NATIVE_CFLAGS (the default -march=native;
"-mno-avx512f" for the AVX2 path; "-mno-avx" for plain vector extensions) into a cache of their own,
torch's sgemm (MKL) limited by $MKL_ENABLE_INSTRUCTIONS, and torch's own kernels (SDPA among them)
by $ATEN_CPU_CAPABILITY. Per path two children stay up side by side: one imports this tree's ssacli,
the other the ``--before`` revision's (``git archive`` of its ssacli/ into a temporary folder; "none":
no before). The parent times them in interleaved rounds: each round runs one child's round, then the
other's (which goes first alternates), and within a child's round each candidate right after an SDPA
call of its own, so a slow spell of the shared machine hits before and after, kernel and SDPA alike.
Each figure is the median of the rounds' ratios (candidate / the SDPA call beside it) with their
spread (min–max), and the 1-minute load average read at each round (median, max) beside it.
Candidates:

* ssa fwd: ssacli.ssa_attention (the native one-loop forward) over SDPA's forward (softmax);
* ssa fwd+bwd: the same with a backward into q, k, v, b, n, over SDPA's forward+backward;
* stats: diagnose's plain-softmax statistics in one native loop
  (ssacli.kernels.online_stats.softmax_statistics of a plain call) over SDPA's forward.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PATHS = {  # name: (SSACLI_NATIVE_CFLAGS, MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY)
    "avx512": ("", "AVX512", "avx512"),
    "avx2": ("-mno-avx512f", "AVX2", "avx2"),
    "no-avx": ("-mno-avx", "SSE4_2", "default"),
}
# issue 54's goals for the AVX2 path (the AVX-512 path's ratios), each over SDPA's own time
GOALS = {"ssa": 1.3, "ssa_train": 1.8, "stats": 1.5}
REPO = Path(__file__).resolve().parent.parent

# A child: imports ssacli from argv[1], warms every candidate up (building its kernels, uncounted),
# prints "ready", then per line "round" on stdin prints one round's times as JSON; EOF ends it.
CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
import torch.nn.functional as F
from ssacli.kernels import native
from ssacli.kernels.fused import ssa_attention
from ssacli.kernels.online_stats import softmax_statistics
from ssacli.kernels.stats_call import StatisticsCall

length = int(sys.argv[2])
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

# (candidate, the SDPA call timed right before it)
pairs = [("ssa", ssa, sdpa), ("ssa_train", ssa_train, sdpa_train)]
if native.one_loop_available():  # the one-loop statistics need the native kernels and torch's sgemm
    pairs.append(("stats", stats, sdpa))
for _, fn, ref in pairs:
    ref(), fn()

def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

print(json.dumps({"ready": True, "flash": native.one_loop_available(),
                  "capability": torch.backends.cpu.get_cpu_capability()}), flush=True)
for line in sys.stdin:
    got = {}
    for name, fn, ref in pairs:
        got["sdpa_" + name] = timed(ref)
        got[name] = timed(fn)
    print(json.dumps(got), flush=True)
"""


def has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def load_average() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def export_revision(revision: str, folder: Path) -> None:
    """ssacli/ as it is at ``revision`` of this repository, written into ``folder``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, "ssacli"],
                             capture_output=True, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")


class Child:
    """One child process (see CHILD) over the ssacli found in ``source``, with the path's limits."""

    def __init__(self, source: Path, length: int, env: dict[str, str]):
        self.errors = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nothing blocks on it
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(source), str(length)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
        )  # fmt: skip
        self.info = self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            self.errors.seek(0)
            raise RuntimeError(f"child failed: {self.errors.read().strip().splitlines()[-1:]}")
        return json.loads(line)

    def round(self) -> dict:
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.errors.close()


def summary(rounds: list[dict], name: str) -> str:
    """Median and spread of a candidate's ratio over its SDPA call, across rounds."""
    if not rounds or name not in rounds[0]:
        return "–"
    ratios = [r[name] / r["sdpa_" + name] for r in rounds]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f})"


def row(path: str, build: str, info: dict, rounds: list[dict]) -> str:
    fwd = statistics.median(r["sdpa_ssa"] for r in rounds)
    train = statistics.median(r["sdpa_ssa_train"] for r in rounds)
    loads = [r["load"] for r in rounds]
    return (
        f"| {path} | {build} | {info['capability']} | {'yes' if info['flash'] else 'no'} | {fwd * 1e3:.2f} | "
        f"{summary(rounds, 'ssa')} | {train * 1e3:.2f} | {summary(rounds, 'ssa_train')} | "
        f"{summary(rounds, 'stats')} | {statistics.median(loads):.2f} ({max(loads):.2f}) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated, of " + ", ".join(PATHS))
    parser.add_argument("--before", default="main", help="git revision whose kernels to time too; none: not")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    threads = os.environ.get("OMP_NUM_THREADS", "all")
    with tempfile.TemporaryDirectory() as scratch:
        builds = {"this tree": REPO}
        if args.before != "none":
            before = Path(scratch) / "before"
            try:
                export_revision(args.before, before)
            except (OSError, subprocess.CalledProcessError) as err:
                parser.error(f"--before {args.before}: cannot export its ssacli/ ({err}); pass --before none")
            builds = {f"before ({args.before})": before, **builds}
        print(f"{cpu_name()}; B=1 H=8 D=64 T={args.length} causal fp32, torch threads {threads}; "
              f"{args.rounds} interleaved rounds; x = time / the SDPA call beside it, median (min–max); "
              f"load = 1-minute load average over the rounds, median (max)")  # fmt: skip
        print(f"goals on AVX2: ssa fwd <= {GOALS['ssa']}x, ssa fwd+bwd <= {GOALS['ssa_train']}x, "
              f"stats <= {GOALS['stats']}x")  # fmt: skip
        print("| path | kernels | torch capability | one loop | SDPA fwd ms | ssa fwd | SDPA fwd+bwd ms | "
              "ssa fwd+bwd | stats | load |")  # fmt: skip
        print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
        for name in paths:
            if name == "avx512" and not has_avx512():
                print(f"| {name} | – | – | – | – | – | – | – | – | – |  (this CPU has no AVX-512)")
                continue
            flags, mkl, aten = PATHS[name]
            children: dict[str, Child] = {}
            try:
                for build, source in builds.items():
                    env = {**os.environ, "SSACLI_NATIVE_CFLAGS": flags, "MKL_ENABLE_INSTRUCTIONS": mkl,
                           "ATEN_CPU_CAPABILITY": aten,
                           "SSACLI_CACHE": str(Path(scratch) / f"cache-{name}-{len(children)}")}  # fmt: skip
                    env.pop("SSACLI_BACKEND", None)
                    children[build] = Child(source, args.length, env)
                rounds: dict[str, list[dict]] = {build: [] for build in children}
                order = list(children)
                for i in range(args.rounds):
                    for build in order if i % 2 == 0 else order[::-1]:
                        load = load_average()
                        rounds[build].append({**children[build].round(), "load": load})
                for build, child in children.items():
                    print(row(name, build, child.info, rounds[build]))
            except RuntimeError as err:
                print(f"{name}: {err}")
            finally:
                for child in children.values():
                    child.close()


if __name__ == "__main__":
    main()
