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
* **The block math of the block loop**, for calls with a mask tensor, dropout, other scorers or a
  torch without a usable sgemm, is ssacli.kernels.native_blocks'.

Which of them a call uses is ssacli.kernels.routing.choose_backend's decision; how the library is
built and loaded is ssacli.kernels.native_library's.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import native_abi
from .native_checks import F32, F64, bins_of, loaded_library, position_fields, require, require_positions
from .native_library import LOCK, available, library

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
    require(q, "q", F32, rows=True)
    require(k, "k", F32, (q.shape[0], k.shape[1], k.shape[2], q.shape[3]), rows=True)
    require(v, "v", F32, (*k.shape[:3], v.shape[-1]), rows=True)
    if n is not None:
        require(n, "n", F32, (q.shape[1],))


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
    return _flash_forward(loaded_library(), sgemm, q, k, v, n, causal, window, block_rows, block_keys)


@_ssa_forward.register_fake
def _ssa_forward_fake(q, k, v, n, causal, window, block_rows, block_keys):
    _require_flash(q, k, v, n)
    batch, heads, q_len, _ = q.shape
    return q.new_empty(batch, heads, q_len, v.shape[-1]), q.new_empty(batch, heads, q_len)


def _check_ssa_backward(q, k, v, grad_out, n, lse, delta):
    _require_flash(q, k, v, n)
    require(grad_out, "grad_out", F32, (*q.shape[:3], v.shape[-1]), rows=True)
    require(lse, "lse", F32, q.shape[:3])
    require(delta, "delta", F32, q.shape[:3])


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
    status = loaded_library().call(
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
_POSITIONS = ("kb", "db", "dist")


def _check_stats(q, k, v, target, state, kb, db, dist, sink_k, bin_width):
    _require_flash(q, k, v)
    rows = tuple(q.shape[:3])
    for name, x in zip(_STATE, state, strict=True):
        require(x, name, F64, (*rows, state[3].shape[-1]) if name == "top" else rows)
    require(target, "target", torch.int64, (q.shape[0],))
    require_positions(rows, kb, db, dist, sink_k, bin_width, k.shape[2], k.shape[2] - 1)


@torch.library.custom_op("ssacli::native_stats", mutates_args=(*_STATE, *_POSITIONS))
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
    status = loaded_library().call(
        "ssacli_stats_flash", strides=native_abi.strides(q, k, v, out), scaling=scaling, target=target,
        top_k=top.shape[-1], rows=block_rows, cols=block_keys, out=out, m=m, l=l, spread=spread, top=top,
        sq=sq, cnt=cnt, first=first, t_target=t_target, x_target=x_target,
        threads=max(1, torch.get_num_threads()), **position_fields(kb, db, dist, sink_k, bin_width),
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
        *(state[name] for name in _STATE), *(state.get(name) for name in _POSITIONS), *bins_of(state),
    )  # fmt: skip
    return out, bool(flags[0]), bool(flags[1])


__all__ = [
    "BACKWARD_KEYS", "available", "kernels_here", "library", "one_loop_available", "ssa_attention",
    "stats_flash",
]  # fmt: skip
