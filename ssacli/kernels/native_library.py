"""ssacli's native kernels as a library (:mod:`ssacli.kernels.native` calls its entry points): built
once, loaded, checked, and switched on or off.

The sources are C99 with GCC/Clang vector extensions and no library but libm, compiled once per
machine (the C compiler torch.compile would use, -O3 for the host CPU) into the user's cache and
loaded only where no one else could have written it: ssacli.kernels.native_build says how;
``$SSACLI_NATIVE_CFLAGS`` adds compiler flags (a separate build). ``SSACLI_NATIVE=0``
(:func:`native_setting`) never builds or loads them, whatever ``SSACLI_COMPILE`` says (that switch is
torch.compile's alone, ssacli.kernels.compiled). Each entry point takes one argument struct, filled
by field name, whose layout is checked against the library's at load (ssacli.kernels.native_abi). A
failed build, or a library whose structs differ from Python's, is said once, as a warning, and the
callers keep their torch block math, which computes the same things. :func:`disabled` switches the
kernels off for the current thread or asyncio task only (a context variable).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
import warnings

from . import native_abi, native_build

LOCK = threading.RLock()  # one build and one sgemm probe per process; re-entered by the probe


def native_setting() -> str:
    """The SSACLI_NATIVE environment variable, read here only: "0" never builds or loads the native
    kernels; anything else (unset: "auto") builds them at first use where a C compiler is found."""
    return "0" if os.environ.get("SSACLI_NATIVE") == "0" else "auto"


@functools.cache
def _load():
    """The built, loaded and checked library, or None after one RuntimeWarning saying why."""
    stage = "building"
    try:
        compiler = native_build.compiler()
        if compiler is None:
            raise RuntimeError("no C compiler found ($CC, cc, gcc or clang)")
        path = native_build.build(compiler)
        stage = "loading"
        lib = native_build.load(path)
        problems = native_abi.layout_problems(lib)
        if problems:
            raise RuntimeError(f"its argument structs differ from ssacli.kernels.native_abi's: {problems[0]}")
        native_abi.declare(lib)
        return lib
    except Exception as err:  # noqa: BLE001 - any failure means "use the torch path"
        warnings.warn(
            f"ssacli: {stage} ssacli's native kernels failed ({err}); using the torch block "
            "math (same results, slower). Set SSACLI_NATIVE=0 to skip the attempt.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def library():
    """The loaded kernels (a ctypes.CDLL), built on first use; None if SSACLI_NATIVE=0, or the build
    failed, or the library's argument structs differ from Python's."""
    if native_setting() == "0":
        return None
    with LOCK:
        return _load()


# "" on, "flash" the one-loop kernels off, "all" everything off: per thread and per asyncio task, so
# one caller's comparison run never switches the kernels off under another's feet.
_OFF: contextvars.ContextVar[str] = contextvars.ContextVar("ssacli_native_off", default="")


def available() -> bool:
    """Whether callers should use the native pass: built here and not switched off by :func:`disabled`."""
    return _OFF.get() != "all" and library() is not None


@contextlib.contextmanager
def disabled(flash_only: bool = False):
    """Within this block callers take their torch path (benchmarks and tests compare the two); with
    ``flash_only`` they keep the native block pass but not the one-loop kernels
    (:func:`ssacli.kernels.native.flash_available` is False), so the block loop's torch matmuls run as
    without torch's sgemm. The switch is a context variable: it holds in this thread or asyncio task
    only (and in tasks it creates, which copy its context); an inner block never switches on what an
    outer one switched off."""
    token = _OFF.set("flash" if flash_only and _OFF.get() != "all" else "all")
    try:
        yield
    finally:
        _OFF.reset(token)


def one_loop_switched_off() -> bool:
    """Whether :func:`disabled` switched the one-loop kernels off here (``flash_only`` or all)."""
    return _OFF.get() != ""


__all__ = ["LOCK", "available", "disabled", "library", "native_setting", "one_loop_switched_off"]
