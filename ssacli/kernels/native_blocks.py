"""The block math of the block loop as torch.library custom ops: ``ssacli::native_row_stats`` (one key
block of diagnose's statistics) and ``ssacli::native_ssa_block_forward`` / ``native_ssa_block_backward``
(SSA's transform, its softmax and their derivatives on one block), for the calls the one loop of
ssacli.kernels.native cannot take: a mask tensor, dropout, diagnose's probes and transforms, a torch
without a usable sgemm. One key block's elementwise work runs in C while each row sits in cache,
between torch's matmuls: a dozen reductions over the same tile plus a running top-k as torch ops
would read the tile from memory again each time, and torch.topk has a fixed cost per call that
dominates narrow searches; the C pass reads each row twice and keeps the top-k by insertion,
looking only at the few chunks of keys that can hold one. The SSA blocks apply the causal band in
the loop instead of by a mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .native_checks import (
    F32,
    F64,
    bins_of,
    loaded_library,
    position_fields,
    require,
    require_positions,
    threads_for,
)

_ROW_STATE = ("m", "l", "spread", "shrink", "top", "sq", "cnt")


def _check_row_stats(t, raw, vis, *state_and_positions):
    *state, kb, db, dist, key0, pos0, sink_k, bin_width = state_and_positions
    b, h, r, c = t.shape
    rows = (b, h, r)
    require(t, "t", F32)
    require(raw, "raw", F32, t.shape)
    require(vis, "vis", torch.bool, t.shape, rows=True)
    for name, x in zip(_ROW_STATE, state, strict=True):
        require(x, name, F32 if name == "shrink" else F64, (*rows, x.shape[-1]) if name == "top" else rows)
    require_positions(
        rows, kb, db, dist, sink_k, bin_width, key0 + c, max(pos0 + r - 1 - key0, key0 + c - 1 - pos0)
    )


@torch.library.custom_op("ssacli::native_row_stats", mutates_args=("t", *_ROW_STATE, "kb", "db", "dist"))
def _row_stats(
    t: Tensor, raw: Tensor | None, vis: Tensor | None, m: Tensor, l: Tensor, spread: Tensor, shrink: Tensor,  # noqa: E741
    top: Tensor, sq: Tensor, cnt: Tensor, kb: Tensor | None, db: Tensor | None, dist: Tensor | None,
    key0: int, pos0: int, sink_k: int, bin_width: int,
) -> Tensor:  # fmt: skip
    _check_row_stats(
        t, raw, vis, m, l, spread, shrink, top, sq, cnt, kb, db, dist, key0, pos0, sink_k, bin_width
    )
    b, h, r, c = t.shape
    rows = b * h * r
    vis_off = None
    if vis is not None:
        sb, sh, sr, _ = vis.stride()
        vis_off = (
            torch.arange(b).mul_(sb).view(b, 1, 1) + torch.arange(h).mul_(sh).view(1, h, 1)
            + torch.arange(r).mul_(sr).view(1, 1, r)
        ).reshape(-1)  # fmt: skip
    finite = loaded_library().call(
        "ssacli_row_stats", t=t, raw=t if raw is None else raw, vis=vis, vis_off=vis_off, C=c, r0=0, r1=rows,
        top_k=top.shape[-1], p=t, m=m, l=l, spread=spread, shrink=shrink, top=top, sq=sq, cnt=cnt,
        key0=key0, pos0=pos0, width=r, threads=threads_for(rows),
        **position_fields(kb, db, dist, sink_k, bin_width),
    )  # fmt: skip
    return torch.tensor(bool(finite))


@_row_stats.register_fake
def _row_stats_fake(*args):
    _check_row_stats(*args)
    return args[0].new_empty((), dtype=torch.bool)


def row_stats(
    t: Tensor, raw: Tensor, vis: Tensor | None, state: dict[str, Tensor], *, key0: int = 0, pos0: int = 0
) -> Tensor:
    """One key block of diagnose's statistics through the native row pass: t, raw [b, h, r, c] float32
    contiguous (raw may be t itself); vis bool broadcastable to them or None. p = e^(t − ref) is written
    over t; ``state`` holds the rows' running m, l, spread (float64 [b, h, r]), shrink (float32
    [b, h, r], written), top (float64 [b, h, r, k], descending) and the logit-scale sums sq, cnt
    (float64 [b, h, r]), updated in place; with ``kb``, ``db``, ``dist`` and ``bins`` in it the position
    terms too, for rows at key positions pos0 + (row index mod r) and columns from key ``key0``.
    Returns whether every raw logit was finite (a bool tensor). The rows are split over torch's
    intra-op threads where the kernel was built with OpenMP (gcc, clang on Linux)."""
    if vis is not None:
        vis = vis.expand(t.shape)
        vis = vis if vis.stride(-1) == 1 else vis.contiguous()
    positions = (state.get("kb"), state.get("db"), state.get("dist"), key0, pos0, *bins_of(state))
    return _row_stats(t, None if raw is t else raw, vis, *(state[name] for name in _ROW_STATE), *positions)


def _band(y: Tensor, diagonal: int, causal: bool, window: int) -> dict:
    """The fields every SSA block call shares after its data: rows, the row width C, the block's
    width, its band (``window`` 0: none) and the thread count."""
    rows, cols = y.numel() // max(1, y.shape[-1]), y.shape[-1]
    return dict(C=cols, r0=0, r1=rows, width=y.shape[-2], causal=int(causal), diag=diagonal, window=window,
                threads=threads_for(rows))  # fmt: skip


def _check_block_forward(y, n, diagonal, causal, window):
    require(y, "y", F32)
    require(n, "n", F32, (y.shape[1],))


@torch.library.custom_op("ssacli::native_ssa_block_forward", mutates_args=("y",))
def _block_forward(y: Tensor, n: Tensor, diagonal: int, causal: bool, window: int) -> tuple[Tensor, Tensor]:
    _check_block_forward(y, n, diagonal, causal, window)
    m = y.new_empty(y.shape[:-1] + (1,))
    s = torch.empty_like(m)
    loaded_library().call("ssacli_ssa_forward", y=y, n_head=n, heads=n.numel(), p=y, m=m, s=s,
                    **_band(y, diagonal, causal, window))  # fmt: skip
    return m, s


@_block_forward.register_fake
def _block_forward_fake(y, n, diagonal, causal, window):
    _check_block_forward(y, n, diagonal, causal, window)
    m = y.new_empty(y.shape[:-1] + (1,))
    return m, torch.empty_like(m)


def ssa_block_forward(
    y: Tensor, n: Tensor, *, diagonal: int = 0, causal: bool = False, window: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """SSA's forward block math (ssacli.kernels.blocked) through the native pass: y [b, h, r, c] float32
    contiguous (keys hidden by a mask tensor −inf), n [h] float32 contiguous, each head's exponent.
    With ``causal`` row i of the block sees only columns ≤ ``diagonal`` + i, with ``window`` only
    those > ``diagonal`` + i − window (the block's band). Returns (p, m, s) as the torch block does:
    p = e^(t − m) with t the SSA transform of y (0 where hidden) [b, h, r, c], written over y; the row
    max m of t and s = Σp [b, h, r, 1]."""
    m, s = _block_forward(y, n, diagonal, causal, window or 0)
    return y, m, s


def _check_block_backward(y, dp, n, lse, delta, diagonal, causal, window):
    require(y, "y", F32)
    require(dp, "dp", F32, y.shape)
    require(n, "n", F32, (y.shape[1],))
    require(lse, "lse", F32, (*y.shape[:-1], 1))
    require(delta, "delta", F32, (*y.shape[:-1], 1))


@torch.library.custom_op("ssacli::native_ssa_block_backward", mutates_args=("y", "dp"))
def _block_backward(
    y: Tensor, dp: Tensor, n: Tensor, lse: Tensor, delta: Tensor, diagonal: int, causal: bool, window: int
) -> Tensor:
    _check_block_backward(y, dp, n, lse, delta, diagonal, causal, window)
    dn_rows = torch.zeros(y.shape[:-1], dtype=F64)
    loaded_library().call("ssacli_ssa_backward", y=y, dp=dp, n_head=n, heads=n.numel(), lse=lse, delta=delta,
                    dn_row=dn_rows, **_band(y, diagonal, causal, window))  # fmt: skip
    return dn_rows


@_block_backward.register_fake
def _block_backward_fake(y, dp, n, lse, delta, diagonal, causal, window):
    _check_block_backward(y, dp, n, lse, delta, diagonal, causal, window)
    return y.new_empty(y.shape[:-1], dtype=F64)


def ssa_block_backward(
    y: Tensor, dp: Tensor, n: Tensor, lse: Tensor, delta: Tensor, *, diagonal: int = 0, causal: bool = False,
    window: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """SSA's backward block math (ssacli.kernels.blocked) through the native pass: y and dp = dO·vᵀ
    [b, h, r, c] float32 contiguous (keys hidden by a mask tensor −inf in y; both overwritten), n [h],
    the rows' saved log-sum-exp lse and delta = rowsum(dO ∘ O) [b, h, r, 1]; the band as in
    :func:`ssa_block_forward`. Returns (p, dy, dn_rows): p = e^(n·u − lse) with u = sgn(y)·log1p|y|
    written over y, ∂L/∂y = p·(dp − delta)·n / (1 + |y|) written over dp, and each row's
    Σ p·(dp − delta)·u [b, h, r] float64 (summed over b and r: ∂L/∂n per head)."""
    lse, delta = lse.to(F32).contiguous(), delta.to(F32).contiguous()
    return y, dp, _block_backward(y, dp, n, lse, delta, diagonal, causal, window or 0)


__all__ = ["row_stats", "ssa_block_backward", "ssa_block_forward"]
