"""Every benchmark script runs, at a tiny size, against the current package: a move or a renamed
function cannot break one unseen (benchmarks/attention.py once did: `from ssacli import fused`).
Each runs in a fresh interpreter as a user runs it (`python benchmarks/NAME.py …`), with options
that shrink the work to seconds; the numbers it prints are not checked (benchmarks time, tests do
not), only that it ran to the end and printed its table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# The smoke runs check that each script runs against the package, not the compiled block math
# (tests/kernels/test_fused.py compares it to the reference): a cold torch.compile costs 15-25 s per
# script that trains (attention.py 48 s -> 21 s, training.py 25 s -> 7.5 s on 2 cores).
SMOKE_ENV = {**os.environ, "SSACLI_COMPILE": "0"}
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))

# name -> (arguments that make it tiny, a string its output must contain)
TINY = {
    "attention": (["--quick", "--lengths", "64,128", "--repeats", "1"], "goals at T="),
    "diagnose": (
        [
            "--layers", "1", "--heads", "2", "--samples", "1", "--batch-size", "1", "--time-length", "32",
            "--block-size", "16", "--repeats", "1", "--lengths", "64", "--full-maps-max", "64",
            "--length-models", "llama", "--length-longest", "128", "--length-layers", "1",
            "--max-positions", "128", "--child-timeout", "120",
        ],
        "Llama",
    ),
    "decode_speed": (["--models", "bundled", "--batch", "1", "--new-tokens", "3", "--repeats", "1"],
                     "converted (ssacli)"),
    "gpu_stats": (["--device", "cpu", "--quick"], "exactness: every comparison within 1e-6"),
    "inference": (["--quick", "--repeats", "1"], "auto on the CPU: the native kernels where"),
    # one path (a kernel build of its own); x86 only, like the paths themselves
    "instruction_sets": (["--paths", "avx2", "--length", "64", "--repeats", "1"], "| avx2 |"),
    "long_context": (["--device", "cpu", "--quick"], "longest length that fit: 256 tokens"),
    "monitor": (["--rounds", "1", "--every", "2", "--batch", "1", "--seq", "16"], "measure/step"),
    "online_stats": (
        ["--lengths", "64", "--memory-lengths", "64", "--repeats", "1", "--heads", "2", "--layers", "1",
         "--block-size", "16", "--timeout", "120"],
        "goal",
    ),
    "positions": (["--length", "96", "--repeats", "1", "--check-rows", "16"], "one-loop + positions"),
    "scorer_lr": (["--steps", "20"], "scorer lr"),
    "scorers": (["--heads", "1", "--length", "32", "--dim", "8", "--repeats", "1"], "ssa"),
    "training": (["--steps", "3", "--warmup", "1", "--rounds", "1", "--data", "{text}"], "speed-up"),
    # every section under the Triton interpreter, tiny; skipped without the optional triton package
    "triton_ssa": (["--device", "cpu", "--quick", "--repeats", "1", "--warmup", "0"],
                   "PASS fp32 MQA 4/1 decode"),
}  # fmt: skip
NEEDS = {"triton_ssa": "triton"}  # benchmark -> the optional package it needs


def test_every_benchmark_has_a_tiny_run():
    assert set(SCRIPTS) == set(TINY), "give each benchmark a tiny configuration in TINY"


@pytest.mark.parametrize("name", sorted(TINY))
def test_benchmark_runs_at_a_tiny_size(name, tmp_path):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    args, expected = TINY[name]
    args = [a.replace("{text}", str(text)) for a in args]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=SMOKE_ENV,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert expected in done.stdout, done.stdout[-2000:]


def test_training_crossover_runs_at_a_tiny_size(tmp_path):
    """benchmarks/training.py --crossover (the table behind --attention auto when training)."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    args = ["--crossover", "16", "--steps", "3", "--warmup", "1", "--rounds", "1", "--batch-size", "2",
            "--data", str(text)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "training.py"), *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=SMOKE_ENV,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "| 16 | 2 |" in done.stdout, done.stdout[-2000:]
