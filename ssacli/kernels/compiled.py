"""The one switch for compiling ssacli's per-block math with torch.compile, and its one call site.

Each blocked kernel (the SSA forward and backward in ssacli.kernels.blocked, diagnose's statistics
in ssacli.kernels.online_stats) keeps the elementwise math of one block in a plain function and
registers it here under a name. :func:`run_block` calls it compiled (dynamic shapes: one compilation
serves every block width) or eager; both compute the same thing, so a compiler failure only costs
speed: it is said once, and everything goes on eager.

SSACLI_COMPILE is torch.compile's switch alone: the native C kernels (ssacli.kernels.native) have
their own, SSACLI_NATIVE.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

_EAGER: dict[str, Callable] = {}
_COMPILED: dict[str, Callable] = {}
# Why compiling failed, once it has: a fact about this process's compiler, not an override, so it is
# process-wide (every thread then stops trying); None while compiling works or was never tried.
_compile_failure: str | None = None


def register_block(name: str, fn: Callable) -> Callable:
    """Make ``fn`` callable as block kernel ``name`` (returns fn, so it can decorate)."""
    _EAGER[name] = fn
    return fn


def compile_setting() -> str:
    """The SSACLI_COMPILE environment variable, read here only: "0" never compiles the block math,
    "1" always does, anything else (unset: "auto") leaves it to the caller's rule (large calls). It
    does not touch the native kernels (SSACLI_NATIVE, ssacli.kernels.native.native_setting)."""
    setting = os.environ.get("SSACLI_COMPILE", "auto")
    return setting if setting in ("0", "1") else "auto"


def compile_enabled() -> bool:
    """Whether the block math may be compiled: not switched off (SSACLI_COMPILE=0) and not failed."""
    return compile_setting() != "0" and _compile_failure is None


def should_compile(large: bool) -> bool:
    """The default decision: SSACLI_COMPILE=0 never, =1 always, auto only for ``large`` calls (enough
    work to repay the seconds a first compilation costs)."""
    setting = compile_setting()
    return setting == "1" if setting != "auto" else large


def compiled_kernels() -> frozenset[str]:
    """The block kernels compiled so far in this process."""
    return frozenset(_COMPILED)


def run_block(name: str, compiled: bool, *args):
    """Call block kernel ``name``, compiled if ``compiled`` (tests observe the decision here). If
    compiling fails (no C++ compiler, an unsupported platform), say so once and go on eager."""
    global _compile_failure
    # A 1-row or 1-key block would be one more specialization to compile; it is cheap in eager.
    if compiled and compile_enabled() and min(args[0].shape[-2:]) > 1:
        try:
            if name not in _COMPILED:
                _COMPILED[name] = torch.compile(_EAGER[name], dynamic=True)
            return _COMPILED[name](*args)
        except Exception as err:  # noqa: BLE001 - any compiler failure means "use eager"
            _compile_failure = f"{type(err).__name__}: {err}".splitlines()[0]
            warnings.warn(
                f"ssacli: compiling ssacli's block kernels failed ({_compile_failure}); using the "
                "eager kernels (same results, slower). Set SSACLI_COMPILE=0 to skip the attempt.",
                RuntimeWarning,
                stacklevel=2,
            )
    return _EAGER[name](*args)


__all__ = [
    "compile_enabled", "compile_setting", "compiled_kernels", "register_block", "run_block",
    "should_compile",
]  # fmt: skip
