"""Fused SSA attention: softmax(n·sgn(x)·log1p(b|x|)) @ V without a [q, k] weight matrix.

SSA is a softmax of a pointwise transform of the logit, so it has the same online-normalized
structure as FlashAttention: scan key blocks, keep a running max and sum per query row, and never
store more than one block of logits. Which implementation runs a call is decided by
:func:`ssacli.kernels.routing.choose_backend` alone, from the call's facts; each is checked against
the eager scorer (tests/kernels/test_fused.py, tests/kernels/test_triton_ssa.py):

* the native kernels on the CPU in float32 (ssacli.kernels.native, torch.library custom ops): one
  FlashAttention loop per call on torch's sgemm, forward and backward (``"one-loop"``), or, for the
  calls it cannot serve (a mask tensor, dropout, no usable sgemm), the block loop of
  :class:`~ssacli.kernels.blocked.BlockedSSA` with the native block math (``"native-blocks"``);
* the Triton kernels on CUDA (ssacli/kernels/triton_ssa.py, the optional ``triton`` package), and
  :func:`flex_ssa`, torch's ``flex_attention`` with an SSA ``score_mod``, compiled, for the CUDA
  calls whose n needs no gradient (kept until a GPU run times it against Triton);
* the block loop with the torch block math (``"torch-blocks"``) where none of those runs (float64, no C
  compiler, the CUDA calls Triton does not take). Extra memory is one block, so peak memory grows
  linearly in T on every path.

``b`` is folded into the query (b·x = (b·scale·q)·k), so a kernel only needs n; autograd carries the
gradient of b through that product. GQA keys and values are never repeated: query heads are grouped
under their K/V head and b, n broadcast per group.
"""

from __future__ import annotations

import torch

from . import native, routing
from .blocked import BLOCK_KEYS, BLOCK_ROWS, BlockedCall, BlockedSSA
from .ssa_transform import ssa_transform
from .visibility import band, causal_visibility


def ssa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    b: torch.Tensor | float,
    n: torch.Tensor | float,
    *,
    scale: float | None = None,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    window: int | None = None,
    dropout: float = 0.0,
    backend: str = "auto",
    block_rows: int = BLOCK_ROWS,
    block_keys: int = BLOCK_KEYS,
) -> torch.Tensor:
    """SSA attention output [B, H, Q, D] for query [B, H, Q, D] and key/value [B, H_kv, K, D].

    ``b`` and ``n`` are positive, scalar or one per query head ([H]); gradients flow to both.
    ``causal`` and ``window`` are bottom-right aligned (query i sits at key position K − Q + i, as with
    a KV cache): key j is visible iff j ≤ pos_i and, with a window, pos_i − j < window. ``mask`` is
    a boolean tensor broadcastable to [B, H, Q, K], True where visible; it combines with the others.
    Rows with no visible key give 0. H must be a multiple of H_kv (grouped-query attention; K/V are
    never repeated). ``dropout`` drops attention weights after normalization, as nn.Dropout does in
    transformers' eager path; its mask is drawn from a seed taken from torch's default generator, so
    ``torch.manual_seed`` makes it reproducible (the backward regenerates it from the seed).

    ``backend`` (ssacli.kernels.routing.BACKENDS): ``"auto"`` or ``"fused"`` (the path
    :func:`ssacli.kernels.routing.choose_backend` picks; ``"auto"`` reads ``SSACLI_BACKEND`` first) or
    one path forced (tests and benchmarks): ``"one-loop"`` (the native one-loop kernels: CPU, float32
    math, torch's sgemm found; no mask tensor or dropout), ``"native-blocks"`` (the block loop with the
    native block math: CPU, float32 math), ``"torch-blocks"`` (the block loop with the torch block
    math: anywhere), ``"flex"`` (torch flex_attention: compiled on CUDA, forward and backward; on the
    CPU forward only and uncompiled, the CUDA path's score_mod and mask_mod checked without a GPU; no
    dropout) or ``"triton"`` (the Triton kernels, CUDA; float16, bfloat16 or float32; no window or
    dropout; needs the ``triton`` package). A forced path that cannot run here is a ValueError, and so
    is ``"eager"`` (the reference is the scorer's own forward, ssacli.attention).
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[-2]
    if key.dim() != 4 or heads % kv_heads or value.shape[:-1] != key.shape[:-1] or key.shape[-1] != dim:
        raise ValueError(
            f"bad shapes: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be bool (True = visible), got {mask.dtype}")
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        # A view with full query and key axes: the kernels slice blocks out of it.
        mask = mask.expand(mask.shape[0], mask.shape[1], q_len, k_len)
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    scale = dim**-0.5 if scale is None else scale
    causal = causal and q_len > 1  # one query, bottom-right aligned, sees every key (cache decoding)
    dtype = torch.promote_types(query.dtype, torch.float32)
    b = _per_head(b, heads, dtype, query.device)
    n = _per_head(n, heads, dtype, query.device)
    leaves = (query, key, value, b, n)
    training = torch.is_grad_enabled() and any(t.requires_grad for t in leaves)
    backend = routing.requested(backend)
    if backend == "eager":
        raise ValueError(
            "ssa_attention runs the fused paths; the eager reference is the SSA scorer's forward"
        )
    # the native library is looked up (and built) only where it may run the call, triton's presence
    # only where auto decides: a forced Triton, flex or torch path looks nothing up
    deciding = backend in ("auto", "fused")
    may_be_native = (deciding or backend in ("one-loop", "native-blocks")) and routing.native_fits(
        query.device.type, dtype
    )
    call = routing.Call(
        device=query.device.type, dtype=query.dtype, backend=backend, training=training,
        n_grad=torch.is_grad_enabled() and n.requires_grad, dropout=dropout, window=window is not None,
        head_dim=dim, triton=deciding and routing.triton_installed(), mask=mask is not None,
        native=native.kernels_here() if may_be_native else "",
    )  # fmt: skip
    path = routing.choose_backend(call)
    if path == "triton":
        if window is not None or dropout > 0.0:
            raise ValueError("backend='triton' has no window or dropout yet: use 'torch-blocks' or 'flex'")
        try:  # the optional triton package, imported on first use
            from .triton_ssa import triton_ssa_attention
        except ImportError as err:
            need = "backend='triton' needs the triton package (pip install 'ssacli[gpu]')"
            raise ValueError(f"{need}: {err}") from err
        return triton_ssa_attention(query, key, value, b, n, scale=scale, causal=causal, mask=mask)
    if path == "flex":
        if training and not query.is_cuda:
            raise ValueError("backend='flex' has no backward on the CPU: use 'auto' to train")
        if dropout > 0.0:
            raise ValueError("backend='flex' has no dropout: use 'auto' or 'torch-blocks'")
        return flex_ssa(query, key, value, b, n, scale=scale, causal=causal, mask=mask, window=window)
    # b·scale folded into q: the kernel sees y = b·x, and autograd takes ∂/∂b through this product.
    scaled = query.to(dtype) * (b * scale).view(1, heads, 1, 1)
    if path == "one-loop":
        # the whole call in one native loop, forward and backward: each logit tile stays in cache
        # between its two products (the block loop writes it to memory and reads it back)
        with torch.autocast(query.device.type, enabled=False):
            geometry = dict(causal=causal, window=window, block_rows=block_rows, block_keys=block_keys)
            out = native.ssa_attention(scaled, key.to(dtype), value.to(dtype), n, **geometry)
        return out.to(query.dtype)
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout > 0 else 0
    blocked = BlockedCall(causal, window, block_rows, block_keys, dropout, seed, path)
    out = BlockedSSA.apply(scaled, key.to(dtype), value.to(dtype), n, mask, blocked)
    return out.to(query.dtype)


def _per_head(value: torch.Tensor | float, heads: int, dtype, device) -> torch.Tensor:
    value = torch.as_tensor(value, device=device).to(dtype)
    if value.numel() not in (1, heads):
        raise ValueError(f"expected a scalar or {heads} per-head values, got shape {tuple(value.shape)}")
    return value.reshape(-1).expand(heads)


def softmax_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Softmax attention through torch's SDPA, with ssacli's conventions: bottom-right causal (SDPA's
    ``is_causal`` is top-left, which differs once q_len < k_len) and GQA without repeated K/V."""
    q_len, k_len = query.shape[-2], key.shape[-2]
    if causal and q_len != k_len:
        below = causal_visibility(q_len, k_len, query.device)
        mask = below if mask is None else mask & below
        causal = False
    empty = None
    if mask is not None:
        # A row with no visible key (a padded query) is NaN in some SDPA backends (float64's math
        # kernel), and a NaN there reaches real rows through the next layer's 0-weight keys. Such
        # rows see every key instead (no NaN forward or backward), and their output is set to 0.
        empty = ~mask.any(dim=-1, keepdim=True)
        mask = mask | empty
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=causal and q_len > 1,
        scale=scale, enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip
    return out if empty is None else out.masked_fill(empty, 0.0)


# ---- flex_attention (CUDA) ------------------------------------------------------------------------

_FLEX: dict[str, object] = {}
# Compiled variants of flex_attention kept at once: one per (shape, grad mode), the same bound as the
# block-mask cache below. torch's default recompile limit (8 per function) is reached by one training
# run that also evaluates at a few lengths; past it dynamo silently runs flex_attention uncompiled,
# which materializes every score (measured on an H200: fwd+bwd at T = 4096, 1.0 ms for SDPA against
# 2,035 ms, docs/performance.md "On a GPU").
FLEX_VARIANTS = 64


def compiled_call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` for a torch.compile'd ``fn``, with dynamo's recompile limit raised to
    :data:`FLEX_VARIANTS` for this call only (the process's own setting is left as it was)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    with config.patch(**{name: max(getattr(config, name), FLEX_VARIANTS)}):
        return fn(*args, **kwargs)


def flex_ssa(query, key, value, b, n, *, scale, causal=False, mask=None, window=None) -> torch.Tensor:
    """SSA through torch's flex_attention: a ``score_mod`` over per-head [H] tensors b and n.

    Compiled on CUDA (one compilation per shape); on the CPU uncompiled (it then materializes every
    score), forward only: not a CPU path, but the CUDA path's ``score_mod`` and ``mask_mod`` run where
    the tests can check them against the eager scorer; scripts/gpu_bench.sh checks its gradients on a
    GPU before timing it.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    if not torch.is_grad_enabled():  # flex refuses CPU inputs that require grad, even without grad
        query, key, value = query.detach(), key.detach(), value.detach()
    batch, heads, q_len, _ = query.shape
    k_len, offset = key.shape[-2], key.shape[-2] - query.shape[-2]
    # b·scale folded into q as in the blocked path; score = y = b·x.
    scaled = query * (b * scale).view(1, heads, 1, 1).to(query.dtype)
    n = n.contiguous()

    def score_mod(score, bi, h, qi, ki):
        return ssa_transform(score, n[h])

    block_mask = None
    if causal or window is not None or mask is not None:
        full = None if mask is None else mask.expand(batch, heads, q_len, k_len)

        def mask_mod(bi, h, qi, ki):
            keep = band(qi, ki, offset, causal, window)
            if full is not None:
                keep = keep & full[bi, h, qi, ki]
            return keep

        if full is None:  # structure only: the same block mask serves every later call of this shape
            key_ = ("block_mask", causal, window, q_len, k_len, str(query.device))
            if key_ not in _FLEX:
                if len(_FLEX) > FLEX_VARIANTS:  # many shapes (growing prompts): keep only the functions
                    kept = {"fn": _FLEX["fn"]}
                    _FLEX.clear()
                    _FLEX.update(kept)
                _FLEX[key_] = create_block_mask(mask_mod, None, None, q_len, k_len, device=query.device)
            block_mask = _FLEX[key_]
        else:
            block_mask = create_block_mask(mask_mod, batch, heads, q_len, k_len, device=query.device)
    gqa = heads != key.shape[1]
    arguments = {"score_mod": score_mod, "block_mask": block_mask, "scale": 1.0, "enable_gqa": gqa}
    if query.is_cuda:
        out = compiled_call(_FLEX["fn"], scaled, key, value, **arguments)
    else:
        out = flex_attention(scaled, key, value, **arguments)
    if mask is not None or window is not None:  # rows with nothing visible come out 0, as in eager
        any_visible = _rows_with_keys(mask, causal, window, batch, heads, q_len, k_len, query.device)
        out = out * any_visible.to(out.dtype)
    return out


def _rows_with_keys(mask, causal, window, batch, heads, q_len, k_len, device) -> torch.Tensor:
    """[B, H, Q, 1]: whether each query row sees at least one key (for zeroing empty rows)."""
    vis = causal_visibility(q_len, k_len, device, window=window, causal=causal)
    if mask is not None:
        vis = vis & mask
    return vis.expand(batch, heads, q_len, k_len).any(dim=-1, keepdim=True)
