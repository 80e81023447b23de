"""Fused SSA attention: softmax(n·sgn(x)·log1p(b|x|)) @ V without a [q, k] weight matrix.

SSA is a softmax of a pointwise transform of the logit, so it has the same online-normalized
structure as FlashAttention: scan key blocks, keep a running max and sum per query row, and never
store more than one block of logits. Two implementations, both checked against the eager scorer
(tests/test_fused.py):

* :class:`BlockedSSA`, plain PyTorch on any device: forward and backward over query blocks × key
  blocks with the log-sum-exp saved for the backward (FlashAttention-2's recomputation scheme).
  Extra memory is one block, so peak memory grows linearly in T. It is the CPU path (flex_attention
  has no CPU backward) and the fallback everywhere.
* :func:`flex_ssa`, torch's ``flex_attention`` with an SSA ``score_mod`` (per-head b and n indexed by
  the head index), compiled: the CUDA path.

``b`` is folded into the query (b·x = (b·scale·q)·k), so a kernel only needs n; autograd carries the
gradient of b through that product. GQA keys and values are never repeated: query heads are grouped
under their K/V head and b, n broadcast per group.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

# Query rows and key columns of one block. 64 query rows keep each q·kᵀ product [64 × keys] in cache
# on a laptop-class CPU; 1024 keys per block means T ≤ 1024 needs no online rescaling at all.
# `python benchmarks/attention.py --blocks` compares other sizes (docs/performance.md).
BLOCK_ROWS = 64
BLOCK_KEYS = 1024
# Below this many logits per call (batch × heads × queries × keys) the eager block math is used: a
# compiled kernel saves less per call than it costs to compile (crossover measured in
# docs/performance.md).
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

    ``backend``: ``"blocked"`` (any device, forward and backward), ``"flex"`` (torch flex_attention,
    compiled; CUDA) or ``"auto"`` (flex on CUDA, blocked elsewhere). ``compile``: compile the blocked
    path's per-block math (None: when the call has at least COMPILE_MIN_LOGITS logits).
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
    if backend == "auto":
        backend = "flex" if query.is_cuda and dropout == 0.0 else "blocked"
    if backend == "flex":
        return flex_ssa(query, key, value, b, n, scale=scale, causal=causal, mask=mask, window=window)
    if backend != "blocked":
        raise ValueError(f"backend must be auto, blocked or flex, got {backend!r}")
    if compile is None:
        compile = batch * heads * q_len * k_len >= COMPILE_MIN_LOGITS
    # b·scale folded into q: the kernel sees y = b·x, and autograd takes ∂/∂b through this product.
    scaled = query.to(dtype) * (b * scale).view(1, heads, 1, 1)
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout > 0 else 0
    geometry = (causal, window, block_rows, block_keys, compile, dropout, seed)
    out = BlockedSSA.apply(scaled, key.to(dtype), value.to(dtype), n, mask, *geometry)
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
        keys = torch.arange(k_len, device=query.device)
        below = keys <= torch.arange(k_len - q_len, k_len, device=query.device)[:, None]
        mask = below if mask is None else mask & below
        causal = False
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=causal and q_len > 1,
        scale=scale, enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip


# ---- flex_attention (CUDA) ------------------------------------------------------------------------

_FLEX: dict[str, object] = {}


def flex_ssa(query, key, value, b, n, *, scale, causal=False, mask=None, window=None) -> torch.Tensor:
    """SSA through torch's flex_attention: a ``score_mod`` over per-head [H] tensors b and n.

    Compiled (the uncompiled flex_attention materializes every score). flex has no backward on CPU,
    so training on CPU uses :class:`BlockedSSA`; tests check this path's forward on CPU against the
    eager scorer, and scripts/gpu_bench.sh checks its gradients on a GPU before timing it.
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
                if len(_FLEX) > 64:  # many shapes (growing prompts): keep only the compiled function
                    _FLEX.clear()
                    _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
                _FLEX[key_] = create_block_mask(mask_mod, None, None, q_len, k_len, device=query.device)
            block_mask = _FLEX[key_]
        else:
            block_mask = create_block_mask(mask_mod, batch, heads, q_len, k_len, device=query.device)
    fn = _FLEX["fn"] if query.is_cuda else flex_attention
    out = fn(
        scaled, key, value, score_mod=score_mod, block_mask=block_mask, scale=1.0,
        enable_gqa=heads != key.shape[1],
    )  # fmt: skip
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


# ---- the per-block math (compiled when it pays) ---------------------------------------------------


def _forward_block(y: torch.Tensor, n: torch.Tensor):
    """p = exp(t − m) with t = n·sgn(y)·log1p|y| (hidden entries of y are −inf, so t = −inf), the
    row max m (−inf for a row with nothing visible) and the row sum of p."""
    # t is increasing in y, so the row max of t is t(max y): a read-only pass over y instead of
    # storing t to take its max (one memory pass fewer in the compiled kernel).
    y_max = y.amax(dim=-1, keepdim=True)
    m = n * torch.sign(y_max) * torch.log1p(torch.abs(y_max))
    t = n * torch.sign(y) * torch.log1p(torch.abs(y))
    p = torch.exp(t - torch.where(m == -math.inf, 0.0, m))
    return p, m, p.sum(dim=-1, keepdim=True)


def _backward_block(y, n, lse, dp, delta):
    """p, ∂L/∂y and this block's ∂L/∂n from the saved log-sum-exp (FlashAttention-2 backward)."""
    u = torch.sign(y) * torch.log1p(torch.abs(y))
    p = torch.exp(n * u - lse)
    dt = p * (dp - delta)  # softmax backward
    dn = torch.where(p > 0, dt * u, 0.0).sum(dim=(0, 2, 3), keepdim=True)  # u = −inf where hidden
    dy = dt * n / (1.0 + torch.abs(y))  # d t / d y = n / (1 + |y|), smooth through y = 0
    return p, dy, dn


_COMPILED: dict[str, object] = {}
_COMPILE_FAILED: list[str] = []


def compile_enabled() -> bool:
    """Whether the block math may be compiled: not switched off (SSACLI_COMPILE=0) and not failed."""
    return os.environ.get("SSACLI_COMPILE", "1") != "0" and not _COMPILE_FAILED


def _kernels(compiled: bool):
    if not compiled:
        return _forward_block, _backward_block
    if not _COMPILED:
        # dynamic: one compilation serves every block width (causal spans differ per query block).
        _COMPILED["fwd"] = torch.compile(_forward_block, dynamic=True)
        _COMPILED["bwd"] = torch.compile(_backward_block, dynamic=True)
    return _COMPILED["fwd"], _COMPILED["bwd"]


def _run(name: str, compiled: bool, *args):
    """Call block kernel ``name``; if compiling fails (no C++ compiler, an unsupported platform), say
    so once and go on with the eager kernel, which computes the same thing."""
    index = 0 if name == "fwd" else 1
    # A 1-row or 1-key block would be one more specialization to compile; it is cheap in eager.
    if compiled and compile_enabled() and min(args[0].shape[-2:]) > 1:
        try:
            return _kernels(True)[index](*args)
        except Exception as err:  # noqa: BLE001 - any compiler failure means "use eager"
            _COMPILE_FAILED.append(f"{type(err).__name__}: {err}".splitlines()[0])
            warnings.warn(
                f"ssacli: compiling the fused SSA kernel failed ({_COMPILE_FAILED[0]}); using the "
                "eager kernel (same results, slower). Set SSACLI_COMPILE=0 to skip the attempt.",
                RuntimeWarning,
                stacklevel=2,
            )
    return _kernels(False)[index](*args)


# ---- the blocked kernel ---------------------------------------------------------------------------


class _Plan:
    """Block geometry shared by forward and backward: query blocks, and for each the key span it can
    see (causal and window bounds cut it) split into key blocks."""

    def __init__(self, shape, k_len, causal, window, block_rows, block_keys, dropout=0.0, seed=0):
        _, _, _, q_len, _ = shape
        self.q_len, self.k_len = q_len, k_len
        self.offset = k_len - q_len  # bottom-right alignment: query i sits at key position offset + i
        self.causal, self.window = causal, window
        self.q_block, self.k_block = max(1, block_rows), max(1, block_keys)
        self.dropout, self.seed = dropout, seed

    def kept(self, p: torch.Tensor, rows: slice, cols: slice) -> torch.Tensor:
        """p with this block's dropout applied (kept weights scaled by 1/(1 − dropout)).

        The block's mask comes from its own generator seeded by (seed, block position), so the
        backward regenerates exactly the forward's mask without storing it."""
        if self.dropout == 0.0:
            return p
        gen = torch.Generator(device=p.device)
        gen.manual_seed((self.seed + rows.start * 1_000_003 + cols.start) % 2**63)
        keep = torch.rand(p.shape, generator=gen, device=p.device, dtype=p.dtype) >= self.dropout
        return p * keep / (1.0 - self.dropout)

    def blocks(self):
        """(query rows, [key slices]) for every query block that can see at least one key."""
        for r0 in range(0, self.q_len, self.q_block):
            r1 = min(r0 + self.q_block, self.q_len)
            lo, hi = 0, self.k_len
            if self.causal:
                hi = min(hi, self.offset + r1)
            if self.window is not None:
                lo = max(lo, self.offset + r0 - self.window + 1)
            if hi > lo:
                spans = [slice(c, min(c + self.k_block, hi)) for c in range(lo, hi, self.k_block)]
                yield slice(r0, r1), spans

    def hide_(self, y: torch.Tensor, rows: slice, cols: slice, mask) -> torch.Tensor:
        """Set hidden entries of the logits block y [B, H_kv, G, rows, cols] to −inf, in place.

        Causal and window masks touch only the columns they can hide (the diagonal band)."""
        pos = torch.arange(rows.start, rows.stop, device=y.device)[:, None] + self.offset
        if self.causal:
            first = max(self.offset + rows.start + 1, cols.start)  # row 0 sees keys < first
            if first < cols.stop:
                keys = torch.arange(first, cols.stop, device=y.device)
                y[..., first - cols.start :].masked_fill_(keys > pos, -math.inf)
        if self.window is not None:
            last = min(self.offset + rows.stop - 1 - self.window, cols.stop - 1)  # last row hides keys ≤ last
            if last >= cols.start:
                keys = torch.arange(cols.start, last + 1, device=y.device)
                y[..., : last + 1 - cols.start].masked_fill_(pos - keys >= self.window, -math.inf)
        if mask is not None:
            y.masked_fill_(~mask[..., rows, cols], -math.inf)
        return y


def _group(t: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, H, Q, D] -> [B, H_kv, G, Q, D] (a view): query heads under the K/V head they share."""
    b, h, q, d = t.shape
    return t.view(b, kv_heads, h // kv_heads, q, d)


def _mask_view(mask: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A [B|1, H|1, Q, K] mask as [B|1, H_kv|1, G|1, Q, K], broadcastable against grouped logits."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.shape[1] == 1:
        return mask.unsqueeze(2)
    return mask.reshape(mask.shape[0], kv_heads, mask.shape[1] // kv_heads, *mask.shape[2:])


class BlockedSSA(torch.autograd.Function):
    """out = softmax(n·sgn(y)·log1p|y|) @ v with y = q·kᵀ, blocked; saves only out and the LSE.

    query [B, H, Q, D] (already multiplied by b·scale), key/value [B, H_kv, K, D], n [H].
    """

    @staticmethod
    def forward(ctx, query, key, value, n, mask, *geometry):
        with torch.autocast(query.device.type, enabled=False):  # fp32 block math under autocast too
            return BlockedSSA._forward(ctx, query, key, value, n, mask, *geometry)

    @staticmethod
    def backward(ctx, grad_out):
        with torch.autocast(grad_out.device.type, enabled=False):
            return BlockedSSA._backward(ctx, grad_out)

    @staticmethod
    def _forward(ctx, query, key, value, n, mask, causal, window, rows, keys, compiled, dropout, seed):
        kv_heads = key.shape[1]
        q5 = _group(query, kv_heads)
        batch, _, groups, q_len, dim = q5.shape
        n4 = n.reshape(1, -1, 1, 1)  # kernels see [B, H, rows, keys]: fewer shapes to compile for
        mask5 = None if mask is None else _mask_view(mask, kv_heads)
        plan = _Plan(q5.shape, key.shape[-2], causal, window, rows, keys, dropout, seed)
        out = query.new_zeros(batch, kv_heads, groups, q_len, value.shape[-1])
        lse = query.new_full((batch, kv_heads, groups, q_len, 1), math.inf)
        key_t = key.transpose(-1, -2).contiguous()  # [B, H_kv, D, K]: contiguous columns per block
        for rows, spans in plan.blocks():
            width = rows.stop - rows.start
            qb = q5[:, :, :, rows].reshape(batch, kv_heads, groups * width, dim)
            acc = row_max = row_sum = None
            for cols in spans:
                y = torch.matmul(qb, key_t[..., cols]).view(batch, kv_heads, groups, width, -1)
                p, m, s = _run("fwd", compiled, plan.hide_(y, rows, cols, mask5).flatten(1, 2), n4)
                p = plan.kept(p.view(batch, kv_heads, groups * width, -1), rows, cols)
                pv = torch.matmul(p, value[..., cols, :])
                pv = pv.view(batch, kv_heads, groups, width, -1)
                m, s = m.view(batch, kv_heads, groups, width, 1), s.view(batch, kv_heads, groups, width, 1)
                if acc is None:
                    acc, row_max, row_sum = pv, m, s
                    continue
                new_max = torch.maximum(row_max, m)  # online normalization across key blocks
                ref = torch.where(new_max == -math.inf, 0.0, new_max)
                old, cur = torch.exp(row_max - ref), torch.exp(m - ref)
                acc, row_sum, row_max = acc * old + pv * cur, row_sum * old + s * cur, new_max
            seen = row_sum > 0
            out[:, :, :, rows] = acc / torch.where(seen, row_sum, 1.0)
            lse[:, :, :, rows] = torch.where(seen, row_max + row_sum.log(), math.inf)
        out = out.view(query.shape[:-1] + (value.shape[-1],))
        ctx.save_for_backward(query, key, value, n, out, lse)
        ctx.mask, ctx.plan, ctx.compiled = mask5, plan, compiled
        return out

    @staticmethod
    def _backward(ctx, grad_out):
        query, key, value, n, out, lse = ctx.saved_tensors
        mask5, plan, compiled = ctx.mask, ctx.plan, ctx.compiled
        kv_heads = key.shape[1]
        q5, go5 = _group(query, kv_heads), _group(grad_out.contiguous(), kv_heads)
        batch, _, groups, _, dim = q5.shape
        n4 = n.reshape(1, -1, 1, 1)
        delta = (go5 * _group(out, kv_heads)).sum(dim=-1, keepdim=True)  # rowsum(dO ∘ O)
        dq = torch.zeros_like(q5)
        dk, dv, dn = torch.zeros_like(key), torch.zeros_like(value), torch.zeros_like(n4)
        key_t = key.transpose(-1, -2).contiguous()
        value_t = value.transpose(-1, -2).contiguous()
        for rows, spans in plan.blocks():
            width = rows.stop - rows.start
            qb = q5[:, :, :, rows].reshape(batch, kv_heads, groups * width, dim)
            gob = go5[:, :, :, rows].reshape(batch, kv_heads, groups * width, go5.shape[-1])
            dqb = None
            for cols in spans:
                y = torch.matmul(qb, key_t[..., cols]).view(batch, kv_heads, groups, width, -1)
                dp = plan.kept(torch.matmul(gob, value_t[..., cols]), rows, cols).view_as(y)
                p, dy, dn_part = _run(
                    "bwd", compiled, plan.hide_(y, rows, cols, mask5).flatten(1, 2), n4,
                    lse[:, :, :, rows].flatten(1, 2), dp.flatten(1, 2), delta[:, :, :, rows].flatten(1, 2),
                )  # fmt: skip
                dn += dn_part
                flat = (batch, kv_heads, groups * width, -1)
                p, dy = plan.kept(p.view(flat), rows, cols), dy.view(flat)
                dv[..., cols, :] += torch.matmul(p.transpose(-1, -2), gob)
                dk[..., cols, :] += torch.matmul(dy.transpose(-1, -2), qb)
                part = torch.matmul(dy, key[..., cols, :])
                dqb = part if dqb is None else dqb + part
            dq[:, :, :, rows] = dqb.view(batch, kv_heads, groups, width, dim)
        return dq.view_as(query), dk, dv, dn.view(-1), *([None] * 8)
