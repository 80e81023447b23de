"""Every benchmark script imports against the current package (benchmarks/attention.py once broke
unseen after a move: `from ssacli import fused`). Importing runs no benchmark: each keeps its work
under ``main()``. Run in a fresh interpreter per script, with benchmarks/ on the path as when run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py"))


def test_the_benchmarks_are_found():
    assert {"attention", "diagnose", "monitor", "online_stats", "scorer_lr", "scorers", "training"} <= set(
        SCRIPTS
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports(name):
    code = f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import {name}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
