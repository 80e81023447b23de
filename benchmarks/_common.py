"""Helpers the benchmarks share: interleaved timing and peak memory of one call in a fresh process.

Peak memory on the CPU: the child process reads its RSS (/proc/self/status VmRSS), resets the
kernel's high-water mark (writes 5 to /proc/self/clear_refs; ru_maxrss where that is refused), runs
the call, and reports VmHWM minus that RSS. Children run with MALLOC_MMAP_THRESHOLD_=131072 (each
tensor over 128 KiB is its own mapping, returned when freed) so the peak follows live tensors, not
glibc's cache.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Every time of each function (seconds, one per round), timed in rounds (one call of each per
    round) so that a slow spell of the machine hits every candidate alike. One untimed warm-up call
    each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def interleaved_best(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best time of each function over :func:`interleaved_times`' rounds."""
    return {name: min(times) for name, times in interleaved_times(fns, repeats).items()}


def status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (and ru_maxrss) to the current RSS
        return True
    except OSError:
        return False


def measure_peak(call: Callable[[], object]) -> dict:
    """Run ``call`` once in this process: peak RSS over the RSS before it, in MB, and seconds."""
    before = status_kb("VmRSS")
    reset = reset_peak()
    start = time.perf_counter()
    kept = call()  # noqa: F841  (whatever the call returns stays alive until the peak is read)
    seconds = time.perf_counter() - start
    peak = status_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mb": (peak - before) / 1024, "reset": reset, "seconds": seconds}


def run_child(arguments: list[str], script: str, default_malloc: bool = False, timeout: int = 900):
    """Run ``script`` with ``arguments`` in a fresh Python; its last stdout line is a JSON object."""
    env = dict(os.environ)
    if not default_malloc:  # every tensor over 128 KiB is its own mapping, unmapped when freed
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    done = subprocess.run(
        [sys.executable, script, *arguments], capture_output=True, text=True, timeout=timeout, env=env
    )
    if done.returncode != 0:
        print(f"  [{' '.join(arguments)} failed: {done.stderr.strip().splitlines()[-1:]}]")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])
