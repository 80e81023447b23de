"""The ``ssacli`` entry point in a fresh interpreter, reporting what it imported (issues 14, 36, 54)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

INPUT_LIMIT_S = 1.0  # issue 36: input checked in a second (CPU time; issue 54 holds every refusal to it)
MODEL_STACK = ("torch", "transformers")
# `python -m ssacli ARGS…`, then, at exit, on stdout: "STACK:" and the model-stack modules imported
# on the way (none: nothing after the colon), and "MODULES:" and how many modules were loaded
ENTRY = (
    "import atexit, runpy, sys\n"
    "def report():\n"
    f"    stack = [m for m in {MODEL_STACK!r} if m in sys.modules]\n"
    "    sys.stdout.write(f'\\nSTACK:{\",\".join(stack)}\\nMODULES:{len(sys.modules)}\\n')\n"
    "atexit.register(report)\n"
    "sys.argv[0] = 'ssacli'\n"
    "runpy.run_module('ssacli', run_name='__main__')\n"
)


def run_entry(argv: list[str], cwd) -> tuple[subprocess.CompletedProcess, str, list[str], int, float, float]:
    """The entry point on ``argv`` in a fresh interpreter: (the process, its stdout before the report,
    the model-stack modules it imported, how many modules it loaded, CPU seconds, wall seconds)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, *argv], capture_output=True, text=True, cwd=cwd, timeout=120
    )
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    output, _, report = done.stdout.rpartition("\nSTACK:")
    stack, _, modules = report.partition("\nMODULES:")
    assert modules.strip().isdigit(), done.stdout  # the report was written: the interpreter exited
    return done, output, [m for m in stack.split(",") if m], int(modules), cpu, wall
