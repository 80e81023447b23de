"""Which execution path runs an attention call: one pure function, :func:`choose_backend`, deciding
from the plain facts of one call (:class:`Call`), so that a CUDA decision is tested without a GPU.

Two paths per device, for SSA attention (ssacli.kernels.fused.ssa_attention) and for diagnose's fused
statistics (ssacli.kernels.online_stats.softmax_statistics): the eager reference (the scorer's own
forward over the full weights, in ssacli.attention) and one fast path, the native C kernels on the
CPU (ssacli.kernels.native) and Triton on CUDA (ssacli.kernels.triton_ssa for SSA attention,
ssacli.kernels.triton_stats for the statistics); the torch block math only where neither can run.
flex_attention stays on CUDA until a GPU run measures it against Triton.
docs/performance.md "Which path runs where" lists every path with the benchmark row that keeps it.

The paths (:data:`PATHS`):

* ``"eager"``: the reference, chosen where the call needs the weights (``output_attentions``, a
  softcap, a scorer without a fused kernel: the attention layer says why) or where asked;
* ``"one-loop"`` and ``"native-blocks"``: the native kernels, as one FlashAttention loop per call on
  torch's sgemm, or as the block math between torch's matmuls where the one loop cannot serve the
  call (a mask tensor, dropout, a probe or transform of diagnose's, no usable sgemm);
* ``"torch-blocks"``: the block loop with the torch block math, where nothing native or Triton runs
  (float64, no C compiler, the CUDA calls Triton does not take: for the statistics a probe on the
  logits, a softcap, a position bias, a learned sink or keyless term, a transform other than SSA's);
* ``"flex"``: torch's flex_attention with an SSA ``score_mod`` (CUDA, SSA attention only);
* ``"triton"``: ssacli's Triton kernels (CUDA): SSA attention, and diagnose's statistics of plain
  softmax or SSA calls (one kernel carrying every running sum).

The one override is ``backend=`` (:data:`BACKENDS`), given to a kernel call, to a model's attention
(``ssacli.attention_backend``, ``--attention``, ``--stats``) or, where a caller says ``"auto"``, by the
environment variable ``SSACLI_BACKEND`` (:func:`requested`): ``"auto"`` the best path, ``"fused"`` a
fast path or a UsageError, ``"eager"`` the reference, or one path by name (a ValueError where it
cannot run here). A call that needs the weights takes the reference whatever names a fast path,
except under ``"fused"``, which refuses it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    import torch

PATHS = ("eager", "one-loop", "native-blocks", "torch-blocks", "flex", "triton")
BACKENDS = ("auto", "fused", *PATHS)
# What a whole model's option takes (--attention, --stats, the training configs): a path by name is
# for one kernel call (backend=) or SSACLI_BACKEND.
MODEL_BACKENDS = ("auto", "eager", "fused")
ENVIRONMENT = "SSACLI_BACKEND"


@dataclass(frozen=True)
class Call:
    """The facts of one call that :func:`choose_backend` decides on (plain values)."""

    device: str  # the query's device type: "cuda", "cpu", ...
    dtype: torch.dtype  # the query's (statistics: the compute dtype, float32 or wider)
    # "attention" (SSA attention) or "statistics" (diagnose's fused statistics)
    kind: str = "attention"
    # "kernel": which path runs this call; "model": an attention call inside a model, whose answer is
    # "eager" or "fused" (the fused kernel it calls then decides its path with its own facts)
    scope: str = "kernel"
    backend: str = "auto"  # what the caller asked for (resolved through SSACLI_BACKEND: requested())
    weights_needed: str | None = None  # why the call needs the eager reference's weights; None: it does not
    training: bool = False  # some input needs a gradient
    n_grad: bool = False  # n itself needs one (a learned n)
    dropout: float = 0.0
    window: bool = False
    head_dim: int = 64
    triton: bool = False  # the triton package can be imported
    # a mask tensor, or another term the one-loop kernels lack (statistics: not StatisticsCall.plain,
    # or queries that are not float32)
    mask: bool = False
    # what native kernels are built here (ssacli.kernels.native.kernels_here()): "one-loop" (and the
    # block pass), "blocks" (the block pass only: no usable sgemm) or "" (none)
    native: str = ""
    # statistics: the Triton statistics kernel computes every term of the call
    # (ssacli.kernels.stats_call.triton_lacks finds nothing)
    triton_stats: bool = False


def requested(backend: str) -> str:
    """``backend``, or where it is "auto" the SSACLI_BACKEND environment variable (read here only;
    unset: "auto"); a UsageError for a value not in BACKENDS."""
    if backend != "auto":
        return backend
    setting = os.environ.get(ENVIRONMENT, "auto") or "auto"
    if setting not in BACKENDS:
        raise UsageError(f"{ENVIRONMENT} takes {', '.join(BACKENDS)}, got {setting!r}")
    return setting


@cache
def triton_installed() -> bool:
    """Whether the optional ``triton`` package is there (found, not imported: importing costs ~1 s)."""
    return importlib.util.find_spec("triton") is not None


def triton_fits(call: Call) -> bool:
    """Whether the Triton kernels take this call: float16/bfloat16/float32, no window or dropout, and
    the head sizes tuned for (D ≤ 128; larger ones run with ``backend="triton"`` but untuned)."""
    import torch  # loaded by then; not at import: diagnose checks --stats (MODEL_BACKENDS) torch-free

    supported = call.dtype in (torch.float16, torch.bfloat16, torch.float32)
    return call.triton and supported and not call.window and call.dropout == 0.0 and call.head_dim <= 128


def triton_stats_fits(call: Call) -> bool:
    """Whether the Triton statistics kernel takes this statistics call: triton there, every term one
    it computes, float16/bfloat16/float32 math and the head sizes it is laid out for (D ≤ 128, as the
    attention kernels); windows and masks it takes."""
    import torch  # loaded by then (triton_fits says why not at import)

    supported = call.dtype in (torch.float16, torch.bfloat16, torch.float32)
    return call.triton and call.triton_stats and supported and call.head_dim <= 128


def native_fits(device: str, dtype: torch.dtype) -> bool:
    """Whether the native kernels compute a call of this device and dtype: CPU, float32 math (float16
    and bfloat16 inputs are computed in float32 too)."""
    import torch

    return device == "cpu" and torch.promote_types(dtype, torch.float32) == torch.float32


def _refused(call: Call) -> str:
    what = "fused statistics are" if call.kind == "statistics" else "fused attention is"
    fix = "use --stats auto or eager" if call.kind == "statistics" else "use the auto or eager backend"
    return f"{what} not possible here: {call.weights_needed}; {fix}"


def choose_backend(call: Call) -> str:
    """The path that runs ``call`` (one of PATHS; with scope "model", "eager" or "fused"). A pure
    function of the call's facts; docs/performance.md "Which path runs where" gives each rule's row."""
    if call.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {call.backend!r}")
    if call.weights_needed is not None:
        if call.backend == "fused":
            raise UsageError(_refused(call))
        return "eager"
    if call.backend == "eager" or call.scope == "model":
        return "eager" if call.backend == "eager" else "fused"
    native = call.native if native_fits(call.device, call.dtype) else ""
    if call.backend == "flex" and call.kind == "statistics":
        raise ValueError("backend='flex' runs SSA attention, not diagnose's statistics")
    if call.backend in ("torch-blocks", "flex", "triton"):
        # forced (tests, benchmarks), and they check their own limits; nothing else is looked up, so a
        # forced call traces under torch.compile(fullgraph=True)
        return call.backend
    if call.backend == "one-loop" and (native != "one-loop" or call.mask or call.dropout > 0.0):
        raise ValueError(
            "backend='one-loop' runs on the CPU in float32 where the native kernels and torch's sgemm are "
            "available, without a mask tensor or dropout: use 'native-blocks', 'torch-blocks' or 'auto'"
        )
    if call.backend == "native-blocks" and not native:
        raise ValueError("backend='native-blocks' needs the native kernels (CPU, float32, built): use 'auto'")
    if call.backend in ("one-loop", "native-blocks"):
        return call.backend
    if call.device == "cuda" and call.kind == "attention" and call.dropout == 0.0:
        if not call.n_grad:
            return "flex"  # n fixed or inference: flex's backward pays no atomics for n
        return "triton" if triton_fits(call) else "torch-blocks"  # flex adds n's gradient per score
    if call.device == "cuda" and call.kind == "statistics":
        return "triton" if triton_stats_fits(call) else "torch-blocks"
    if native == "one-loop" and not call.mask and call.dropout == 0.0:
        return "one-loop"
    return "native-blocks" if native else "torch-blocks"


__all__ = [
    "BACKENDS", "Call", "ENVIRONMENT", "MODEL_BACKENDS", "PATHS", "choose_backend", "native_fits",
    "requested", "triton_fits", "triton_installed", "triton_stats_fits",
]  # fmt: skip
