"""diagnose's statistics on CUDA in one Triton kernel (``softmax_statistics(..., backend="triton")``,
chosen by ssacli.kernels.routing.choose_backend for the CUDA calls it fits): one FlashAttention-2
forward per attention call that carries every running sum of
:class:`~ssacli.kernels.row_stats.RowStatistics` (ssacli/kernels/triton_stats_kernel.py).

**Why one kernel, not flex_attention calls.** What RowStatistics holds decided it. flex_attention
returns the log-sum-exp and, on CUDA only, the row maxima, which give m and l; a call with V = K
gives Σ p·k and so Σ p·x, but only where t is linear in k (plain softmax): SSA's
t = n·sgn(x)·log1p(b|x|) is not, so the spread of SSA rows has no flex form. The rest has none either:
the top-k of t (no reduction of flex returns it), Σ x² over the visible logits (a D × D prefix sum
per key under a causal band), t and x at key 0 and at each sample's target, and the position terms —
65 key bins and ~17 distance bins per row at diagnose's defaults (ssacli.diagnosis.positions.run_bins),
one masked flex call each. That is ~85 attention passes per call against one here, and flex's row
maxima do not run on the CPU, so none of it could be checked without a GPU; this kernel runs under
the Triton interpreter (TRITON_INTERPRET=1) on CPU tensors, where tests/kernels/test_triton_stats.py
holds every statistic against float64. RowStatistics has no per-key received mass (the received
profile is per key bin, summed over rows afterwards), so no second pass is needed.

The kernel accumulates in float32 whatever the inputs (the torch block math's float64 running sums
are what cost it 2.1× SDPA's memory in bf16: docs/performance.md "On a GPU"); this wrapper widens the
per-row results to float64 for RowStatistics. 16-bit inputs have their logits rounded as the eager
path rounds them (ssacli.kernels.stats_call) and their weights rounded to the input dtype before
p·v, as SDPA and the eager attention do; the torch block math keeps p in float32 there, so the two
fused paths' outputs differ by the bf16 rounding of p. Block sizes are pinned (no autotuning: the
interpreter has no driver); its speed on a GPU is unmeasured until scripts/gpu_bench.sh runs.
"""

from __future__ import annotations

import math

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from .row_stats import RowStatistics
from .stats_call import CallBlocks, StatisticsCall, triton_lacks
from .triton_stats_kernel import PLANES, row_stats_fwd

# Whether the kernel was built for the interpreter (TRITON_INTERPRET read when the kernel module was
# first imported).
INTERPRETED = isinstance(row_stats_fwd, InterpretedFunction)
MAX_HEAD_DIM = 256
# (BLOCK_M, BLOCK_N, num_warps, num_stages): first choices, not measured ones. BLOCK_M 64 rather than
# FlashAttention's 128: each row carries its key bins (up to 128 columns padded) and distance bins
# beside the output accumulator.
GPU_CONFIG = (64, 64, 4, 2)
# The interpreter's: unequal, so an index swapped between queries and keys cannot pass, and small
# enough that the tests' short sequences span several tiles of each.
INTERPRETER_CONFIG = (16, 32)


def _pow2(n: int) -> int:
    return max(2, triton.next_power_of_2(max(1, n)))


def _config(dim: int) -> dict:
    if INTERPRETED:
        return dict(zip(("BLOCK_M", "BLOCK_N"), INTERPRETER_CONFIG, strict=True))
    block_m, block_n, warps, stages = GPU_CONFIG
    if dim > 128:  # twice the registers per row: halve the key tile
        block_n //= 2
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}


def _per_head(value, heads: int, device) -> torch.Tensor:
    t = torch.as_tensor(value, device=device).detach().to(torch.float32).reshape(-1)
    if t.numel() not in (1, heads):
        raise ValueError(f"SSA's b and n: expected 1 or {heads} values, got {t.numel()}")
    return t.expand(heads).contiguous()


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, call: StatisticsCall) -> None:
    lacks = triton_lacks(call, query)
    if lacks is not None:
        raise ValueError(f"backend='triton' computes no statistics with {lacks}: use 'torch-blocks', 'auto'")
    dim = query.shape[-1]
    if key.shape[-1] != dim or value.shape[-1] != dim or query.shape[1] % key.shape[1]:
        shapes = [tuple(t.shape) for t in (query, key, value)]
        raise ValueError(f"bad shapes (query, key, value): {shapes}")
    if dim > MAX_HEAD_DIM:
        raise ValueError(f"backend='triton' takes head sizes up to {MAX_HEAD_DIM}, got {dim}")
    if not (query.is_cuda or INTERPRETED):
        raise ValueError("backend='triton' runs on CUDA tensors (on the CPU only under TRITON_INTERPRET=1)")


def triton_statistics(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, call: StatisticsCall
) -> tuple[torch.Tensor, RowStatistics]:
    """:func:`ssacli.kernels.online_stats.softmax_statistics` of ``call`` in the Triton kernel: query
    [b, h, q, d], key/value [b, h_kv, k, d] (GQA read in place, never repeated)."""
    _check(query, key, value, call)
    key, value = key.to(query.dtype), value.to(query.dtype)
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    blocks = CallBlocks(call, query, key, torch.float32)  # the visible counts and bins, as every path
    dev = query.device
    n_top = max(1, min(call.top_k, k_len))
    bins = call.positions
    n_kb = bins.key_bins(k_len) if bins is not None else 1
    n_db = bins.distance_bins(k_len) if bins is not None else 1
    f32 = dict(dtype=torch.float32, device=dev)
    out = torch.zeros((batch, heads, q_len, dim), dtype=query.dtype, device=dev)
    planes = torch.empty((len(PLANES), batch, heads, q_len), **f32)
    rows = batch * heads * q_len
    top = torch.empty((rows, n_top), **f32)
    key_mass = torch.empty((rows, n_kb) if bins is not None else (1, 1), **f32)
    distance_mass = torch.empty((rows, n_db) if bins is not None else (1, 1), **f32)
    mask, mask_strides = query, (0, 0, 0, 0)  # a placeholder, never read
    if blocks.mask is not None:
        mask = blocks.mask.expand(batch, heads, q_len, k_len).view(torch.uint8)
        mask_strides = mask.stride()
    target = query if call.target is None else call.target.to(dev).to(torch.int32).contiguous()
    b, n = (1.0, 1.0) if call.ssa is None else call.ssa
    config = _config(dim)
    if rows:
        grid = (triton.cdiv(q_len, config["BLOCK_M"]), batch * heads)
        row_stats_fwd[grid](
            query, key, value, out, planes, top, key_mass, distance_mass, mask, target,
            _per_head(b, heads, dev), _per_head(n, heads, dev),
            *query.stride(), *key.stride(), *value.stride(), *out.stride(), *mask_strides,
            float(call.scaling), heads, heads // key.shape[1], q_len, k_len, dim,
            call.window or 0, bins.sink_k if bins else 1, bins.bin_width if bins else 1, rows, n_kb, n_db,
            N_TOP=n_top, TOP_P=_pow2(n_top), KB_P=_pow2(n_kb), DB_P=_pow2(n_db),
            CAUSAL=call.mask is None and call.causal, HAS_WINDOW=call.mask is None and call.causal
            and call.window is not None, HAS_MASK=blocks.mask is not None,
            HAS_TARGET=call.target is not None, SSA=call.ssa is not None, POSITIONS=bins is not None,
            ROUND=query.dtype != torch.float32, UPCAST=INTERPRETED and query.dtype == torch.bfloat16,
            PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
            BLOCK_D=max(16, triton.next_power_of_2(dim)), **config,
        )  # fmt: skip
    stats = _statistics(planes, top, n_top, blocks, (key_mass, n_kb, distance_mass, n_db), out)
    return out.to(value.dtype), stats


def _statistics(planes, top, n_top: int, blocks: CallBlocks, bins: tuple, out) -> RowStatistics:
    """The kernel's float32 per-row results as RowStatistics (float64; top-k sorted, largest first)."""
    call = blocks.call
    shape = planes.shape[1:]
    s = dict(zip(PLANES, planes.double(), strict=True))
    t_target = None if call.target is None else s["target"]
    stats = RowStatistics(
        max=s["max"], total=s["total"], spread=s["spread"],
        top=top.double().reshape(*shape, n_top).sort(-1, descending=True).values,
        first=s["first"], visible=blocks.count.double(), keys=blocks.k_len, target=t_target,
        target_seen=None if t_target is None else t_target > -math.inf, logit_sq=s["logit_sq"],
        logit_n=s["logit_n"], target_logit=None if t_target is None else s["target_logit"],
        finite_logits=not bool(s["not_finite"].any()),
        finite_output=bool(torch.isfinite(out).all()) and bool(torch.isfinite(s["total"]).all()),
    )  # fmt: skip
    if call.positions is not None:
        key_mass, n_kb, distance_mass, n_db = bins
        stats.positions = call.positions
        stats.key_mass = key_mass.double().reshape(*shape, n_kb)
        stats.distance_mass = distance_mass.double().reshape(*shape, n_db)
        stats.distance_sum = s["distance_sum"]
        stats.key_visible = blocks.key_visible()
    return stats


__all__ = ["GPU_CONFIG", "INTERPRETED", "triton_statistics"]
