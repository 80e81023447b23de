"""Which execution path runs a fused call: one function, :func:`choose_backend`, for SSA attention
(ssacli.kernels.fused.ssa_attention) and for diagnose's fused statistics
(ssacli.kernels.online_stats.softmax_statistics), deciding from the plain facts of one call
(:class:`Call`), so that a CUDA decision is tested without a GPU.

The paths (docs/performance.md "Which path runs where" lists each with the row that keeps it):

* ``"one-loop"``: the native CPU kernels as one FlashAttention loop per call over tiles formed by
  torch's own sgemm (SSA forward and backward, the plain-softmax statistics);
* ``"native-blocks"``: the block loop with the native block math between torch's matmuls (a mask
  tensor, dropout, other scorers and probes, a torch without a usable sgemm);
* ``"torch-blocks"``: the block loop with the torch block math, compiled for large training calls
  (ssacli.kernels.fused.should_compile; the statistics' own rule in online_stats); where nothing
  native serves the call (CUDA, float64, no C compiler, ``SSACLI_NATIVE=0``);
* ``"flex"``: torch's flex_attention with an SSA ``score_mod`` (SSA attention only);
* ``"triton"``: ssacli's Triton kernels (SSA attention on CUDA only).

The eager reference (the scorer's own forward over the full weights) is chosen above these, by the
attention backend (ssacli.attention.backend: ``--attention``) and the statistics mode (``--stats``).
A caller's ``backend=`` is a fact of the call too: :func:`choose_backend` returns a forced path as it
is (refusing one that cannot run here), resolves ``"blocked"`` to the blocked kernel's best form, and
``"auto"`` to everything.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache

import torch

from . import native
from .compiled import compile_enabled

BACKENDS = ("auto", "blocked", "one-loop", "native-blocks", "torch-blocks", "flex", "triton")
# Where the native pass cannot serve a call, CPU inference calls of at least this many logits
# (batch × heads × queries × keys) go through compiled flex_attention: the crossover of
# `python benchmarks/inference.py` with the torch block math (docs/performance.md "Inference on the CPU").
FLEX_CPU_MIN_LOGITS = 2**19
# Why compiling flex on the CPU failed in this process, if it did (a fact about this process's
# compiler: every later call then keeps the blocked kernel).
FLEX_CPU_FAILED: list[str] = []


@dataclass(frozen=True)
class Call:
    """The facts of one call that :func:`choose_backend` decides on (plain values)."""

    device: str  # the query's device type: "cuda", "cpu", ...
    dtype: torch.dtype  # the query's (statistics: the compute dtype, float32 or wider)
    logits: int  # batch × heads × queries × keys
    training: bool = False  # some input needs a gradient
    n_grad: bool = False  # n itself needs one (a learned n)
    dropout: float = 0.0
    masked: bool = False  # a mask tensor, a window or q_len != k_len (flex on the CPU takes none)
    window: bool = False
    head_dim: int = 64
    triton: bool = False  # the triton package can be imported
    # a mask tensor, or another term the one-loop kernels lack (statistics: not StatisticsCall.plain,
    # or queries that are not float32)
    mask: bool = False
    backend: str = "auto"  # what the caller asked for (ssa_attention's backend=)
    # what native kernels run here: "one-loop" (and the block pass), "blocks" (the block pass only:
    # no usable sgemm, or native.disabled(flash_only=True)) or "" (none); None: ask ssacli.kernels.native
    native: str | None = None


@cache
def triton_installed() -> bool:
    """Whether the optional ``triton`` package is there (found, not imported: importing costs ~1 s)."""
    return importlib.util.find_spec("triton") is not None


def triton_fits(call: Call) -> bool:
    """Whether the Triton kernels take this call: float16/bfloat16/float32, no window or dropout, and
    the head sizes tuned for (D ≤ 128; larger ones run with ``backend="triton"`` but untuned)."""
    supported = call.dtype in (torch.float16, torch.bfloat16, torch.float32)
    return call.triton and supported and not call.window and call.dropout == 0.0 and call.head_dim <= 128


def native_here(call: Call) -> str:
    """The native kernels that can serve this call: CPU, float32 block math (float16 and bfloat16
    inputs are computed in float32 too), built and not switched off (ssacli.kernels.native.disabled)."""
    if call.device != "cpu" or torch.promote_types(call.dtype, torch.float32) != torch.float32:
        return ""
    if call.native is not None:
        return call.native
    if native.flash_available():
        return "one-loop"
    return "blocks" if native.available() else ""


def choose_backend(call: Call) -> str:
    """The path that runs ``call`` (one of BACKENDS but "auto" and "blocked"); each rule's reason
    is the docs/performance.md row (or GPU log) that shows its path winning there."""
    if call.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {call.backend!r}")
    if call.backend in ("torch-blocks", "flex", "triton"):
        # forced (tests, benchmarks), and they check their own limits; nothing else is looked up, so a
        # forced call traces under torch.compile(fullgraph=True)
        return call.backend
    here = native_here(call)
    if call.backend == "one-loop" and (here != "one-loop" or call.mask or call.dropout > 0.0):
        raise ValueError(
            "backend='one-loop' runs on the CPU in float32 where the native kernels and torch's sgemm are "
            "available, without a mask tensor or dropout: use 'native-blocks', 'torch-blocks' or 'auto'"
        )
    if call.backend == "native-blocks" and not here:
        raise ValueError("backend='native-blocks' needs the native kernels (CPU, float32, built): use 'auto'")
    if call.backend in ("one-loop", "native-blocks"):
        return call.backend
    if call.backend == "auto" and call.dropout == 0.0 and call.device == "cuda":
        # n fixed (the recipe's distillation) or inference: flex. Its forward is 4.2-5.5x SDPA where
        # eager SSA is 5.9-39x (docs/results/gpu-h200/gpu_bench-2.log, the `table` rows; performance.md
        # "Run 2 on an NVIDIA H200"); n fixed pays none of the atomics below (its training not timed yet).
        if not call.n_grad:
            return "flex"
        # A learned n: flex's backward adds n's gradient with one atomic per score (pytorch#137452):
        # 11.9-187x SDPA forward+backward where eager SSA is 2.9-13x (the same rows). The Triton kernels
        # sum dn per block (issue 40; their GPU speed is not measured yet); the torch block math where
        # they do not fit (no GPU row: kept as the memory-linear kernel the CPU needs anyway).
        return "triton" if triton_fits(call) else "torch-blocks"
    # The blocked kernel's forms (and everything on the CPU).
    if here == "one-loop" and not call.mask and call.dropout == 0.0:
        # SSA: 0.91-1.53x SDPA against the block loop's 1.34-2.48x at every shape (performance.md
        # "Time and memory", the `ssa fused` and `ssa block loop` columns); statistics: 1.49x / 1.50x
        # SDPA against the row pass's 2.13x / 2.06x ("Fused statistics", the 1024 and 4096 rows).
        return "one-loop"
    if here:
        # The native block math: 1.34-2.48x SDPA against eager SSA's 6.2-43x (the same "Time and
        # memory" rows); statistics 2.06-2.13x against compiled torch ops' 3.75-4.26x ("Fused statistics").
        return "native-blocks"
    plain = not call.training and not call.masked and call.dropout == 0.0
    if call.backend == "auto" and call.device == "cpu" and plain:
        # Nothing native here: compiled flex for no-grad self-attention of FLEX_CPU_MIN_LOGITS logits
        # or more: 2.0-4.2x SDPA where the torch block math is 3.3-5.8x ("Inference on the CPU", the
        # `flex` and `torch blocks` columns: flex faster in 13 of the 14 rows from 2**19 logits). Flex
        # has no CPU backward, and torch 2.13 cannot compile it for the CPU with a window or mask
        # tensor ("cur_kvSplitSize0 was not declared").
        if call.logits >= FLEX_CPU_MIN_LOGITS and compile_enabled() and not FLEX_CPU_FAILED:
            return "flex"
    # The torch block math: 1.06-4.52x eager SSA's training rate from 64 tokens ("Where the fused kernel
    # starts to pay when training", measured before the native kernels); statistics: torch ops 2.0-5.0x
    # faster than eager statistics ("Fused statistics"). Compiled for large training calls (the crossover).
    return "torch-blocks"


__all__ = [
    "BACKENDS", "Call", "FLEX_CPU_FAILED", "FLEX_CPU_MIN_LOGITS", "choose_backend", "native_here",
    "triton_fits", "triton_installed",
]  # fmt: skip
