"""Fused SSA attention: softmax(n·sgn(x)·log1p(b|x|)) @ V without a [q, k] weight matrix.

SSA is a softmax of a pointwise transform of the logit, so it has the same online-normalized
structure as FlashAttention: scan key blocks, keep a running max and sum per query row, and never
store more than one block of logits. Three implementations, each checked against the eager scorer
(tests/kernels/test_fused.py, tests/kernels/test_triton_ssa.py); which one runs a call is decided by
:func:`ssacli.kernels.routing.choose_backend` alone:

* :class:`~ssacli.kernels.blocked.BlockedSSA` (ssacli/kernels/blocked.py), on any device: forward and
  backward over query blocks × key blocks with the log-sum-exp saved for the backward
  (FlashAttention-2's recomputation scheme), in one of three forms: the native one-loop kernels, the
  block loop with the native block math (both CPU, float32) or with the torch block math. Extra
  memory is one block, so peak memory grows linearly in T. It is the CPU path and the fallback.
* :func:`flex_ssa`, torch's ``flex_attention`` with an SSA ``score_mod`` (per-head b and n indexed by
  the head index), compiled: the CUDA path where n needs no gradient, and CPU inference where
  nothing native is built.
* ``backend="triton"`` (ssacli/kernels/triton_ssa.py, the optional ``triton`` package): FlashAttention-2
  forward and backward in Triton with SSA's transform, registered as torch.library custom ops; on
  CUDA the ``auto`` path of calls that learn n.

``b`` is folded into the query (b·x = (b·scale·q)·k), so a kernel only needs n; autograd carries the
gradient of b through that product. GQA keys and values are never repeated: query heads are grouped
under their K/V head and b, n broadcast per group.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import torch

from . import routing
from .blocked import BLOCK_KEYS, BLOCK_ROWS, BlockedCall, BlockedSSA
from .compiled import compile_enabled
from .compiled import should_compile as setting_allows

# Below this many logits per call (batch × heads × queries × keys) the torch block math runs
# uncompiled: compiling saves a few ms per call at most there, against seconds of compiling (crossover
# measured in docs/performance.md).
COMPILE_MIN_LOGITS = 2**20


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
    compile: bool | None = None,
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

    ``backend``: ``"auto"`` (the path :func:`ssacli.kernels.routing.choose_backend` picks; each of its
    rules cites the benchmark row that shows its path winning there), ``"blocked"`` (the blocked
    kernel, any device, forward and backward, in the best of its three forms here) or one path forced
    (tests and benchmarks): ``"one-loop"`` (the native one-loop kernels: CPU, float32 math, torch's
    sgemm found; no mask tensor or dropout), ``"native-blocks"`` (the block loop with the native block
    math: CPU, float32 math), ``"torch-blocks"`` (the block loop with the torch block math: anywhere),
    ``"flex"`` (torch flex_attention, compiled; forward and backward on CUDA, forward only on the CPU,
    no dropout) or ``"triton"`` (the Triton kernels, CUDA; float16, bfloat16 or float32; no window or
    dropout; needs the ``triton`` package). A forced path that cannot run here is a ValueError.
    ``compile``: compile the torch block math (None: :func:`should_compile` decides); on the CPU's
    flex path, False runs flex uncompiled (it then materializes every score).
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
    call = routing.Call(
        device=query.device.type, dtype=query.dtype, logits=batch * heads * q_len * k_len,
        training=training, n_grad=torch.is_grad_enabled() and n.requires_grad, dropout=dropout,
        # a key/value cache's offset is a constant of flex's mask: each new offset would compile again
        masked=mask is not None or window is not None or q_len != k_len, window=window is not None,
        # (triton looked up for auto only: a forced backend decides nothing, and torch.compile's
        # full graph cannot trace the lookup)
        head_dim=dim, triton=backend == "auto" and routing.triton_installed(),
        mask=mask is not None, backend=backend,
    )  # fmt: skip
    backend = routing.choose_backend(call)
    if backend == "triton":
        if window is not None or dropout > 0.0:
            raise ValueError("backend='triton' has no window or dropout yet: use 'blocked' or 'flex'")
        try:  # the optional triton package, imported on first use
            from .triton_ssa import triton_ssa_attention
        except ImportError as err:
            need = "backend='triton' needs the triton package (pip install 'ssacli[gpu]')"
            raise ValueError(f"{need}: {err}") from err
        return triton_ssa_attention(query, key, value, b, n, scale=scale, causal=causal, mask=mask)
    if backend == "flex":
        if training and not query.is_cuda:
            raise ValueError("backend='flex' has no backward on the CPU: use 'blocked' (or 'auto') to train")
        if dropout > 0.0:
            raise ValueError("backend='flex' has no dropout: use 'blocked'")
        # Compiled on the CPU only without a window or mask tensor: with either, torch 2.13's CPU code
        # generation fails ("cur_kvSplitSize0 was not declared"), so such calls (forced: auto never
        # sends them to flex) run flex uncompiled, which checks flex's score_mod and mask_mod on the
        # CPU for the CUDA path.
        structured = mask is not None or window is not None
        compiled = compile is not False and (query.is_cuda or (compile_enabled() and not structured))
        try:
            geometry = dict(scale=scale, causal=causal, mask=mask, window=window)
            return flex_ssa(query, key, value, b, n, compiled=compiled, **geometry)
        except Exception as err:  # noqa: BLE001 - a compiler failure on the CPU means "use blocked"
            if query.is_cuda or not compiled:
                raise
            routing.FLEX_CPU_FAILED.append(f"{type(err).__name__}: {err}".splitlines()[0][:200])
            warnings.warn(
                f"ssacli: compiling flex_attention on the CPU failed ({routing.FLEX_CPU_FAILED[0]}); using "
                "the blocked kernel (same results, slower).",
                RuntimeWarning,
                stacklevel=2,
            )
            backend = routing.choose_backend(replace(call, backend="blocked"))
    if compile is None:
        compile = should_compile(batch * heads * q_len * k_len, training, query.device.type)
    # b·scale folded into q: the kernel sees y = b·x, and autograd takes ∂/∂b through this product.
    scaled = query.to(dtype) * (b * scale).view(1, heads, 1, 1)
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout > 0 else 0
    blocked = BlockedCall(causal, window, block_rows, block_keys, compile, dropout, seed, backend)
    out = BlockedSSA.apply(scaled, key.to(dtype), value.to(dtype), n, mask, blocked)
    return out.to(query.dtype)


def should_compile(logits: int, training: bool, device: str = "cpu") -> bool:
    """The default for ``compile=None`` (the torch block math only). SSACLI_COMPILE=0 never compiles,
    =1 always does; unset (or auto), only CPU training calls with at least COMPILE_MIN_LOGITS logits:
    a training run makes enough such calls to repay the seconds of compiling, a one-off evaluation
    usually does not (docs/performance.md, "Compiling the block math: the crossover", measured on the
    CPU). Not on a GPU: no row shows compiled block math winning there, and the one GPU row that
    compiled it (diagnose's statistics, H200 run 2: 257.5 ms compiled, 192.9 ms eager at 4,096
    tokens) shows it losing: each block is microseconds of work and a compiled call's guards cost more."""
    return setting_allows(device == "cpu" and training and logits >= COMPILE_MIN_LOGITS)


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
        keys = torch.arange(k_len, device=query.device)
        below = keys <= torch.arange(k_len - q_len, k_len, device=query.device)[:, None]
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


def flex_ssa(
    query, key, value, b, n, *, scale, causal=False, mask=None, window=None, compiled=True
) -> torch.Tensor:
    """SSA through torch's flex_attention: a ``score_mod`` over per-head [H] tensors b and n.

    ``compiled`` (the uncompiled flex_attention materializes every score): on CUDA one compilation
    per shape; on the CPU with dynamic shapes, so one compilation (seconds) serves every length. flex
    has no backward on the CPU, so training there uses :class:`BlockedSSA`; tests check this path's
    forward on the CPU against the eager scorer, and scripts/gpu_bench.sh checks its gradients on a
    GPU before timing it.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    if "cpu" not in _FLEX:
        _FLEX["cpu"] = torch.compile(flex_attention, dynamic=True)
    if not torch.is_grad_enabled():  # flex refuses CPU inputs that require grad, even without grad
        query, key, value = query.detach(), key.detach(), value.detach()
    batch, heads, q_len, _ = query.shape
    k_len, offset = key.shape[-2], key.shape[-2] - query.shape[-2]
    # b·scale folded into q as in the blocked path; score = y = b·x.
    scaled = query * (b * scale).view(1, heads, 1, 1).to(query.dtype)
    n = n.contiguous()

    def score_mod(score, bi, h, qi, ki):
        return n[h] * torch.sign(score) * torch.log1p(torch.abs(score))

    block_mask = None
    if causal or window is not None or mask is not None:
        full = None if mask is None else mask.expand(batch, heads, q_len, k_len)

        def mask_mod(bi, h, qi, ki):
            keep = ki >= 0
            if causal:
                keep = keep & (ki <= qi + offset)
            if window is not None:
                keep = keep & (qi + offset - ki < window)
            if full is not None:
                keep = keep & full[bi, h, qi, ki]
            return keep

        if full is None:  # structure only: the same block mask serves every later call of this shape
            key_ = ("block_mask", causal, window, q_len, k_len, str(query.device))
            if key_ not in _FLEX:
                if len(_FLEX) > FLEX_VARIANTS:  # many shapes (growing prompts): keep only the functions
                    kept = {name: _FLEX[name] for name in ("fn", "cpu")}
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
    elif compiled:
        out = compiled_call(_FLEX["cpu"], scaled, key, value, **arguments)
    else:
        out = flex_attention(scaled, key, value, **arguments)
    if mask is not None or window is not None:  # rows with nothing visible come out 0, as in eager
        any_visible = _rows_with_keys(mask, causal, window, offset, batch, heads, q_len, k_len, query.device)
        out = out * any_visible.to(out.dtype)
    return out


def _rows_with_keys(mask, causal, window, offset, batch, heads, q_len, k_len, device) -> torch.Tensor:
    """[B, H, Q, 1]: whether each query row sees at least one key (for zeroing empty rows)."""
    pos = torch.arange(q_len, device=device)[:, None] + offset
    keys = torch.arange(k_len, device=device)
    vis = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        vis = vis & (keys <= pos)
    if window is not None:
        vis = vis & (pos - keys < window)
    if mask is not None:
        vis = vis & mask
    return vis.expand(batch, heads, q_len, k_len).any(dim=-1, keepdim=True)
