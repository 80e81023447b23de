"""ssacli's native kernels on the CPU in float32 (native_stats.c, native_ssa.c and the native_math.h
they share) as torch.library custom ops: tensors in and out, each checked at the op (device, dtype,
shape, contiguity), with fake (shape-only) implementations, so ``torch.compile(fullgraph=True)`` keeps
each call as one node of its graph, as it does the Triton kernels' (ssacli.kernels.triton_ssa).
Addresses exist only inside the ops, where ssacli.kernels.native_abi turns each checked tensor into a
field of the kernel's argument struct.

* **One loop per call** where nothing needs a mask tensor: SSA's forward and backward
  (``ssacli::native_ssa_forward`` with its autograd, ``ssacli::native_ssa_backward``) and diagnose's
  statistics of plain softmax (``ssacli::native_stats``) run FlashAttention's loop: each [rows, keys]
  logit tile is formed by torch's own sgemm (found in libtorch), reduced while it sits in cache, and
  multiplied by v. On an Intel Xeon with AVX-512 the products round bit for bit as torch.matmul's;
  on other CPUs and BLAS builds the sgemm blocks a dot product differently (an AMD EPYC with AVX2
  only: 3e-6 relative), so the tests bound every kernel against float64 by what float32 rounding can
  do in any summation order (tests/helpers/float_reference.py), not against torch's float32 tiles.
* **The block math of the block loop** (``ssacli::native_row_stats``, ``ssacli::native_ssa_block_forward``,
  ``ssacli::native_ssa_block_backward``), for calls with a mask tensor, dropout, other scorers or a
  torch without a usable sgemm: one key block's elementwise work while each row sits in cache (the
  transform, its softmax, the statistics' running sums and top-k), between torch's matmuls.

Which of them a call uses is ssacli.kernels.routing.choose_backend's decision; how the library is
built and loaded is ssacli.kernels.native_library's.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import native_abi
from .native_library import LOCK, available, library
from .positions import PositionBins

F32, F64 = torch.float32, torch.float64


def _threads(rows: int) -> int:
    """torch's intra-op thread count, at least 64 rows each."""
    return max(1, min(torch.get_num_threads(), rows // 64))


def _require(t: Tensor | None, name: str, dtype: torch.dtype, shape=None, *, rows: bool = False) -> None:
    """An op's check of one tensor argument (run by its real and its fake implementation, so a call
    traced by torch.compile is checked too): CPU, ``dtype``, ``shape`` (None: any) and contiguous
    (``rows``: only the last axis; the one-loop kernels take any other strides)."""
    if t is None:
        return
    if t.device.type != "cpu" or t.dtype != dtype:
        raise TypeError(f"{name} must be a CPU {dtype} tensor, got {t.dtype} on {t.device}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {tuple(shape)}, got {tuple(t.shape)}")
    if rows and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}'s last axis must be contiguous")
    if not rows and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _library() -> native_abi.Library:
    lib = library()
    if lib is None:
        raise RuntimeError("ssacli's native kernels are not built here")
    return lib


def _positions(
    kb: Tensor | None, db: Tensor | None, dist: Tensor | None, sink_k: int, bin_width: int
) -> dict:
    """The position-term fields (native_abi.h's SSACLI_POSITIONS): the kb, db and dist sums (float64,
    updated in place) and the bins, or a NULL kb (the terms are not measured)."""
    if kb is None:
        return dict(sink_k=0, bin_width=0, key_bins=0, distance_bins=0, kb=None, db=None, dist=None)
    return dict(sink_k=sink_k, bin_width=bin_width, key_bins=kb.shape[-1], distance_bins=db.shape[-1], kb=kb,
                db=db, dist=dist)  # fmt: skip


def _require_positions(
    rows: tuple, kb, db, dist, sink_k: int, bin_width: int, keys_end: int, far: int
) -> None:
    """The position terms' checks: kb, db, dist float64 contiguous for ``rows``, together or not at all,
    with a bin for every key below ``keys_end`` and every distance up to ``far`` (the kernel adds into
    the bins it computes, unchecked)."""
    if not (kb is None) == (db is None) == (dist is None):
        raise ValueError("kb, db and dist come together")
    if kb is None:
        return
    bins = PositionBins(sink_k=sink_k, bin_width=bin_width)
    _require(kb, "kb", F64, (*rows, max(kb.shape[-1], bins.key_bins(keys_end))))
    _require(db, "db", F64, (*rows, max(db.shape[-1], PositionBins.distance_bins(far + 1))))
    _require(dist, "dist", F64, rows)


def _bins(state: dict) -> tuple[int, int]:
    bins = state.get("bins")
    return (0, 0) if bins is None else (bins.sink_k, bins.bin_width)


# ---- the block math of the block loop ------------------------------------------------------------

_ROW_STATE = ("m", "l", "spread", "shrink", "top", "sq", "cnt")


def _check_row_stats(t, raw, vis, *state_and_positions):
    *state, kb, db, dist, key0, pos0, sink_k, bin_width = state_and_positions
    b, h, r, c = t.shape
    rows = (b, h, r)
    _require(t, "t", F32)
    _require(raw, "raw", F32, t.shape)
    _require(vis, "vis", torch.bool, t.shape, rows=True)
    for name, x in zip(_ROW_STATE, state, strict=True):
        _require(x, name, F32 if name == "shrink" else F64, (*rows, x.shape[-1]) if name == "top" else rows)
    _require_positions(
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
    finite = _library().call(
        "ssacli_row_stats", t=t, raw=t if raw is None else raw, vis=vis, vis_off=vis_off, C=c, r0=0, r1=rows,
        top_k=top.shape[-1], p=t, m=m, l=l, spread=spread, shrink=shrink, top=top, sq=sq, cnt=cnt,
        key0=key0, pos0=pos0, width=r, threads=_threads(rows), **_positions(kb, db, dist, sink_k, bin_width),
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
    positions = (state.get("kb"), state.get("db"), state.get("dist"), key0, pos0, *_bins(state))
    return _row_stats(t, None if raw is t else raw, vis, *(state[name] for name in _ROW_STATE), *positions)


def _band(y: Tensor, diagonal: int, causal: bool, window: int) -> dict:
    """The fields every SSA block call shares after its data: rows, the row width C, the block's
    width, its band (``window`` 0: none) and the thread count."""
    rows, cols = y.numel() // max(1, y.shape[-1]), y.shape[-1]
    return dict(C=cols, r0=0, r1=rows, width=y.shape[-2], causal=int(causal), diag=diagonal, window=window,
                threads=_threads(rows))  # fmt: skip


def _check_block_forward(y, n, diagonal, causal, window):
    _require(y, "y", F32)
    _require(n, "n", F32, (y.shape[1],))


@torch.library.custom_op("ssacli::native_ssa_block_forward", mutates_args=("y",))
def _block_forward(y: Tensor, n: Tensor, diagonal: int, causal: bool, window: int) -> tuple[Tensor, Tensor]:
    _check_block_forward(y, n, diagonal, causal, window)
    m = y.new_empty(y.shape[:-1] + (1,))
    s = torch.empty_like(m)
    _library().call("ssacli_ssa_forward", y=y, n_head=n, heads=n.numel(), p=y, m=m, s=s,
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
    _require(y, "y", F32)
    _require(dp, "dp", F32, y.shape)
    _require(n, "n", F32, (y.shape[1],))
    _require(lse, "lse", F32, (*y.shape[:-1], 1))
    _require(delta, "delta", F32, (*y.shape[:-1], 1))


@torch.library.custom_op("ssacli::native_ssa_block_backward", mutates_args=("y", "dp"))
def _block_backward(
    y: Tensor, dp: Tensor, n: Tensor, lse: Tensor, delta: Tensor, diagonal: int, causal: bool, window: int
) -> Tensor:
    _check_block_backward(y, dp, n, lse, delta, diagonal, causal, window)
    dn_rows = torch.zeros(y.shape[:-1], dtype=F64)
    _library().call("ssacli_ssa_backward", y=y, dp=dp, n_head=n, heads=n.numel(), lse=lse, delta=delta,
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


# ---- one loop per call, on torch's own BLAS -------------------------------------------------------


@functools.cache
def _sgemm() -> int | None:
    found = native_abi.torch_sgemm()
    if found is not None and native_abi.sgemm_integer_bits(found) != 32:
        found = None
    if found is not None and not _matches_matmul(found):
        found = None
    return found


def _torch_sgemm() -> int | None:
    """The address of the Fortran ``sgemm_`` torch itself runs, or None where it is not usable here.
    Checked once per process, in this order, before the kernels are ever given it: torch is built
    with MKL and libtorch_cpu exports ``sgemm_`` (native_abi.torch_sgemm); its integer arguments are
    32-bit, as the kernels pass them (native_abi.sgemm_integer_bits, on a little-endian machine: one
    1×1 product that either width reads safely and answers differently; an ILP64 sgemm is not used);
    and one small SSA forward through the kernel on it matches the same math in torch within float32
    rounding (:func:`_matches_matmul`: the symbol multiplies as an sgemm, with the argument order and
    transposes the kernels assume)."""
    with LOCK:
        return _sgemm()


def _matches_matmul(sgemm: int) -> bool:
    """Whether the one-loop SSA forward computes what torch.matmul does, within float32 rounding (the
    sgemm is the right symbol with the right calling convention): one small SSA forward with n = 0
    (uniform weights over the causal prefix), compared with the same math in torch."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 37, 24, generator=gen) for _ in range(3))
    out, _ = _flash_forward(library(), sgemm, q, k, v, torch.zeros(1), True, 0, 16, 32)
    weights = torch.ones(37, 37).tril()
    expected = (weights @ v[0, 0]) / weights.sum(-1, keepdim=True)
    return bool(torch.allclose(out[0, 0], expected, rtol=1e-5, atol=1e-6))


def one_loop_available() -> bool:
    """Whether the one-loop kernels can run here: the native kernels are built and torch's own
    ``sgemm_`` was found and checked (:func:`_torch_sgemm`)."""
    return available() and _torch_sgemm() is not None


@torch.compiler.assume_constant_result
def kernels_here() -> str:
    """What native kernels run here: "one-loop" (and the block pass), "blocks" (the block pass only: no
    usable sgemm) or "" (none: not built). Builds the library on first use. A fact of the process, so
    torch.compile takes it as a constant while tracing (a graph that calls the ops keeps them)."""
    if one_loop_available():
        return "one-loop"
    return "blocks" if available() else ""


def _require_flash(q: Tensor, k: Tensor, v: Tensor, n: Tensor | None = None) -> None:
    """The one-loop ops' checks of q [B, H, Q, D], k [B, Hkv, K, D], v [B, Hkv, K, Dv] (float32, last
    axes contiguous) and n [H]."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.shape[1] % k.shape[1]:
        raise ValueError("q, k, v must be 4-d, with a multiple of k's heads in q")
    _require(q, "q", F32, rows=True)
    _require(k, "k", F32, (q.shape[0], k.shape[1], k.shape[2], q.shape[3]), rows=True)
    _require(v, "v", F32, (*k.shape[:3], v.shape[-1]), rows=True)
    if n is not None:
        _require(n, "n", F32, (q.shape[1],))


def _flash_forward(lib, sgemm, q, k, v, n, causal, window, rows, cols):
    batch, heads, q_len, _ = q.shape
    out = q.new_empty(batch, heads, q_len, v.shape[-1])
    lse = q.new_empty(batch, heads, q_len)
    status = lib.call(
        "ssacli_ssa_flash_forward", strides=native_abi.strides(q, k, v, out), n_head=n, rows=rows, cols=cols,
        out=out, lse=lse, threads=max(1, torch.get_num_threads()),
        **native_abi.flash_fields(sgemm, q, k, v, causal, window or None),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("ssacli's native SSA forward could not allocate its tiles")
    return out, lse


@torch.library.custom_op("ssacli::native_ssa_forward", mutates_args=())
def _ssa_forward(
    q: Tensor, k: Tensor, v: Tensor, n: Tensor, causal: bool, window: int, block_rows: int, block_keys: int
) -> tuple[Tensor, Tensor]:
    _require_flash(q, k, v, n)
    sgemm = _torch_sgemm()
    if sgemm is None:
        raise RuntimeError("torch's sgemm is not usable here: no one-loop kernels")
    return _flash_forward(_library(), sgemm, q, k, v, n, causal, window, block_rows, block_keys)


@_ssa_forward.register_fake
def _ssa_forward_fake(q, k, v, n, causal, window, block_rows, block_keys):
    _require_flash(q, k, v, n)
    batch, heads, q_len, _ = q.shape
    return q.new_empty(batch, heads, q_len, v.shape[-1]), q.new_empty(batch, heads, q_len)


def _check_ssa_backward(q, k, v, grad_out, n, lse, delta):
    _require_flash(q, k, v, n)
    _require(grad_out, "grad_out", F32, (*q.shape[:3], v.shape[-1]), rows=True)
    _require(lse, "lse", F32, q.shape[:3])
    _require(delta, "delta", F32, q.shape[:3])


@torch.library.custom_op("ssacli::native_ssa_backward", mutates_args=())
def _ssa_backward(
    q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, n: Tensor, lse: Tensor, delta: Tensor, causal: bool,
    window: int, block_rows: int, block_keys: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    _check_ssa_backward(q, k, v, grad_out, n, lse, delta)
    batch, heads, q_len, dim = q.shape
    kv_heads, k_len, dim_v = k.shape[1], k.shape[2], v.shape[-1]
    dq = q.new_zeros(batch, heads, q_len, dim)
    dk_heads = q.new_empty(batch, heads, k_len, dim)
    dv_heads = q.new_empty(batch, heads, k_len, dim_v)
    dn = torch.empty(batch, heads, dtype=F64)
    status = _library().call(
        "ssacli_ssa_flash_backward", dout=grad_out, strides=native_abi.strides(q, k, v, grad_out), n_head=n,
        lse=lse, delta=delta, rows=block_rows, cols=block_keys, dq=dq, dk_h=dk_heads, dv_h=dv_heads, dn=dn,
        threads=max(1, torch.get_num_threads()),
        **native_abi.flash_fields(_torch_sgemm(), q, k, v, causal, window),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("ssacli's native SSA backward could not allocate its tiles")
    groups = heads // kv_heads
    dk = dk_heads.view(batch, kv_heads, groups, k_len, dim).sum(2)
    dv = dv_heads.view(batch, kv_heads, groups, k_len, dim_v).sum(2)
    return dq, dk, dv, dn.sum(0).to(n.dtype)


@_ssa_backward.register_fake
def _ssa_backward_fake(q, k, v, grad_out, n, lse, delta, causal, window, block_rows, block_keys):
    _check_ssa_backward(q, k, v, grad_out, n, lse, delta)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(n)


# Keys per block of the one-loop backward, whose logit and dO·vᵀ tiles ([block rows, 256] fp32 each,
# 128 KB at 128 rows) and ∂k, ∂v tiles stay in a core's cache.
BACKWARD_KEYS = 256


def _setup_context(ctx, inputs, output):
    q, k, v, n, causal, window, block_rows, block_keys = inputs
    ctx.save_for_backward(q, k, v, n, output[0], output[1])
    ctx.geometry = (causal, window, block_rows, min(block_keys, BACKWARD_KEYS))
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, n, out, lse = ctx.saved_tensors
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    delta = (grad_out.contiguous() * out).sum(dim=-1)  # rowsum(dO ∘ O)
    dq, dk, dv, dn = _ssa_backward(q, k, v, grad_out, n, lse, delta, *ctx.geometry)
    return dq, dk, dv, dn, None, None, None, None


_ssa_forward.register_autograd(_backward, setup_context=_setup_context)


def ssa_attention(
    q: Tensor, k: Tensor, v: Tensor, n: Tensor, *, causal: bool = False, window: int | None = None,
    block_rows: int = 64, block_keys: int = 512,
) -> Tensor:  # fmt: skip
    """SSA attention in one native loop, forward and backward: softmax(t)·v with t the SSA transform of
    y = q·kᵀ for q [B, H, Q, D] (already multiplied by b·scale), k/v [B, H_kv, K, D|Dv] float32, n [H];
    query i sits at key K − Q + i, ``causal`` and ``window`` as in ssacli.kernels.blocked. Each
    thread takes one head's block of ``block_rows`` queries at a time and, per block of ``block_keys``
    keys, runs torch's sgemm for the logits into a tile that stays in cache, SSA's row math on it, and
    sgemm again for p·v (FlashAttention's loop); the backward (FlashAttention-2's) recomputes each tile
    from the saved log-sum-exp, one task per query head, so the gradients of q, k, v and n do not depend
    on the thread count."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out, _ = _ssa_forward(q, k, v, n.contiguous(), causal, window or 0, block_rows, block_keys)
    return out


_STATE = ("m", "l", "spread", "top", "sq", "cnt", "first", "t_target", "x_target")


def _check_stats(q, k, v, target, state, kb, db, dist, sink_k, bin_width):
    _require_flash(q, k, v)
    rows = tuple(q.shape[:3])
    for name, x in zip(_STATE, state, strict=True):
        _require(x, name, F64, (*rows, state[3].shape[-1]) if name == "top" else rows)
    _require(target, "target", torch.int64, (q.shape[0],))
    _require_positions(rows, kb, db, dist, sink_k, bin_width, k.shape[2], k.shape[2] - 1)


@torch.library.custom_op("ssacli::native_stats", mutates_args=(*_STATE, "kb", "db", "dist"))
def _stats(
    q: Tensor, k: Tensor, v: Tensor, scaling: float, causal: bool, window: int, target: Tensor | None,
    block_rows: int, block_keys: int, m: Tensor, l: Tensor, spread: Tensor, top: Tensor, sq: Tensor,  # noqa: E741
    cnt: Tensor, first: Tensor, t_target: Tensor, x_target: Tensor, kb: Tensor | None, db: Tensor | None,
    dist: Tensor | None, sink_k: int, bin_width: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    state = (m, l, spread, top, sq, cnt, first, t_target, x_target)
    _check_stats(q, k, v, target, state, kb, db, dist, sink_k, bin_width)
    batch, heads, q_len, _ = q.shape
    # [B, Q, H, Dv] memory seen as [B, H, Q, Dv]: the layout the attention call returns
    out = q.new_empty(batch, q_len, heads, v.shape[-1]).transpose(1, 2)
    status = _library().call(
        "ssacli_stats_flash", strides=native_abi.strides(q, k, v, out), scaling=scaling, target=target,
        top_k=top.shape[-1], rows=block_rows, cols=block_keys, out=out, m=m, l=l, spread=spread, top=top,
        sq=sq, cnt=cnt, first=first, t_target=t_target, x_target=x_target,
        threads=max(1, torch.get_num_threads()), **_positions(kb, db, dist, sink_k, bin_width),
        **native_abi.flash_fields(_torch_sgemm(), q, k, v, causal, window),
    )  # fmt: skip
    if status < 0:
        raise MemoryError("ssacli's native statistics could not allocate their tiles")
    return out, torch.tensor([bool(status & 1), bool(status & 2)])


@_stats.register_fake
def _stats_fake(q, k, v, scaling, causal, window, target, block_rows, block_keys, *state):
    _check_stats(q, k, v, target, state[:9], *state[9:])
    batch, heads, q_len, _ = q.shape
    out = q.new_empty(batch, q_len, heads, v.shape[-1]).transpose(1, 2)
    return out, q.new_empty(2, dtype=torch.bool)


def stats_flash(query: Tensor, key: Tensor, value: Tensor, scaling: float, state: dict[str, Tensor], *,
                causal: bool, window: int | None, target: Tensor | None, block_rows: int,
                block_keys: int) -> tuple[Tensor, bool, bool]:  # fmt: skip
    """Diagnose's fused statistics of softmax attention with logits (query·keyᵀ)·scaling, in one
    native loop (FlashAttention's, on torch's sgemm: see :func:`ssa_attention`): query [B, H, Q, D],
    key/value [B, H_kv, K, D|Dv] float32; query i at key K − Q + i, ``causal``/``window`` as there
    (neither: every key visible); ``target`` [B] a key index per sample or None. ``state`` holds the
    rows' m, l, spread, top [B, H, Q, k], sq, cnt, first, t_target, x_target (float64 [B, H, Q],
    initialized as ssacli.kernels.online_stats starts them; with ``kb``, ``db``, ``dist`` and ``bins``
    the position terms too) and is updated in place. Returns (output [B, H, Q, Dv] normalized by l, a
    transposed view of [B, Q, H, Dv] memory; whether every logit formed was finite; whether every
    output and l is)."""
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    target = None if target is None else target.to(torch.int64).contiguous()
    out, flags = _stats(
        query, key, value, float(scaling), causal, window or 0, target, block_rows, block_keys,
        *(state[name] for name in _STATE), state.get("kb"), state.get("db"), state.get("dist"), *_bins(state),
    )  # fmt: skip
    return out, bool(flags[0]), bool(flags[1])


__all__ = [
    "BACKWARD_KEYS", "available", "kernels_here", "library", "one_loop_available", "row_stats",
    "ssa_attention", "ssa_block_backward", "ssa_block_forward", "stats_flash",
]  # fmt: skip
