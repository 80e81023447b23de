"""ssacli's native kernels as a library (:mod:`ssacli.kernels.native` calls its entry points): built
once, loaded and checked.

The sources are C99 with GCC/Clang vector extensions and no library but libm, compiled once per
machine (the C compiler torch.compile would use, -O3 for the host CPU) into the user's cache and
loaded only where no one else could have written it: ssacli.kernels.native_build says how;
``$SSACLI_NATIVE_CFLAGS`` adds compiler flags (a separate build). Each entry point takes one argument
struct, declared once in C and built in Python from the library's own layout table
(ssacli.kernels.native_abi). A failed build, or a library that lacks a kernel or whose structs ctypes
cannot lay out as C did, is said once, as a warning, and the callers keep their torch block math,
which computes the same things. Whether a call uses the kernels is not decided here:
ssacli.kernels.routing.choose_backend decides from the call's facts (``SSACLI_BACKEND`` and
``backend=`` among them), and the library is built only when a call may use it.
"""

from __future__ import annotations

import functools
import threading
import warnings

from . import native_abi, native_build

LOCK = threading.RLock()  # one build and one sgemm probe per process; re-entered by the probe


@functools.cache
def _load() -> native_abi.Library | None:
    """The built, loaded and checked library, or None after one RuntimeWarning saying why."""
    stage = "building"
    try:
        compiler = native_build.compiler()
        if compiler is None:
            raise RuntimeError("no C compiler found ($CC, cc, gcc or clang)")
        path = native_build.build(compiler)
        stage = "loading"
        return native_abi.Library(native_build.load(path))
    except Exception as err:  # noqa: BLE001 - any failure means "use the torch path"
        warnings.warn(
            f"ssacli: {stage} ssacli's native kernels failed ({err}); using the torch block "
            "math (same results, slower). Set SSACLI_BACKEND=torch-blocks to skip the attempt.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def library() -> native_abi.Library | None:
    """The loaded kernels, built on first use; None if the build failed, or the library lacks a kernel
    or lays out a struct in a way ctypes cannot reproduce."""
    with LOCK:
        return _load()


def available() -> bool:
    """Whether the native kernels are built and loaded here (built on first use)."""
    return library() is not None


__all__ = ["LOCK", "available", "library"]
