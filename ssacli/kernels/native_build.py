"""Building ssacli's native kernels (ssacli.kernels.native loads them): the C sources, the compiler,
the flags and the per-machine cache; ssacli.kernels.native calls :func:`build` when a kernel is first
wanted."""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

# The C sources, compiled together into one library; the header holds what they share.
SOURCES = tuple(Path(__file__).with_name(name) for name in ("native_stats.c", "native_ssa.c"))
HEADER = Path(__file__).with_name("native_math.h")
# -fopenmp links libgomp.so.1 by its soname, which resolves to the libgomp torch has already loaded:
# the row pass then runs on torch's own thread pool instead of competing with its spinning threads.
_FLAG_SETS = (
    ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"],
    ["-O3", "-march=native", "-fno-math-errno"],  # no OpenMP (Apple clang): one thread
    ["-O3", "-fno-math-errno"],  # compilers that do not know -march=native
)


def _flag_sets() -> list[list[str]]:
    """The flag sets tried in order, each followed by $SSACLI_NATIVE_CFLAGS (e.g. "-mno-avx512f" builds
    the AVX2 code paths on an AVX-512 machine; the tests use it to check every path they can)."""
    extra = shlex.split(os.environ.get("SSACLI_NATIVE_CFLAGS", ""))
    return [[*flags, *extra] for flags in _FLAG_SETS]


def cache_dir() -> Path:
    """Where built kernels live: $SSACLI_CACHE, else $XDG_CACHE_HOME/ssacli, else ~/.cache/ssacli."""
    if os.environ.get("SSACLI_CACHE"):
        return Path(os.environ["SSACLI_CACHE"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ssacli" / "kernels"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags where Linux says them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        picked = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(dict.fromkeys(picked))
    except OSError:
        return platform.processor()


def build(compiler: str) -> Path:
    source = b"\0".join(path.read_bytes() for path in (HEADER, *SOURCES))
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        b"\0".join(s.encode() if isinstance(s, str) else s for s in
                   (source, version, platform.machine(), _cpu_signature(), repr(_flag_sets())))
    ).hexdigest()[:16]  # fmt: skip
    target = cache_dir() / f"native-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(target.parent, os.W_OK):
            raise PermissionError(f"{target.parent} is not writable")
    except OSError:
        # A read-only home: build into a private directory of this process (never a shared,
        # predictable path another user could plant a library in); it is built again next time.
        target = Path(tempfile.mkdtemp(prefix="ssacli-kernels-")) / target.name
    errors = []
    for flags in _flag_sets():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        run = subprocess.run(
            [compiler, *flags, "-shared", "-fPIC", "-o", tmp, *map(str, SOURCES), "-lm"],
            capture_output=True, text=True,
        )  # fmt: skip
        if run.returncode == 0:
            os.replace(tmp, target)
            return target
        os.unlink(tmp)
        errors.append((run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1])
    raise RuntimeError(errors[-1])
