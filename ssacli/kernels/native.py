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

The sources are C99 with GCC/Clang vector extensions (AVX-512 and AVX intrinsics where a generic form
costs several instructions) and no library but libm. They are compiled once per
machine with the C compiler torch.compile would use (``$CC``, else cc/gcc/clang), at -O3 for the
host CPU, into the user's cache (``$SSACLI_CACHE`` or ``$XDG_CACHE_HOME/ssacli``, default
~/.cache/ssacli; its ``kernels`` folder), named by a hash of the sources, the compiler and the CPU, so a
new source or machine builds anew and nothing is ever overwritten in place (write to a temporary
file, then rename). A cached library is loaded only if it and the cache's folders are the user's own,
not writable by group or others and not symbolic links, checked on the opened file that is then
loaded (ssacli.kernels.native_build.open_checked); a cache that fails the check is one warning and a
private temporary build for the process. ``$SSACLI_NATIVE_CFLAGS`` adds compiler flags (a separate
build). ``SSACLI_COMPILE=0`` (the one switch, ssacli.kernels.compiled) never builds it; a cache that
cannot be written means a private temporary build for the process (silently); a failed build is said
once, as a warning, and the callers keep their torch block math, which computes the same things.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import warnings
from pathlib import Path

import torch

from . import native_build
from .compiled import compile_setting

_LIB: list[ctypes.CDLL | None] = []  # [] not tried yet; [None] unavailable
_LOCK = threading.Lock()
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


def _declare(lib: ctypes.CDLL) -> None:
    """The C signatures (native_stats.c, native_ssa.c), so ctypes converts and checks every argument."""
    _int = ctypes.c_int
    # t, raw, vis, vis_off, C, r0, r1, k, p, m, l, spread, shrink, top, sq, cnt, threads
    lib.ssacli_row_stats.argtypes = [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, *[_ptr] * 8, _int]
    lib.ssacli_row_stats.restype = _int
    # y, C, r0, r1, n_head, heads, p, m, s, width, causal, diag, window, threads
    lib.ssacli_ssa_forward.argtypes = [
        _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _int, _i64, _i64, _int,
    ]  # fmt: skip
    lib.ssacli_ssa_forward.restype = None
    # y, dp, C, r0, r1, n_head, heads, lse, delta, dn_row, width, causal, diag, window, threads
    lib.ssacli_ssa_backward.argtypes = [
        _ptr, _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _int, _i64, _i64, _int,
    ]  # fmt: skip
    lib.ssacli_ssa_backward.restype = None
    # gemm, q, k, v, strides, n_head, B, H, Hkv, Q, K, D, Dv, causal, window, rows, cols, out, lse, threads
    lib.ssacli_ssa_flash_forward.argtypes = [
        *[_ptr] * 6, *[_i64] * 7, _int, _i64, _i64, _i64, _ptr, _ptr, _int,
    ]  # fmt: skip
    lib.ssacli_ssa_flash_forward.restype = _int
    # gemm, q, k, v, strides, scaling, B, H, Hkv, Q, K, D, Dv, causal, window, target, k, rows, cols,
    # out, m, l, spread, top, sq, cnt, first, t_target, x_target, threads
    lib.ssacli_stats_flash.argtypes = [
        *[_ptr] * 5, ctypes.c_float, *[_i64] * 7, _int, _i64, _ptr, _i64, _i64, _i64, *[_ptr] * 10, _int,
    ]  # fmt: skip
    lib.ssacli_stats_flash.restype = _int
    # gemm, q, k, v, dout, strides, n_head, lse, delta, B, H, Hkv, Q, K, D, Dv, causal, window, rows,
    # cols, dq, dk_h, dv_h, dn, threads
    lib.ssacli_ssa_flash_backward.argtypes = [
        *[_ptr] * 9, *[_i64] * 7, _int, _i64, _i64, _i64, *[_ptr] * 4, _int,
    ]  # fmt: skip
    lib.ssacli_ssa_flash_backward.restype = _int


def library() -> ctypes.CDLL | None:
    """The loaded row pass, built on first use; None if SSACLI_COMPILE=0 or the build failed."""
    if compile_setting() == "0":
        return None
    with _LOCK:
        if not _LIB:
            try:
                compiler = native_build.compiler()
                if compiler is None:
                    raise RuntimeError("no C compiler found ($CC, cc, gcc or clang)")
                lib = native_build.load(native_build.build(compiler))
                _declare(lib)
                _LIB.append(lib)
            except Exception as err:  # noqa: BLE001 - any failure means "use the torch path"
                _LIB.append(None)
                warnings.warn(
                    f"ssacli: building ssacli's native kernels failed ({err}); using the torch block "
                    "math (same results, slower). Set SSACLI_COMPILE=0 to skip the attempt.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return _LIB[0]


_DISABLED: list[str] = []  # "all" or "flash", one per open disabled() block


def available() -> bool:
    """Whether callers should use the native pass: built here and not switched off by :func:`disabled`."""
    return "all" not in _DISABLED and library() is not None


@contextlib.contextmanager
def disabled(flash_only: bool = False):
    """Within this block callers take their torch path (benchmarks and tests compare the two); with
    ``flash_only`` they keep the native block pass but not the one-loop kernels (:func:`flash_available`
    is False), so the block loop's torch matmuls run as without torch's sgemm."""
    _DISABLED.append("flash" if flash_only else "all")
    try:
        yield
    finally:
        _DISABLED.pop()


def _threads(rows: int) -> int:
    """torch's intra-op thread count, at least 64 rows each."""
    return max(1, min(torch.get_num_threads(), rows // 64))


def _block(y: torch.Tensor, diagonal: int, causal: bool, window: int | None) -> tuple:
    """The arguments every SSA block call shares after its data: rows, columns, and after the
    per-row inputs the block's width, its band and the thread count."""
    rows, cols = y.numel() // max(1, y.shape[-1]), y.shape[-1]
    return rows, cols, (y.shape[-2], int(causal), diagonal, window or 0, _threads(rows))


def row_stats(
    t: torch.Tensor,
    raw: torch.Tensor,
    vis: torch.Tensor | None,
    p: torch.Tensor,
    state: dict[str, torch.Tensor],
) -> bool:
    """One key block through the native pass: t, raw [b, h, r, c] float32 contiguous; vis bool
    broadcastable to them or None; p [b, h, r, c] float32 written with e^(t − ref); ``state`` holds
    the rows' running m, l, spread (float64 [b, h, r]), shrink (float32 [b, h, r], written), top
    (float64 [b, h, r, k], descending) and the logit-scale sums sq, cnt (float64 [b, h, r]), all
    contiguous and updated in place. Returns whether every raw logit was finite. The rows are split
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
    k = state["top"].shape[-1]
    args = (t.data_ptr(), raw.data_ptr(), vis_ptr, off_ptr, c)
    names = ("m", "l", "spread", "shrink", "top", "sq", "cnt")
    tail = (k, p.data_ptr(), *(state[name].data_ptr() for name in names))
    return bool(lib.ssacli_row_stats(*args, 0, rows, *tail, _threads(rows)))


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
    rows, cols, geometry = _block(y, diagonal, causal, window)
    m = torch.empty(y.shape[:-1] + (1,), dtype=y.dtype)
    s = torch.empty_like(m)
    lib.ssacli_ssa_forward(
        y.data_ptr(), cols, 0, rows, n.data_ptr(), n.numel(), y.data_ptr(), m.data_ptr(), s.data_ptr(),
        *geometry,
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
    rows, cols, geometry = _block(y, diagonal, causal, window)
    dn_rows = torch.zeros(y.shape[:-1], dtype=torch.float64)
    lib.ssacli_ssa_backward(
        y.data_ptr(), dp.data_ptr(), cols, 0, rows, n.data_ptr(), n.numel(), lse.data_ptr(),
        delta.data_ptr(), dn_rows.data_ptr(), *geometry,
    )  # fmt: skip
    return y, dp, dn_rows


# ---- the whole SSA forward in one native loop, on torch's own BLAS ---------------------------------

_SGEMM: list[int | None] = []  # [] not looked up yet; [None] none usable


def _torch_sgemm() -> int | None:
    """The address of the Fortran ``sgemm_`` torch itself runs, where torch is built with MKL (whose
    ``sgemm_`` takes 32-bit integers; other BLAS builds may not) and exports it; checked once against
    torch.matmul on a small product (:func:`_matches_matmul`, within float32 rounding). None: not
    available here."""
    if _SGEMM:
        return _SGEMM[0]
    found = None
    if torch.backends.mkl.is_available():
        lib_dir = Path(torch.__file__).parent / "lib"
        for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
            try:
                found = ctypes.cast(ctypes.CDLL(str(lib_dir / name)).sgemm_, _ptr).value
                break
            except (OSError, AttributeError):
                continue
    if found is not None and not _matches_matmul(found):
        found = None
    _SGEMM.append(found)
    return found


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


def _strides(*tensors: torch.Tensor) -> torch.Tensor:
    """The [batch, head, row] element strides of each 4-d tensor, as native_math.h's STRIDES array."""
    return torch.tensor([s for t in tensors for s in t.stride()[:3]], dtype=torch.int64)


def _flash(lib, sgemm, q, k, v, n, causal, window, rows, cols):
    batch, heads, q_len, dim = q.shape
    kv_heads, k_len, dim_v = k.shape[1], k.shape[2], v.shape[-1]
    q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
    n = n.to(torch.float32).contiguous()
    out = q.new_empty(batch, heads, q_len, dim_v)
    lse = q.new_empty(batch, heads, q_len)
    strides = _strides(q, k, v, out)
    threads = max(1, torch.get_num_threads())
    status = lib.ssacli_ssa_flash_forward(
        sgemm, q.data_ptr(), k.data_ptr(), v.data_ptr(), strides.data_ptr(), n.data_ptr(), batch, heads,
        kv_heads, q_len, k_len, dim, dim_v, int(causal), window or 0, rows, cols, out.data_ptr(),
        lse.data_ptr(), threads,
    )  # fmt: skip
    if status != 0:
        raise MemoryError("ssacli's native SSA forward could not allocate its tiles")
    return out, lse


def flash_available() -> bool:
    """Whether :func:`ssa_flash_forward` can run here: the native pass is built and torch's own
    ``sgemm_`` was found (torch built with MKL)."""
    return available() and "flash" not in _DISABLED and _torch_sgemm() is not None


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
    strides = _strides(query, key, value, grad_out)
    status = lib.ssacli_ssa_flash_backward(
        sgemm, query.data_ptr(), key.data_ptr(), value.data_ptr(), grad_out.data_ptr(), strides.data_ptr(),
        n.data_ptr(), lse.data_ptr(), delta.data_ptr(), batch, heads, kv_heads, q_len, k_len, dim, dim_v,
        int(causal), window or 0, block_rows, block_keys, dq.data_ptr(), dk_heads.data_ptr(),
        dv_heads.data_ptr(), dn.data_ptr(), max(1, torch.get_num_threads()),
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
    initialized as ssacli.kernels.online_stats starts them) and is updated in place. Returns
    (output [B, H, Q, Dv] normalized by l, a transposed view of [B, Q, H, Dv] memory; whether every
    logit formed was finite; whether every output and l is)."""
    lib, sgemm = library(), _torch_sgemm()
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len, dim_v = key.shape[1], key.shape[2], value.shape[-1]
    query, key, value = _rows_contiguous(query), _rows_contiguous(key), _rows_contiguous(value)
    # [B, Q, H, Dv] memory seen as [B, H, Q, Dv]: the layout the attention call returns
    out = query.new_empty(batch, q_len, heads, dim_v).transpose(1, 2)
    strides = _strides(query, key, value, out)
    target_ptr = None
    if target is not None:
        target = target.to(torch.int64).contiguous()
        target_ptr = target.data_ptr()
    names = ("m", "l", "spread", "top", "sq", "cnt", "first", "t_target", "x_target")
    status = lib.ssacli_stats_flash(
        sgemm, query.data_ptr(), key.data_ptr(), value.data_ptr(), strides.data_ptr(), scaling, batch,
        heads, kv_heads,
        q_len, k_len, dim, dim_v, int(causal), window or 0, target_ptr, state["top"].shape[-1],
        block_rows, block_keys, out.data_ptr(), *(state[name].data_ptr() for name in names),
        max(1, torch.get_num_threads()),
    )  # fmt: skip
    if status < 0:
        raise MemoryError("ssacli's native statistics could not allocate their tiles")
    return out, bool(status & 1), bool(status & 2)


__all__ = [
    "available",
    "disabled",
    "flash_available",
    "library",
    "row_stats",
    "ssa_backward",
    "ssa_flash_backward",
    "ssa_flash_forward",
    "stats_flash",
    "ssa_forward",
]
