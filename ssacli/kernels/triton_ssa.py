"""SSA attention through Triton (``ssa_attention(..., backend="triton")``): the kernels of
ssacli/kernels/triton_kernels.py behind two torch.library custom ops, ``ssacli::ssa_triton_fwd`` and
``ssacli::ssa_triton_bwd``, joined by ``register_autograd``.

Custom ops with fake (shape-only) implementations, so ``torch.compile`` puts one node in its graph
for each instead of breaking the graph at a Triton launch, and the same op runs under the Triton
interpreter (TRITON_INTERPRET=1, CPU tensors), where the suite tests it (tests/kernels/
test_triton_ssa.py): ``torch.library.triton_op`` would register the launching function itself as the
fake implementation, which cannot run an interpreted kernel on fake tensors.

The gradients of q, k, v, b and n: dK and dV per query head in float32, summed over each GQA group
here (every query head has its own backward program); dn and db from per-(batch, head, block)
partials summed here in a fixed order (no atomics: deterministic). db = Σ q·dq / b per head (see the
kernels' docstring), so b must be positive, as SSA's b is.

Block sizes are pinned (no autotuning: the interpreter has no driver to tune with). The GPU sizes in
GPU_CONFIGS are first choices, not measured ones: ``benchmarks/triton_ssa.py --sections sweep`` times
a few others on a GPU. The kernels' speed on a GPU is unmeasured until such a run.
"""

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from .triton_kernels import ssa_bwd_dkdv, ssa_bwd_dq, ssa_fwd

# Whether the kernels were built for the interpreter: triton.jit reads TRITON_INTERPRET when this
# package's kernels module is imported, so the variable must be set before that import.
INTERPRETED = isinstance(ssa_fwd, InterpretedFunction)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256  # padded head sizes above this would not fit a GPU program's registers

# (BLOCK_M queries, BLOCK_N keys, num_warps, num_stages) per kernel and padded head size.
GPU_CONFIGS = {
    ("fwd", 64): (128, 64, 4, 3),
    ("fwd", 128): (128, 64, 8, 3),
    ("dkdv", 64): (32, 128, 4, 2),
    ("dkdv", 128): (64, 64, 8, 2),
    ("dq", 64): (128, 32, 4, 2),
    ("dq", 128): (64, 64, 8, 2),
}
# The interpreter's sizes: unequal (M ≠ N), so that an index swapped between queries and keys cannot
# pass, and small enough that the tests' 129-token sequences span several blocks of each kind; not
# smaller, because the interpreter's cost is per block (64/32 ran a T = 129 forward+backward 2.4×
# faster than 32/16 on 2 cores).
INTERPRETER_CONFIG = {"fwd": (64, 32), "dkdv": (32, 64), "dq": (64, 32)}


def _config(kind: str, block_d: int, dtype: torch.dtype) -> dict:
    if INTERPRETED:
        block_m, block_n = INTERPRETER_CONFIG[kind]
        return {"BLOCK_M": block_m, "BLOCK_N": block_n}
    block_m, block_n, warps, stages = GPU_CONFIGS[(kind, min(max(block_d, 64), 128))]
    if block_d > 128 or dtype == torch.float32:  # twice the registers per element: halve the tiles
        block_m, block_n = max(block_m // 2, 16), max(block_n // 2, 16)
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}


def _flags(q: torch.Tensor, mask: torch.Tensor | None, causal: bool, ssa: bool) -> dict:
    dim = q.shape[-1]
    return {
        "CAUSAL": causal, "HAS_MASK": mask is not None, "SSA": ssa,
        # the interpreter's bf16 tl.dot is wrong (triton-lang/triton#11584): multiply in float32
        "UPCAST": INTERPRETED and q.dtype == torch.bfloat16,
        # float32 inputs get float32 products (TF32 would cost ~1e-3); 16-bit inputs ignore it
        "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
        "BLOCK_D": max(16, triton.next_power_of_2(dim)),
    }  # fmt: skip


def _mask_args(mask: torch.Tensor | None, like: torch.Tensor) -> tuple:
    """The mask as a uint8 view with its strides (0 where broadcast), or a never-read placeholder."""
    if mask is None:
        return (like, 0, 0, 0, 0)
    view = mask.view(torch.uint8)
    return (view, *view.stride())


def _geometry(q, k):
    batch, heads, q_len, dim = q.shape
    return batch, heads, heads // k.shape[1], q_len, k.shape[2], dim


@torch.library.custom_op("ssacli::ssa_triton_fwd", mutates_args=())
def _fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, n: torch.Tensor,
    mask: torch.Tensor | None, scale: float, causal: bool, ssa: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(output [B, H, Q, D] in q's dtype, row statistics [2, B, H, Q] float32: each row's max of t₂ and
    log2 of its sum of weights) for b, n of shape [H] float32."""
    batch, heads, group, q_len, k_len, dim = _geometry(q, k)
    out = torch.empty((batch, heads, q_len, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((2, batch, heads, q_len), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    flags = _flags(q, mask, causal, ssa)
    config = _config("fwd", flags["BLOCK_D"], q.dtype)
    grid = (triton.cdiv(q_len, config["BLOCK_M"]), batch * heads)
    m, *m_strides = _mask_args(mask, q)
    ssa_fwd[grid](
        q, k, v, out, lse, b, n, m, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *m_strides,
        scale, heads, group, q_len, k_len, dim, lse[0].numel(), **flags, **config,
    )  # fmt: skip
    return out, lse


@_fwd.register_fake
def _fwd_fake(q, k, v, b, n, mask, scale, causal, ssa):
    batch, heads, q_len, dim = q.shape
    return q.new_empty((batch, heads, q_len, dim)), q.new_empty((2, batch, heads, q_len), dtype=torch.float32)


@torch.library.custom_op("ssacli::ssa_triton_bwd", mutates_args=())
def _bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, b: torch.Tensor, n: torch.Tensor, mask: torch.Tensor | None, scale: float,
    causal: bool, ssa: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv, db [H], dn [H]) of the forward's output gradient ``do``."""
    batch, heads, group, q_len, k_len, dim = _geometry(q, k)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    db = torch.zeros_like(b)
    dn = torch.zeros_like(n)
    if q_len == 0 or k_len == 0 or batch == 0:
        return dq, dk, dv, db, dn
    flags = _flags(q, mask, causal, ssa)
    m, *m_strides = _mask_args(mask, q)
    # Δ_i = rowsum(dO·O) = Σ_j p_ij·dp_ij: the row term of the softmax gradient, O(T·D) here.
    delta = (do.float() * out.float()).sum(-1).contiguous()
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride())

    config = _config("dkdv", flags["BLOCK_D"], q.dtype)
    n_blocks = triton.cdiv(k_len, config["BLOCK_N"])
    dk_part = torch.empty((batch, heads, k_len, dim), dtype=torch.float32, device=q.device)
    dv_part = torch.empty_like(dk_part)
    dn_part = torch.empty((batch, heads, n_blocks), dtype=torch.float32, device=q.device)
    ssa_bwd_dkdv[(n_blocks, batch * heads)](
        q, k, v, do, lse, delta, b, n, m, dk_part, dv_part, dn_part, *common, *m_strides,
        scale, heads, group, q_len, k_len, dim, lse[0].numel(), n_blocks, **flags, **config,
    )  # fmt: skip

    config = _config("dq", flags["BLOCK_D"], q.dtype)
    m_blocks = triton.cdiv(q_len, config["BLOCK_M"])
    db_part = torch.empty((batch, heads, m_blocks), dtype=torch.float32, device=q.device)
    ssa_bwd_dq[(m_blocks, batch * heads)](
        q, k, v, do, lse, delta, b, n, m, dq, db_part, *common, *dq.stride(), *m_strides,
        scale, heads, group, q_len, k_len, dim, lse[0].numel(), m_blocks, **flags, **config,
    )  # fmt: skip

    kv_heads = heads // group
    dk = dk_part.view(batch, kv_heads, group, k_len, dim).sum(2).to(k.dtype)
    dv = dv_part.view(batch, kv_heads, group, k_len, dim).sum(2).to(v.dtype)
    db = db_part.sum((0, 2)) / b  # Σ ∂L/∂y·y = b·∂L/∂b per head
    dn = dn_part.sum((0, 2)) if ssa else dn
    return dq, dk, dv, db.to(b.dtype), dn.to(n.dtype)


@_bwd.register_fake
def _bwd_fake(do, q, k, v, out, lse, b, n, mask, scale, causal, ssa):
    return tuple(torch.empty_like(t) for t in (q, k, v, b, n))


def _setup_context(ctx, inputs, output):
    q, k, v, b, n, mask, scale, causal, ssa = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, b, n, mask, out, lse)
    ctx.geometry = (scale, causal, ssa)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, d_out, d_lse):
    q, k, v, b, n, mask, out, lse = ctx.saved_tensors
    dq, dk, dv, db, dn = _bwd(d_out, q, k, v, out, lse, b, n, mask, *ctx.geometry)
    return dq, dk, dv, db, dn, None, None, None, None


_fwd.register_autograd(_backward, setup_context=_setup_context)


def triton_ssa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    b: torch.Tensor | float,
    n: torch.Tensor | float,
    *,
    scale: float | None = None,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    ssa: bool = True,
) -> torch.Tensor:
    """SSA attention [B, H, Q, D] of query [B, H, Q, D], key/value [B, H_kv, K, D] with ssacli's
    conventions (see :func:`ssacli.kernels.fused.ssa_attention`): b, n scalar or per query head and
    positive, gradients to q, k, v, b and n; ``causal`` bottom-right; ``mask`` boolean, broadcastable
    to [B, H, Q, K], True where visible; rows with no visible key give 0; GQA without repeating K/V.
    ``ssa=False`` runs the same kernels as plain softmax (the benchmark's control; b then multiplies
    the logits). float16, bfloat16 or float32, any length, head size up to 256. CUDA tensors, or CPU
    tensors when the kernels were imported under TRITON_INTERPRET=1."""
    batch, heads, q_len, dim = query.shape
    if key.dim() != 4 or heads % key.shape[1] or value.shape[:-1] != key.shape[:-1] or key.shape[-1] != dim:
        raise ValueError(
            f"bad shapes: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if value.shape[-1] != dim:
        raise ValueError(f"backend='triton' needs value's head size to equal query's ({dim})")
    if query.dtype not in DTYPES:
        raise TypeError(f"backend='triton' takes float16, bfloat16 or float32, got {query.dtype}")
    if dim > MAX_HEAD_DIM:
        raise ValueError(f"backend='triton' takes head sizes up to {MAX_HEAD_DIM}, got {dim}")
    if not (query.is_cuda or INTERPRETED):
        raise ValueError(
            "backend='triton' runs on CUDA tensors (on the CPU only under TRITON_INTERPRET=1, for tests)"
        )
    per_head = []
    for name, value_ in (("b", b), ("n", n)):
        t = torch.as_tensor(value_, device=query.device).to(torch.float32)
        if t.numel() not in (1, heads):
            raise ValueError(f"{name}: expected a scalar or {heads} per-head values, got {tuple(t.shape)}")
        per_head.append(t.reshape(-1).expand(heads).contiguous())
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be bool (True = visible), got {mask.dtype}")
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        mask = mask.expand(batch, heads, q_len, key.shape[2])
    scale = dim**-0.5 if scale is None else float(scale)
    key, value = key.to(query.dtype), value.to(query.dtype)
    out, _ = _fwd(query, key, value, *per_head, mask, scale, bool(causal and q_len > 1), bool(ssa))
    return out


__all__ = ["GPU_CONFIGS", "INTERPRETED", "triton_ssa_attention"]
