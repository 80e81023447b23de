"""Every benchmark script runs, at a tiny size, against the current package: a move or a renamed
function cannot break one unseen (benchmarks/attention.py once did: `from ssacli import fused`).
Each runs with options that shrink the work to seconds; the numbers it prints are not checked
(benchmarks time, tests do not), only that it ran to the end and printed its table.

They run in this process (the script's main() with its argv, its stdout captured, the environment,
torch's thread count and the modules it loaded restored afterwards), and so do the children some of
them start to measure a fresh process's memory (``run_child``): a fresh interpreter per script would
import torch and transformers fifteen times. One test runs a script as a user runs it
(`python benchmarks/attention.py …`, whose memory children are real processes too), so the scripts'
own start-up and ``run_child`` stay covered."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# envelope.py reads real_model.py's records: the ones docs/performance.md was made from (real
# checkpoints the suite does not have)
RECORDS = BENCHMARKS.parent / "docs" / "results" / "real-models"
ENVELOPE_ARGS = [
    *(str(RECORDS / f"{name}.json") for name in ("smollm2-135m-layers-fp32", "gemma3-270m-layers-fp32")),
    *("--levels", str(RECORDS / "gemma3-270m-levels-fp32.json")),
]
# The smoke runs check that each script runs against the package, whatever path the caller's
# SSACLI_BACKEND names (the scripts choose their candidates' paths by backend= themselves).
SMOKE_ENV = {k: v for k, v in os.environ.items() if k != "SSACLI_BACKEND"}
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))
# scripts that must run in a fresh interpreter of their own: instruction_sets builds the native
# kernels for each instruction set in child processes whose environment forces the build (and torch's
# MKL) to it; inference compiles flex_attention with a score_mod of its own, and dynamo imports the
# function's module by its name (not the name this test loads the script under)
SPAWNED = {"inference", "instruction_sets"}

# name -> (arguments that make it tiny, a string its output must contain)
TINY = {
    "attention": (["--quick", "--lengths", "64,128", "--repeats", "1"], "goals at T="),
    "attribution": (["--samples", "4", "--length", "16", "--repeats", "1", "--default-repeats", "0"],
                    "goal: one patched set per level"),
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
    # one path (a kernel build of its own), this tree only (a clone may have no main to time against);
    # x86 only, like the paths themselves
    "instruction_sets": (["--paths", "avx2", "--length", "64", "--rounds", "1", "--before", "none"],
                         "| avx2 |"),
    "long_context": (["--device", "cpu", "--quick"], "longest length that fit: 256 tokens"),
    "monitor": (["--rounds", "1", "--every", "2", "--batch", "1", "--seq", "16"], "measure/step"),
    "envelope": (ENVELOPE_ARGS, "| 70B (Llama-3-70B) |"),
    "online_stats": (
        ["--sections", "time,memory,split", "--lengths", "64", "--memory-lengths", "64", "--repeats", "1",
         "--heads", "2", "--layers", "1", "--block-size", "16", "--timeout", "120"],
        "without the position terms",
    ),
    "positions": (["--length", "96", "--repeats", "1", "--check-rows", "16"], "one-loop + positions"),
    "real_model": (["builtin:wikitext-softmax", "--probe", "embed-scale:1,2", "--samples", "2", "--length",
                    "16", "--batch-size", "2", "--repeats", "1"], '"layer_parameters"'),
    "scorer_lr": (["--steps", "20"], "scorer lr"),
    "scorers": (["--heads", "1", "--length", "32", "--dim", "8", "--repeats", "1"], "ssa"),
    "training": (["--steps", "3", "--warmup", "1", "--rounds", "1", "--data", "{text}"], "speed-up"),
    # every section under the Triton interpreter, tiny; skipped without the optional triton package
    "triton_ssa": (["--device", "cpu", "--quick", "--repeats", "1", "--warmup", "0"],
                   "PASS fp32 MQA 4/1 decode"),
    "triton_stats": (["--device", "cpu", "--quick", "--repeats", "1", "--warmup", "0"],
                     "PASS statistics triton       fp32 SSA decode"),
}  # fmt: skip
NEEDS = {"triton_ssa": "triton", "triton_stats": "triton"}  # benchmark -> the optional package it needs
# the spawned run of attention.py at one length and one candidate besides SDPA: each memory child (one
# per candidate and length) imports torch anew
AS_A_USER = {"attention": ["--quick", "--lengths", "64", "--repeats", "1", "--candidates", "ssa fused"]}


def test_every_benchmark_has_a_tiny_run():
    assert set(SCRIPTS) == set(TINY), "give each benchmark a tiny configuration in TINY"


def load_script(path: Path):
    """A benchmark script as a fresh module (its module-level code runs again, as in a new process)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call_main(path: Path, args: list[str]) -> tuple[int, str]:
    """``python PATH ARGS`` in this process: (exit code, stdout)."""
    saved_argv = sys.argv
    sys.argv = [str(path), *args]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            load_script(path).main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, int | None):
            out.write(str(done.code))
    finally:
        sys.argv = saved_argv
    return code, out.getvalue()


def child_in_process(arguments: list[str], script: str, default_malloc: bool = False, timeout: int = 900):
    """benchmarks/_common.run_child, in this process: the child's last stdout line is its JSON."""
    code, out = call_main(Path(script), arguments)
    assert code == 0, f"child {arguments} of {script} exited {code}:\n{out[-2000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def in_this_process(monkeypatch):
    """What a benchmark changes in the process (environment, threads, modules, sys.path) undone."""
    environ, threads, modules = dict(os.environ), torch.get_num_threads(), set(sys.modules)
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for key, value in SMOKE_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSACLI_BACKEND", raising=False)
    common = importlib.import_module("_common")
    monkeypatch.setattr(common, "run_child", child_in_process)
    yield
    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(threads)
    for name in set(sys.modules) - modules:  # the scripts' own helper modules (`_common`, `diagnose`, …)
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(BENCHMARKS)):
            del sys.modules[name]


@pytest.mark.parametrize("name", sorted(set(TINY) - SPAWNED))
def test_benchmark_runs_at_a_tiny_size(name, tmp_path, in_this_process, monkeypatch):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    monkeypatch.chdir(tmp_path)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    args, expected = TINY[name]
    code, out = call_main(BENCHMARKS / f"{name}.py", [a.replace("{text}", str(text)) for a in args])
    assert code == 0, out[-3000:]
    assert expected in out, out[-2000:]


@pytest.mark.parametrize("name", sorted(SPAWNED | {"attention"}))
def test_benchmark_runs_as_a_user_runs_it(name, tmp_path):
    """`python benchmarks/NAME.py …` in a fresh interpreter: the script's own start-up, and its memory
    children as real processes (attention.py's run_child)."""
    args, expected = TINY[name]
    args = AS_A_USER.get(name, args)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=SMOKE_ENV,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert expected in done.stdout, done.stdout[-2000:]


def test_training_crossover_runs_at_a_tiny_size(tmp_path, in_this_process):
    """benchmarks/training.py --crossover (the table behind --attention auto when training)."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    args = ["--crossover", "16", "--steps", "3", "--warmup", "1", "--rounds", "1", "--batch-size", "2",
            "--data", str(text)]  # fmt: skip
    code, out = call_main(BENCHMARKS / "training.py", args)
    assert code == 0, out[-3000:]
    assert "| 16 | 2 |" in out, out[-2000:]
