"""Where the suite's time goes, per test module: a pytest plugin, loaded only on request.

    python -m pytest -p tests.helpers.suite_profile --suite-profile=profile.json

It records, for every test module, the seconds its tests took (setup, call and teardown), the
number of processes its tests started through ``subprocess.Popen`` in the worker that ran them (not
``multiprocessing``'s spawns, which do not go through it, nor what those processes start in turn)
and the seconds pytest spent importing it at collection (what importing it added on top of the
modules imported before it). Under pytest-xdist each worker writes its own part;
``python -m tests.helpers.suite_profile profile.json`` merges them into a table, slowest module first.
Nothing here changes what a test does: it wraps Popen.__init__ to count, and calls the original.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_seconds: dict[str, float] = defaultdict(float)
_processes: dict[str, int] = defaultdict(int)
_imports: dict[str, float] = {}
_current: list[str] = [""]
_collect_started: dict[str, float] = {}


def pytest_addoption(parser):
    parser.addoption("--suite-profile", default=None, help="write the per-module profile to this JSON file")


def pytest_configure(config):
    original = subprocess.Popen.__init__

    def counting_init(self, *args, **kwargs):
        _processes[_current[0] or "(collection)"] += 1
        original(self, *args, **kwargs)

    subprocess.Popen.__init__ = counting_init


def pytest_collectstart(collector):
    if isinstance(collector, pytest.Module):
        _collect_started[collector.nodeid] = time.perf_counter()


def pytest_collectreport(report):
    started = _collect_started.pop(report.nodeid, None)
    if started is not None:
        _imports[report.nodeid] = time.perf_counter() - started


def pytest_runtest_logstart(nodeid, location):
    _current[0] = nodeid.split("::", 1)[0]


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_unconfigure(config):
    target = config.getoption("--suite-profile")
    if not target:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    part = {"seconds": dict(_seconds), "processes": dict(_processes), "imports": _imports}
    Path(f"{target}.{worker}").write_text(json.dumps(part))


def merge(target: str) -> list[tuple[str, float, int, float]]:
    seconds: dict[str, float] = defaultdict(float)
    processes: dict[str, int] = defaultdict(int)
    imports: dict[str, float] = {}
    for part in Path(target).parent.glob(Path(target).name + ".*"):
        data = json.loads(part.read_text())
        for key, value in data["seconds"].items():
            seconds[key] += value
        for key, value in data["processes"].items():
            processes[key] += value
        for key, value in data["imports"].items():  # every worker collects every module: the largest
            imports[key] = max(imports.get(key, 0.0), value)
    modules = set(seconds) | set(processes) | set(imports)
    rows = [(m, seconds.get(m, 0.0), processes.get(m, 0), imports.get(m, 0.0)) for m in modules]
    return sorted(rows, key=lambda row: -row[1])


if __name__ == "__main__":
    rows = merge(sys.argv[1])
    print("| module | test seconds | processes started | import s |\n|---|---:|---:|---:|")
    for module, secs, procs, imp in rows:
        print(f"| {module} | {secs:.1f} | {procs} | {imp:.2f} |")
    print(
        f"| **total** | {sum(r[1] for r in rows):.1f} | {sum(r[2] for r in rows)} | "
        f"{sum(r[3] for r in rows):.2f} |"
    )
