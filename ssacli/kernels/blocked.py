"""The blocked SSA kernel: online-normalized forward and recomputing backward, block by block.

FlashAttention-2's scheme with SSA's transform t = n·sgn(y)·log1p|y| in place of the raw logit:
the forward scans key blocks keeping a running row max and sum and saves only the output and the
log-sum-exp; the backward recomputes each block's weights from them. One block of logits is alive at
a time, so extra memory is O(block), not O(T²). The elementwise math of a block (transform, max,
exp, sums; in the backward the softmax and transform derivatives) runs in one of two forms, chosen by
ssacli.kernels.routing.choose_backend: the native block pass (``"native-blocks"``: ssacli.kernels.native,
CPU float32, the causal band applied inside), for the calls the native one loop cannot serve (a mask
tensor, dropout, no usable sgemm); or the torch block math (``"torch-blocks"``), where nothing native
or Triton runs. The matrix products are torch's either way.

Inputs arrive prepared by :func:`ssacli.kernels.fused.ssa_attention`: the query already multiplied by
b·scale (so y = b·x), keys and values un-repeated for GQA, n per query head, a boolean mask
expanded to full query and key axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import native_blocks
from .ssa_transform import ssa_transform
from .visibility import band as visible_band

# Query rows and key columns of one block (and of the one-loop kernels' tasks and tiles: the same
# defaults, docs/performance.md "Block sizes": every setting measured lies within the machine's noise
# of the others); 1024 keys per block means T <= 1024 needs no online rescaling at all.
# `python benchmarks/attention.py --blocks` compares other sizes.
BLOCK_ROWS = 128
BLOCK_KEYS = 1024


# ---- the torch block math -------------------------------------------------------------------------


def _forward_block(y: torch.Tensor, n: torch.Tensor):
    """p = exp(t − m) with t = n·sgn(y)·log1p|y| (hidden entries of y are −inf, so t = −inf), the
    row max m (−inf for a row with nothing visible) and the row sum of p."""
    # t is increasing in y, so the row max of t is t(max y): a read-only pass over y instead of
    # storing t to take its max.
    m = ssa_transform(y.amax(dim=-1, keepdim=True), n)
    t = ssa_transform(y, n)
    p = torch.exp(t - torch.where(m == -math.inf, 0.0, m))
    return p, m, p.sum(dim=-1, keepdim=True)


def _backward_block(y, n, lse, dp, delta):
    """p, ∂L/∂y and this block's ∂L/∂n from the saved log-sum-exp (FlashAttention-2 backward)."""
    u = ssa_transform(y, 1.0)  # ∂t/∂n
    p = torch.exp(n * u - lse)
    dt = p * (dp - delta)  # softmax backward
    dn = torch.where(p > 0, dt * u, 0.0).sum(dim=(0, 2, 3), keepdim=True)  # u = −inf where hidden
    dy = dt * n / (1.0 + torch.abs(y))  # d t / d y = n / (1 + |y|), smooth through y = 0
    return p, dy, dn


def _native_exponents(n: torch.Tensor, form: str) -> torch.Tensor | None:
    """n [H] as the native block pass takes it where ``form`` (ssacli.kernels.routing.choose_backend's
    choice: "native-blocks" or "torch-blocks") runs it; None: the torch block math."""
    return None if form == "torch-blocks" else n.detach().to(torch.float32).contiguous()


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

    def band(self, rows: slice, cols: slice) -> dict:
        """The block's causal band for a kernel that applies it itself (ssacli.kernels.native): row i
        sits at the block's column diagonal + i (causal: it sees columns up to there; a window
        reaches back from there)."""
        return dict(diagonal=self.offset + rows.start - cols.start, causal=self.causal, window=self.window)

    def hide_(self, y: torch.Tensor, rows: slice, cols: slice, mask, band: bool = True) -> torch.Tensor:
        """Set hidden entries of the logits block y [B, H_kv, G, rows, cols] to −inf, in place.

        Causal and window masks touch only the columns they can hide (the diagonal band); ``band``
        False leaves them to the caller (the mask tensor still applies)."""
        if not band:
            if mask is not None:
                y.masked_fill_(~mask[..., rows, cols], -math.inf)
            return y
        queries = torch.arange(rows.start, rows.stop, device=y.device)[:, None]
        if self.causal:
            first = max(self.offset + rows.start + 1, cols.start)  # row 0 sees keys < first
            if first < cols.stop:
                keys = torch.arange(first, cols.stop, device=y.device)
                y[..., first - cols.start :].masked_fill_(
                    ~visible_band(queries, keys, self.offset), -math.inf
                )
        if self.window is not None:
            last = min(self.offset + rows.stop - 1 - self.window, cols.stop - 1)  # last row hides keys ≤ last
            if last >= cols.start:
                keys = torch.arange(cols.start, last + 1, device=y.device)
                hidden = ~visible_band(queries, keys, self.offset, causal=False, window=self.window)
                y[..., : last + 1 - cols.start].masked_fill_(hidden, -math.inf)
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


@dataclass(frozen=True)
class BlockedCall:
    """The non-tensor arguments of :class:`BlockedSSA` as one value (``BlockedSSA.apply(query, key,
    value, n, mask, call)``): autograd passes it through as it is, and the backward returns None for it
    once instead of once per option. ``form`` is the block math :mod:`~ssacli.kernels.routing` chose:
    "native-blocks" or "torch-blocks"."""

    causal: bool
    window: int | None
    block_rows: int
    block_keys: int
    dropout: float
    seed: int
    form: str


class BlockedSSA(torch.autograd.Function):
    """out = softmax(n·sgn(y)·log1p|y|) @ v with y = q·kᵀ, blocked; saves only out and the LSE.

    query [B, H, Q, D] (already multiplied by b·scale), key/value [B, H_kv, K, D], n [H].
    """

    @staticmethod
    def forward(ctx, query, key, value, n, mask, call: BlockedCall):
        with torch.autocast(query.device.type, enabled=False):  # fp32 block math under autocast too
            return BlockedSSA._forward(ctx, query, key, value, n, mask, call)

    @staticmethod
    def backward(ctx, grad_out):
        with torch.autocast(grad_out.device.type, enabled=False):
            return BlockedSSA._backward(ctx, grad_out)

    @staticmethod
    def _forward(ctx, query, key, value, n, mask, call: BlockedCall):
        form = call.form
        kv_heads = key.shape[1]
        q5 = _group(query, kv_heads)
        batch, _, groups, q_len, dim = q5.shape
        n4 = n.reshape(1, -1, 1, 1)  # the block math sees [B, H, rows, keys]
        mask5 = None if mask is None else _mask_view(mask, kv_heads)
        plan = _Plan(q5.shape, key.shape[-2], call.causal, call.window, call.block_rows, call.block_keys,
                     call.dropout, call.seed)  # fmt: skip
        n_heads = _native_exponents(n, form)
        ctx.form = form
        out = query.new_zeros(batch, kv_heads, groups, q_len, value.shape[-1])
        lse = query.new_full((batch, kv_heads, groups, q_len, 1), math.inf)
        key_t = key.transpose(-1, -2).contiguous()  # [B, H_kv, D, K]: contiguous columns per block
        for rows, spans in plan.blocks():
            width = rows.stop - rows.start
            qb = q5[:, :, :, rows].reshape(batch, kv_heads, groups * width, dim)
            acc = row_max = row_sum = None
            for cols in spans:
                y = torch.matmul(qb, key_t[..., cols]).view(batch, kv_heads, groups, width, -1)
                if n_heads is not None:  # native: the causal band is applied inside
                    y = plan.hide_(y, rows, cols, mask5, band=False).flatten(1, 2)
                    p, m, s = native_blocks.ssa_block_forward(y, n_heads, **plan.band(rows, cols))
                else:
                    p, m, s = _forward_block(plan.hide_(y, rows, cols, mask5).flatten(1, 2), n4)
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
        ctx.mask, ctx.plan = mask5, plan
        return out

    @staticmethod
    def _backward(ctx, grad_out):
        query, key, value, n, out, lse = ctx.saved_tensors
        mask5, plan = ctx.mask, ctx.plan
        kv_heads = key.shape[1]
        q5, go5 = _group(query, kv_heads), _group(grad_out.contiguous(), kv_heads)
        batch, _, groups, _, dim = q5.shape
        n4 = n.reshape(1, -1, 1, 1)
        delta = (go5 * _group(out, kv_heads)).sum(dim=-1, keepdim=True)  # rowsum(dO ∘ O)
        n_heads = _native_exponents(n, ctx.form)
        dq = torch.zeros_like(q5)
        dk, dv, dn = torch.zeros_like(key), torch.zeros_like(value), torch.zeros_like(n4)
        key_t = key.transpose(-1, -2).contiguous()
        value_t = value.transpose(-1, -2).contiguous()
        for rows, spans in plan.blocks():
            width = rows.stop - rows.start
            qb = q5[:, :, :, rows].reshape(batch, kv_heads, groups * width, dim)
            gob = go5[:, :, :, rows].reshape(batch, kv_heads, groups * width, go5.shape[-1])
            lse_b, delta_b = lse[:, :, :, rows].flatten(1, 2), delta[:, :, :, rows].flatten(1, 2)
            dqb = None
            for cols in spans:
                y = torch.matmul(qb, key_t[..., cols]).view(batch, kv_heads, groups, width, -1)
                dp = plan.kept(torch.matmul(gob, value_t[..., cols]), rows, cols).view_as(y)
                if n_heads is not None:  # native: p over y and dy over dp, the band applied inside
                    y = plan.hide_(y, rows, cols, mask5, band=False).flatten(1, 2)
                    p, dy, dn_rows = native_blocks.ssa_block_backward(
                        y, dp.flatten(1, 2), n_heads, lse_b, delta_b, **plan.band(rows, cols)
                    )
                    dn += dn_rows.sum(dim=(0, 2)).view_as(dn).to(dn.dtype)
                else:
                    y = plan.hide_(y, rows, cols, mask5).flatten(1, 2)
                    p, dy, dn_part = _backward_block(y, n4, lse_b, dp.flatten(1, 2), delta_b)
                    dn += dn_part
                flat = (batch, kv_heads, groups * width, -1)
                p, dy = plan.kept(p.view(flat), rows, cols), dy.view(flat)
                dv[..., cols, :] += torch.matmul(p.transpose(-1, -2), gob)
                dk[..., cols, :] += torch.matmul(dy.transpose(-1, -2), qb)
                part = torch.matmul(dy, key[..., cols, :])
                dqb = part if dqb is None else dqb + part
            dq[:, :, :, rows] = dqb.view(batch, kv_heads, groups, width, dim)
        return dq.view_as(query), dk, dv, dn.view(-1), None, None
