"""ssacli's native kernels on the CPU in float32 (native_stats.c, native_ssa.c and the native_math.h
they share), built at first use and called through ctypes.

* **One loop per call** where nothing needs a mask tensor: SSA's forward and backward
  (:func:`ssa_flash_forward`, :func:`ssa_flash_backward`) and diagnose's statistics of plain
  softmax (:func:`stats_flash`) run FlashAttention's loop: each [rows, keys] logit tile is formed by
  torch's own sgemm (found in libtorch), reduced while it sits in cache, and multiplied by v. On an
  Intel Xeon with AVX-512 the products round bit for bit as torch.matmul's; on other CPUs and BLAS
  builds the sgemm blocks a dot product differently (an AMD EPYC with AVX2 only: 3e-6 relative), so
  the tests bound every kernel against float64 by what float32 rounding can do in any summation
  order (tests/helpers/float_reference.py), not against torch's float32 tiles. The
  torch block loop writes every tile to memory between a matmul and the next op and reads it back;
  this is what brought SSA's forward from ~2x to ~1.1-1.3x SDPA (docs/performance.md).
* **The block math of the block loop** (:func:`row_stats`, :func:`ssa_forward`,
  :func:`ssa_backward`), for calls with a mask tensor, dropout, other scorers or a torch without a
  usable sgemm: one key block of the statistics is a dozen elementwise reductions over the same
  tile plus a running top-k; as torch ops (compiled or not) each reads the tile from memory again,
  and torch.topk has a fixed cost per call that dominates narrow searches. The C pass reads each row
  twice while it sits in cache and keeps the top-k by insertion, looking only at the few chunks of
  keys that can hold one. The SSA blocks do the same for the transform n·sgn(y)·log1p|y| and its
  softmax, with the causal band applied in the loop instead of by a mask.

How the library is built, loaded, checked and switched off (``SSACLI_NATIVE=0``, :func:`disabled`) is
:mod:`ssacli.kernels.native_library`'s; its functions are importable from here too.
"""

from __future__ import annotations

import functools

import torch

from . import native_abi
from .native_library import (  # noqa: F401 (available, disabled, library, native_setting: used as native.*)
    LOCK,
    available,
    disabled,
    library,
    native_setting,
    one_loop_switched_off,
)


def _threads(rows: int) -> int:
    """torch's intra-op thread count, at least 64 rows each."""
    return max(1, min(torch.get_num_threads(), rows // 64))


def _block(y: torch.Tensor, diagonal: int, causal: bool, window: int | None) -> dict:
    """The fields every SSA block call shares after its data: rows, the row width C, the block's
    width, its band and the thread count."""
    rows, cols = y.numel() // max(1, y.shape[-1]), y.shape[-1]
    return dict(C=cols, r0=0, r1=rows, width=y.shape[-2], causal=int(causal), diag=diagonal,
                window=window or 0, threads=_threads(rows))  # fmt: skip


def _position_fields(state: dict) -> dict:
    """The position-term fields (native_abi.h's SSACLI_POSITIONS) of a state: its ``kb``, ``db`` and
    ``dist`` sums (float64, contiguous, updated in place) and ``bins`` (a PositionBins), or NULL ``kb``
    where the state has none (the terms are not measured)."""
    if "kb" not in state:
        return dict(sink_k=0, bin_width=0, key_bins=0, distance_bins=0, kb=None, db=None, dist=None)
    bins = state["bins"]
    return dict(sink_k=bins.sink_k, bin_width=bins.bin_width, key_bins=state["kb"].shape[-1],
                distance_bins=state["db"].shape[-1], kb=state["kb"].data_ptr(), db=state["db"].data_ptr(),
                dist=state["dist"].data_ptr())  # fmt: skip


def row_stats(
    t: torch.Tensor,
    raw: torch.Tensor,
    vis: torch.Tensor | None,
    p: torch.Tensor,
    state: dict[str, torch.Tensor],
    *,
    key0: int = 0,
    pos0: int = 0,
) -> bool:
    """One key block through the native pass: t, raw [b, h, r, c] float32 contiguous; vis bool
    broadcastable to them or None; p [b, h, r, c] float32 written with e^(t − ref); ``state`` holds
    the rows' running m, l, spread (float64 [b, h, r]), shrink (float32 [b, h, r], written), top
    (float64 [b, h, r, k], descending) and the logit-scale sums sq, cnt (float64 [b, h, r]), all
    contiguous and updated in place; with ``kb``, ``db``, ``dist`` and ``bins`` in it, the position terms
    too (:func:`_position_fields`), for rows at key positions pos0 + (row index mod r) and columns from
    key ``key0``. Returns whether every raw logit was finite. The rows are split
    over torch's intra-op threads where the kernel was built with OpenMP (gcc, clang on Linux), else
    one thread runs them all."""
    lib = library()
    assert lib is not None
    b, h, r, c = t.shape
    rows = b * h * r
    vis_ptr = off_ptr = None
    if vis is not None:
        vis = vis.expand(b, h, r, c)
        if vis.stride(-1) != 1:
            vis = vis.contiguous()
        sb, sh, sr, _ = vis.stride()
        offsets = (
            torch.arange(b).mul_(sb).view(b, 1, 1)
            + torch.arange(h).mul_(sh).view(1, h, 1)
            + torch.arange(r).mul_(sr).view(1, 1, r)
        ).reshape(-1)
        state["_vis"], state["_off"] = vis, offsets  # alive until the call returns
        vis_ptr, off_ptr = vis.data_ptr(), offsets.data_ptr()
    names = ("m", "l", "spread", "shrink", "top", "sq", "cnt")
    finite = native_abi.call(
        lib, "ssacli_row_stats",
        t=t.data_ptr(), raw=raw.data_ptr(), vis=vis_ptr, vis_off=off_ptr, C=c, r0=0, r1=rows,
        top_k=state["top"].shape[-1], p=p.data_ptr(), threads=_threads(rows), key0=key0, pos0=pos0, width=r,
        **{name: state[name].data_ptr() for name in names}, **_position_fields(state),
    )  # fmt: skip
    return bool(finite)


def ssa_forward(
    y: torch.Tensor,
    n: torch.Tensor,
    *,
    diagonal: int = 0,
    causal: bool = False,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SSA's forward block math (ssacli.kernels.blocked) through the native pass: y [b, h, r, c] float32
    contiguous (keys hidden by a mask tensor −inf), n [h] float32 contiguous, each head's exponent.
    With ``causal`` row i of the block sees only columns ≤ ``diagonal`` + i, with ``window`` only
    those > ``diagonal`` + i − window (the block's band). Returns (p, m, s) as the torch block does:
    p = e^(t − m) with t = n·sgn(y)·log1p|y| (0 where hidden) [b, h, r, c], written over y; the row
    max m of t and s = Σp [b, h, r, 1]."""
    lib = library()
    assert lib is not None
    y = y.contiguous()
    m = torch.empty(y.shape[:-1] + (1,), dtype=y.dtype)
    s = torch.empty_like(m)
    native_abi.call(
        lib, "ssacli_ssa_forward",
        y=y.data_ptr(), n_head=n.data_ptr(), heads=n.numel(), p=y.data_ptr(), m=m.data_ptr(), s=s.data_ptr(),
        **_block(y, diagonal, causal, window),
    )  # fmt: skip
    return y, m, s


def ssa_backward(
    y: torch.Tensor,
    dp: torch.Tensor,
    n: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    *,
    diagonal: int = 0,
    causal: bool = False,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SSA's backward block math (ssacli.kernels.blocked) through the native pass: y and dp = dO·vᵀ
    [b, h, r, c] float32 (keys hidden by a mask tensor −inf in y; both overwritten), n [h], the rows'
    saved log-sum-exp lse and delta = rowsum(dO ∘ O) [b, h, r, 1]; the band as in
    :func:`ssa_forward`. Returns (p, dy, dn_rows): p = e^(n·u − lse) with u = sgn(y)·log1p|y| written
    over y, ∂L/∂y = p·(dp − delta)·n / (1 + |y|) written over dp, and each row's Σ p·(dp − delta)·u
    [b, h, r] float64 (summed over b and r: ∂L/∂n per head)."""
    lib = library()
    assert lib is not None
    y, dp = y.contiguous(), dp.contiguous()
    lse, delta = lse.to(torch.float32).contiguous(), delta.to(torch.float32).contiguous()
    dn_rows = torch.zeros(y.shape[:-1], dtype=torch.float64)
    native_abi.call(
        lib, "ssacli_ssa_backward",
        y=y.data_ptr(), dp=dp.data_ptr(), n_head=n.data_ptr(), heads=n.numel(), lse=lse.data_ptr(),
        delta=delta.data_ptr(), dn_row=dn_rows.data_ptr(), **_block(y, diagonal, causal, window),
    )  # fmt: skip
    return y, dp, dn_rows


# ---- the whole SSA forward in one native loop, on torch's own BLAS ---------------------------------


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
    and one small SSA forward through the kernel on it
    matches the same math in torch within float32 rounding (:func:`_matches_matmul`: the symbol
    multiplies as an sgemm, with the argument order and transposes the kernels assume)."""
    with LOCK:
        return _sgemm()


def _matches_matmul(sgemm: int) -> bool:
    """Whether :func:`ssa_flash_forward` computes what torch.matmul does, within float32 rounding
    (the sgemm is the right symbol with the right calling convention): one small SSA
    forward with n = 0 (uniform weights over the causal prefix), compared with the same math in
    torch."""
    lib = library()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 37, 24, generator=gen) for _ in range(3))
    out, _ = _flash(lib, sgemm, q, k, v, torch.zeros(1), True, None, 16, 32)
    weights = torch.ones(37, 37).tril()
    expected = (weights @ v[0, 0]) / weights.sum(-1, keepdim=True)
    return bool(torch.allclose(out[0, 0], expected, rtol=1e-5, atol=1e-6))


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself where its last axis is contiguous (the flash loops take any other strides), else a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _flash(lib, sgemm, q, k, v, n, causal, window, rows, cols):
    batch, heads, q_len, _ = q.shape
    q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
    n = n.to(torch.float32).contiguous()
    out = q.new_empty(batch, heads, q_len, v.shape[-1])
    lse = q.new_empty(batch, heads, q_len)
    strides = native_abi.strides(q, k, v, out)
    status = native_abi.call(
        lib, "ssacli_ssa_flash_forward",
        strides=strides.data_ptr(), n_head=n.data_ptr(), rows=rows, cols=cols, out=out.data_ptr(),
        lse=lse.data_ptr(), threads=max(1, torch.get_num_threads()),
        **native_abi.flash_fields(sgemm, q, k, v, causal, window),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("ssacli's native SSA forward could not allocate its tiles")
    return out, lse


def flash_available() -> bool:
    """Whether :func:`ssa_flash_forward` can run here: the native pass is built and torch's own
    ``sgemm_`` was found and checked (:func:`_torch_sgemm`)."""
    return available() and not one_loop_switched_off() and _torch_sgemm() is not None


def ssa_flash_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    n: torch.Tensor,
    *,
    causal: bool = False,
    window: int | None = None,
    block_rows: int = 64,
    block_keys: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSA's whole forward in one native loop: out = softmax(n·sgn(y)·log1p|y|)·v with y = query·keyᵀ
    for query [B, H, Q, D] (already multiplied by b·scale), key/value [B, H_kv, K, D|Dv] float32,
    n [H]; query i sits at key K − Q + i, ``causal`` and ``window`` as in ssacli.kernels.blocked.
    Each thread takes one head's block of ``block_rows`` queries at a time and, per block of
    ``block_keys`` keys, runs torch's sgemm for the logits into a tile that stays in cache, SSA's
    row math on it, and sgemm again for p·v (FlashAttention's loop). Returns (out [B, H, Q, Dv],
    lse [B, H, Q], +inf where a row sees no key and its output is 0)."""
    return _flash(library(), _torch_sgemm(), query, key, value, n, causal, window, block_rows, block_keys)


def ssa_flash_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_out: torch.Tensor,
    n: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    *,
    causal: bool = False,
    window: int | None = None,
    block_rows: int = 128,
    block_keys: int = 256,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SSA's whole backward in one native loop per query head (FlashAttention-2's, on torch's sgemm):
    the inputs of :func:`ssa_flash_forward`, the output's gradient ``grad_out`` [B, H, Q, Dv], the
    forward's ``lse`` and delta = rowsum(grad_out ∘ out) [B, H, Q]. Per block of ``block_keys`` keys
    (its ∂k, ∂v tiles kept in cache) and per block of ``block_rows`` queries that see any of them, it
    recomputes the logits and dO·vᵀ with sgemm, the weights and ∂L/∂y from the saved log-sum-exp, and
    adds their products into ∂v, ∂k and the head's ∂q. Each query head is one task that writes only its
    own results (heads sharing a K/V head are summed after), so the gradients do not depend on the
    thread count. Returns (∂q [B, H, Q, D], ∂k, ∂v [B, H_kv, K, D|Dv], ∂n [H] float64)."""
    lib, sgemm = library(), _torch_sgemm()
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len, dim_v = key.shape[1], key.shape[2], value.shape[-1]
    query, key, value, grad_out = (_rows_contiguous(t) for t in (query, key, value, grad_out))
    lse = lse.to(torch.float32).reshape(batch, heads, q_len).contiguous()
    delta = delta.to(torch.float32).reshape(batch, heads, q_len).contiguous()
    n = n.to(torch.float32).contiguous()
    dq = query.new_zeros(batch, heads, q_len, dim)
    dk_heads = query.new_empty(batch, heads, k_len, dim)
    dv_heads = query.new_empty(batch, heads, k_len, dim_v)
    dn = torch.empty(batch, heads, dtype=torch.float64)
    strides = native_abi.strides(query, key, value, grad_out)
    status = native_abi.call(
        lib, "ssacli_ssa_flash_backward",
        dout=grad_out.data_ptr(), strides=strides.data_ptr(), n_head=n.data_ptr(), lse=lse.data_ptr(),
        delta=delta.data_ptr(), rows=block_rows, cols=block_keys, dq=dq.data_ptr(), dk_h=dk_heads.data_ptr(),
        dv_h=dv_heads.data_ptr(), dn=dn.data_ptr(), threads=max(1, torch.get_num_threads()),
        **native_abi.flash_fields(sgemm, query, key, value, causal, window),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("ssacli's native SSA backward could not allocate its tiles")
    groups = heads // kv_heads
    dk = dk_heads.view(batch, kv_heads, groups, k_len, dim).sum(2)
    dv = dv_heads.view(batch, kv_heads, groups, k_len, dim_v).sum(2)
    return dq, dk, dv, dn.sum(0)


def stats_flash(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    state: dict[str, torch.Tensor],
    *,
    causal: bool,
    window: int | None,
    target: torch.Tensor | None,
    block_rows: int,
    block_keys: int,
) -> tuple[torch.Tensor, bool, bool]:
    """Diagnose's fused statistics of softmax attention with logits (query·keyᵀ)·scaling, in one
    native loop (FlashAttention's, on torch's sgemm: see :func:`ssa_flash_forward`): query [B, H, Q, D],
    key/value [B, H_kv, K, D|Dv] float32; query i at key K − Q + i, ``causal``/``window`` as there
    (neither: every key visible); ``target`` [B] a key index per sample or None. ``state`` holds the
    rows' m, l, spread, top [B, H, Q, k], sq, cnt, first, t_target, x_target (float64 [B, H, Q],
    initialized as ssacli.kernels.online_stats starts them; with ``kb``, ``db``, ``dist`` and ``bins``
    the position terms too) and is updated in place. Returns
    (output [B, H, Q, Dv] normalized by l, a transposed view of [B, Q, H, Dv] memory; whether every
    logit formed was finite; whether every output and l is)."""
    lib, sgemm = library(), _torch_sgemm()
    batch, heads, q_len, _ = query.shape
    query, key, value = _rows_contiguous(query), _rows_contiguous(key), _rows_contiguous(value)
    # [B, Q, H, Dv] memory seen as [B, H, Q, Dv]: the layout the attention call returns
    out = query.new_empty(batch, q_len, heads, value.shape[-1]).transpose(1, 2)
    strides = native_abi.strides(query, key, value, out)
    target_ptr = None
    if target is not None:
        target = target.to(torch.int64).contiguous()
        target_ptr = target.data_ptr()
    names = ("m", "l", "spread", "top", "sq", "cnt", "first", "t_target", "x_target")
    status = native_abi.call(
        lib, "ssacli_stats_flash",
        strides=strides.data_ptr(), scaling=scaling, target=target_ptr, top_k=state["top"].shape[-1],
        rows=block_rows, cols=block_keys, out=out.data_ptr(), threads=max(1, torch.get_num_threads()),
        **{name: state[name].data_ptr() for name in names}, **_position_fields(state),
        **native_abi.flash_fields(sgemm, query, key, value, causal, window),
    )  # fmt: skip
    if status < 0:
        raise MemoryError("ssacli's native statistics could not allocate their tiles")
    return out, bool(status & 1), bool(status & 2)


__all__ = [
    "flash_available", "row_stats", "ssa_backward", "ssa_flash_backward", "ssa_flash_forward", "ssa_forward",
    "stats_flash",
]  # fmt: skip
