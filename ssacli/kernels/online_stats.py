"""Attention output and per-row saturation statistics in one blocked pass, for softmax-of-a-transform
scorers, without a [rows, keys] weight tile.

FlashAttention's online softmax (../shared/notes/online-statistics.md) with a few more running sums
per query row, over query blocks × key blocks:

* m, the running max of the transformed logit t over visible keys;
* l = Σ e^(t − m);
* spread = Σ e^(t − m)·(m − t), kept relative to the running max. The entropy of the row's weights is
  then H = log l + spread / l, a sum of two non-negative terms: the textbook m + log l − u / l with
  u = Σ e^(t − m)·t cancels catastrophically when a row collapses (m ≈ 320 under logits × 32,
  H ≈ 1e-9), this form does not. When the max grows by δ the old terms become
  e^(−δ)·(spread + δ·l);
* the running top-k of t, t at key 0 and at each sample's target key;
* for the layer's logit scale: Σ x² and the count of the visible, finite logits x, and x at the target.

Block math runs in float32, or the model's dtype if wider (as the eager scorer computes its weights);
the running sums are float64. The elementwise work of a block (the logit-scale sums before the
transform; after it the max, e^(t − m), the total, the spread and the top-k) runs, on the CPU in
float32, through the native row pass (ssacli.kernels.native: two passes per row in C); elsewhere as
two torch functions registered with ssacli.kernels.compiled, compiled for long CPU calls, so that a
block is read a few times instead of once per PyTorch op. Both compute the same statistics.
What a block is — its logits as the scorer sees them, which keys are visible, the transform — comes in
as callables, so this module knows no model, scorer or probe (ssacli.attention.online supplies them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import native
from .compiled import register_block, run_block, should_compile

# Key columns per block: with the default 256 query rows, one [b, h, 256, 1024] fp32 tile per
# temporary (8 MB on an 8-head model, whatever the sequence length).
STATS_BLOCK_KEYS = 1024
# Compile the block math from this many logits per call (batch × heads × queries × keys) up, on the
# CPU: the first compilation costs seconds (less with torch's on-disk cache), and one 4,096-token
# call of an 8-head model saves about that much. Not on a GPU by default: there each block is a few
# microseconds of work and a compiled call's guards cost more than they save (one probe level at
# 4,096 tokens on an H200: 257 ms compiled, 193 ms eager; docs/performance.md).
STATS_COMPILE_MIN_LOGITS = 2**23
# Columns per group in the top-k search (row_top).
TOP_GROUP = 32
# Query rows per task of the one-loop native path (plain_softmax_statistics): a [64, 1024] fp32 logit
# tile (256 KB) stays in a core's L2 cache between its two products.
FLASH_BLOCK_ROWS = 64


@dataclass
class RowStatistics:
    """Per query row of one attention call, [b, h, q] float64 unless said otherwise.

    t is the transformed logit; rows with no visible key have ``max`` −inf and ``total`` 0."""

    max: torch.Tensor  # m: the largest t over visible keys
    total: torch.Tensor  # l = Σ e^(t − m) over visible keys
    spread: torch.Tensor  # Σ e^(t − m)·(m − t) ≥ 0, so H = log l + spread / l
    top: torch.Tensor  # [b, h, q, k] the k largest t (−inf where the row sees fewer keys)
    first: torch.Tensor  # t at key 0 (−inf where hidden)
    target: torch.Tensor | None  # t at each sample's target key (−inf where hidden); None without one
    visible: torch.Tensor  # [b, h|1, q] keys each row sees
    extra: torch.Tensor | None  # [b, h, q] t of the denominator's keyless terms, log-summed; None: none
    logit_sq: torch.Tensor  # Σ x² over the visible, finite logits x (before the transform)
    logit_n: torch.Tensor  # how many such logits
    target_logit: torch.Tensor | None  # x at the target key (NaN where hidden or not finite)
    finite_logits: bool  # every computed logit was finite
    finite_output: bool  # every output and running sum was finite
    keys: int  # the call's key length


def row_top(
    t: torch.Tensor, k: int, group: int = TOP_GROUP, group_max: torch.Tensor | None = None
) -> torch.Tensor:
    """The k largest values of each row of t [..., c] (as a multiset; their order is not kept).

    torch.topk over a whole block is one of the costliest steps (on the CPU its cost grows with the
    width searched); the top k lie in the k groups of ``group`` columns with the largest maxima (a
    group holding one of them has a max at least the k-th largest value, any other at most that), so
    one amax pass and two small topk calls suffice. ``group_max`` [..., ceil(c / group)]: those
    maxima, if the caller has them."""
    width = t.shape[-1]
    k = min(k, width)
    if width <= 4 * group * k:
        return t.topk(k, dim=-1).values
    if group_max is None:
        group_max = _group_max(t, group)
    best = group_max.topk(k, dim=-1).indices  # [..., k] distinct groups
    columns = (best.unsqueeze(-1) * group + torch.arange(group, device=t.device)).flatten(-2)
    picked = t.gather(-1, columns.clamp_max(width - 1))
    # A ragged last group: its columns past the end are clamped onto the last one; count it once.
    return torch.where(columns < width, picked, -math.inf).topk(k, dim=-1).values


def _group_max(t: torch.Tensor, group: int) -> torch.Tensor:
    return F.pad(t, (0, -t.shape[-1] % group), value=-math.inf).unflatten(-1, (-1, group)).amax(-1)


def _scale_block(raw: torch.Tensor, vis: torch.Tensor | None):
    """Σ x² and the count over a block's visible, finite logits, and whether every logit is finite."""
    finite = torch.isfinite(raw)
    counted = finite if vis is None else finite & vis
    square = torch.where(counted, raw * raw, 0.0).sum(-1, dtype=torch.float64)
    return square, counted.sum(-1), finite.all()


def _softmax_block(t: torch.Tensor, vis: torch.Tensor | None, running_max: torch.Tensor):
    """One block after the transform: t with hidden keys at −inf, the new running max (float64),
    the stabilizer ref it used (0 where a row has seen nothing), p = e^(t − ref), the block's Σ p and
    Σ p·(ref − t), and each group of TOP_GROUP columns' max (for row_top)."""
    if vis is not None:
        t = torch.where(vis, t, -math.inf)
    new_max = torch.maximum(running_max, t.amax(-1).double())
    ref = torch.where(new_max == -math.inf, 0.0, new_max)
    ref_c = ref.unsqueeze(-1).to(t.dtype)
    p = torch.exp(t - ref_c)
    gap = ref_c - t  # ref − t ≥ 0
    if vis is not None:
        gap = torch.where(vis, gap, 0.0)  # hidden: p = 0 and ref − t = inf
    total = p.sum(-1).double()
    spread = (p * gap).sum(-1).double()
    return t, new_max, ref, p, total, spread, _group_max(t, TOP_GROUP)


def _hidden_to_inf(t: torch.Tensor, vis: torch.Tensor | None) -> torch.Tensor:
    """t as float64 with hidden entries −inf (vis broadcastable to t, None: all visible)."""
    t = t.double()
    return t if vis is None else torch.where(vis, t, -math.inf)


def _record_target(t, raw, vis, target, c0: int, c1: int, t_target: torch.Tensor, x_target: torch.Tensor):
    """For samples whose target key lies in columns [c0, c1): t there (−inf where hidden) into
    t_target and x there (NaN where hidden or not finite) into x_target, both [b, h, r] views."""
    inside = (target >= c0) & (target < c1)
    if not bool(inside.any()):
        return
    b, h, r, c = t.shape
    where = (target - c0).clamp(0, c - 1).reshape(b, 1, 1, 1).expand(b, h, r, 1)
    sel = inside.reshape(b, 1, 1)
    shown = None if vis is None else vis.expand(b, h, r, c).gather(-1, where).squeeze(-1)
    t_at = _hidden_to_inf(t.gather(-1, where).squeeze(-1), shown)
    x_at = raw.gather(-1, where).squeeze(-1).double()
    x_ok = torch.isfinite(x_at) if shown is None else torch.isfinite(x_at) & shown
    t_target.copy_(torch.where(sel, t_at, t_target))
    x_target.copy_(torch.where(sel, torch.where(x_ok, x_at, math.nan), x_target))


def _native_state(b: int, h: int, r: int, k: int, dev: torch.device) -> dict[str, torch.Tensor]:
    """The running per-row state the native pass updates in place, for one query block."""
    f64 = dict(dtype=torch.float64, device=dev)
    return {
        "m": torch.full((b, h, r), -math.inf, **f64), "l": torch.zeros((b, h, r), **f64),
        "spread": torch.zeros((b, h, r), **f64), "shrink": torch.zeros((b, h, r), device=dev),
        "top": torch.full((b, h, r, k), -math.inf, **f64), "sq": torch.zeros((b, h, r), **f64),
        "cnt": torch.zeros((b, h, r), **f64),
    }  # fmt: skip


register_block("stats_scale", _scale_block)
register_block("stats_softmax", _softmax_block)


def softmax_statistics(
    value: torch.Tensor,
    q_len: int,
    *,
    logits: Callable[[slice, slice], torch.Tensor],
    visible: Callable[[slice, slice], torch.Tensor | None],
    transform: Callable[[torch.Tensor, slice], torch.Tensor],
    count: torch.Tensor,
    key_span: Callable[[slice], list[int]],
    extra: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    top_k: int = 5,
    block_rows: int = 256,
    block_keys: int = STATS_BLOCK_KEYS,
    compile: bool | None = None,
    native_pass: bool | None = None,
    overwrite_logits: bool = False,
) -> tuple[torch.Tensor, RowStatistics]:
    """(output [b, h, q, d] in value's dtype, :class:`RowStatistics`) of softmax(t) attention.

    ``logits(rows, cols)``: the logits x [b, h, r, c] as the scorer sees them; ``visible(rows, cols)``:
    bool broadcastable to them, or None (all visible); ``transform(x, rows)``: t from float32 x
    (hidden entries are 0 there and −inf after); ``count`` [b|1, h|1, q]: visible keys per row;
    ``key_span(rows)``: the sorted edges [lo, …, hi] of the key range the rows can see at all (blocks
    outside it are never formed; blocks never straddle an edge, so a caller can cut off the part that
    every row sees whole and answer None for its visibility);
    ``extra`` [b|1, h|1, q|1]: t of keyless denominator terms (a learned sink, a sink
    scorer's s; their value is zero), log-summed; ``target`` [b]: key index per sample.
    ``compile``: compile the block math (None: SSACLI_COMPILE, else CPU calls of at least
    STATS_COMPILE_MIN_LOGITS logits). ``native_pass``: run each block's statistics through the native
    row pass (ssacli.kernels.native) where it applies — float32 math on the CPU, the kernel built —
    (None: unless SSACLI_NATIVE=0); otherwise, and on other devices and dtypes, the torch path.
    ``overwrite_logits``: each ``logits`` call returns a new tensor that this function may overwrite
    (the native pass then writes the weights over the logits, one block of memory fewer per block).
    """
    b, h, k_len, d = value.shape
    dev = value.device
    f64 = dict(dtype=torch.float64, device=dev)
    row_max = torch.full((b, h, q_len), -math.inf, **f64)
    total = torch.zeros((b, h, q_len), **f64)
    spread = torch.zeros((b, h, q_len), **f64)
    logit_sq = torch.zeros((b, h, q_len), **f64)
    logit_n = torch.zeros((b, h, q_len), **f64)
    first = torch.full((b, h, q_len), -math.inf, **f64)
    k_top = max(1, min(top_k, k_len))
    top = torch.full((b, h, q_len, k_top), -math.inf, **f64)
    t_target = x_target = None
    if target is not None:
        target = target.to(dev).long()
        t_target = torch.full((b, h, q_len), -math.inf, **f64)
        x_target = torch.full((b, h, q_len), math.nan, **f64)
    compute = torch.promote_types(value.dtype, torch.float32)  # the eager scorer's dtype
    out = torch.zeros((b, h, q_len, d), dtype=compute, device=dev)
    finite_flags: list[torch.Tensor] = []
    v32 = value.to(compute)
    if compile is None:
        compile = should_compile(dev.type == "cpu" and b * h * q_len * k_len >= STATS_COMPILE_MIN_LOGITS)
    # native.available() is False under SSACLI_NATIVE=0 (nothing is built) and where the build failed
    cpu_float32 = dev.type == "cpu" and compute == torch.float32
    use_native = native_pass is not False and cpu_float32 and native.available()
    for r0 in range(0, q_len, max(1, block_rows)):
        rows = slice(r0, min(r0 + max(1, block_rows), q_len))
        edges = key_span(rows)
        spans = [
            slice(c0, min(c0 + max(1, block_keys), hi))
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
            for c0 in range(lo, hi, max(1, block_keys))
        ]
        if use_native:
            state = _native_state(b, h, rows.stop - rows.start, k_top, dev)
            acc = torch.zeros((b, h, rows.stop - rows.start, d), dtype=compute, device=dev)
            m = None
        else:
            acc = m = l_ = s_ = None
        for cols in spans:
            c0 = cols.start
            vis = visible(rows, cols)
            if vis is not None and not bool(vis.any()):
                continue  # nothing visible in this block (padding, the causal future)
            x = logits(rows, cols)
            raw = x.to(compute)
            t = transform(raw if vis is None else torch.where(vis, raw, 0.0), rows)
            if c0 == 0:
                first[:, :, rows] = _hidden_to_inf(t[..., 0], None if vis is None else vis[..., 0])
            if target is not None:
                _record_target(t, raw, vis, target, c0, cols.stop, t_target[:, :, rows], x_target[:, :, rows])
            if use_native:
                raw, t = raw.contiguous(), t.contiguous()
                # p over t when the caller's logits are ours to overwrite (first and target read above)
                p = t if overwrite_logits else torch.empty_like(t)
                finite_flags.append(torch.tensor(native.row_stats(t, raw, vis, p, state)))
                acc.mul_(state["shrink"].unsqueeze(-1)).add_(torch.matmul(p, v32[:, :, cols]))
                m = state["m"]
            else:
                square, counted, all_finite = run_block("stats_scale", compile, raw, vis)
                finite_flags.append(all_finite)  # read once at the end: a bool() per block syncs a GPU
                logit_sq[:, :, rows] += square
                logit_n[:, :, rows] += counted
                running = torch.full(t.shape[:-1], -math.inf, **f64) if m is None else m
                t, new_max, ref, p, block_total, block_spread, group_max = run_block(
                    "stats_softmax", compile, t, vis, running
                )
                block_top = row_top(t, k_top, group_max=group_max).double()
                top[:, :, rows] = torch.cat([top[:, :, rows], block_top], dim=-1).topk(k_top, dim=-1).values
                pv = torch.matmul(p, v32[:, :, cols])
                if m is None:
                    acc, m, l_, s_ = pv, new_max, block_total, block_spread
                else:
                    old = torch.where(m == -math.inf, 0.0, m)
                    delta = ref - old  # ≥ 0 where the row had keys before
                    shrink = torch.where(m == -math.inf, 0.0, torch.exp(-delta))
                    s_ = shrink * (s_ + torch.where(m == -math.inf, 0.0, delta) * l_) + block_spread
                    l_ = shrink * l_ + block_total
                    acc = acc * shrink.unsqueeze(-1).to(compute) + pv
                    m = new_max
        if use_native:
            logit_sq[:, :, rows], logit_n[:, :, rows] = state["sq"], state["cnt"]
            top[:, :, rows] = state["top"]
            m, l_, s_ = state["m"], state["l"], state["spread"]
        if m is None:
            continue  # no block visible: the rows keep max −inf, total 0, output 0
        denominator = l_
        if extra is not None:
            e = extra.expand(b, h, q_len)[:, :, rows].double()
            ref = torch.where(m == -math.inf, 0.0, m)
            denominator = l_ + torch.exp(e - ref)
        out[:, :, rows] = acc / torch.where(denominator > 0, denominator, 1.0).unsqueeze(-1).to(compute)
        row_max[:, :, rows], total[:, :, rows], spread[:, :, rows] = m, l_, s_
    finite_logits = bool(torch.stack(finite_flags).all()) if finite_flags else True
    finite_output = bool(torch.isfinite(out).all()) and bool(torch.isfinite(total).all())
    stats = RowStatistics(
        max=row_max, total=total, spread=spread, top=top, first=first, target=t_target,
        visible=count.double(),
        extra=None if extra is None else extra.expand(b, h, q_len).double(),
        logit_sq=logit_sq, logit_n=logit_n, target_logit=x_target,
        finite_logits=finite_logits, finite_output=finite_output, keys=k_len,
    )  # fmt: skip
    return out.to(value.dtype), stats


def plain_softmax_available(query: torch.Tensor) -> bool:
    """Whether :func:`plain_softmax_statistics` can run for this query: float32 on the CPU, the
    native pass built and torch's own sgemm found (ssacli.kernels.native.flash_available)."""
    return query.device.type == "cpu" and query.dtype == torch.float32 and native.flash_available()


def plain_softmax_statistics(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    *,
    causal: bool,
    window: int | None,
    count: torch.Tensor,
    target: torch.Tensor | None = None,
    top_k: int = 5,
    block_rows: int = FLASH_BLOCK_ROWS,
    block_keys: int = STATS_BLOCK_KEYS,
) -> tuple[torch.Tensor, RowStatistics]:
    """:func:`softmax_statistics` for the commonest call — softmax of x = (query·keyᵀ)·scaling with no
    mask tensor (``causal``, bottom-right aligned, and ``window``, or every key visible), no probe on
    the logits, no keyless term — in one native loop (ssacli.kernels.native.stats_flash): each
    [rows, keys] logit tile is formed by torch's own sgemm (the products round as torch.matmul's on
    some CPUs, and within float32 rounding of them on others: ssacli.kernels.native), reduced while
    it sits in cache, and multiplied by v. query [b, h, q, d], key/value [b, h_kv, k, d] float32 on
    the CPU (see :func:`plain_softmax_available`); ``count`` [b|1, h|1, q] the keys each row sees;
    ``target`` [b]. The same :class:`RowStatistics` as :func:`softmax_statistics` (t = x)."""
    b, h, q_len, _ = query.shape
    k_len = key.shape[-2]
    k_top = max(1, min(top_k, k_len))
    f64 = dict(dtype=torch.float64, device=query.device)
    state = _native_state(b, h, q_len, k_top, query.device)  # as the row pass starts its rows
    state["first"] = torch.full((b, h, q_len), -math.inf, **f64)
    state["t_target"] = torch.full((b, h, q_len), -math.inf, **f64)
    state["x_target"] = torch.full((b, h, q_len), math.nan, **f64)
    if target is not None:
        target = target.to(query.device).long()
    out, finite_logits, finite_output = native.stats_flash(
        query, key, value, scaling, state, causal=causal, window=window, target=target,
        block_rows=max(1, block_rows), block_keys=max(1, block_keys),
    )  # fmt: skip
    stats = RowStatistics(
        max=state["m"], total=state["l"], spread=state["spread"], top=state["top"], first=state["first"],
        target=None if target is None else state["t_target"], visible=count.double(), extra=None,
        logit_sq=state["sq"], logit_n=state["cnt"],
        target_logit=None if target is None else state["x_target"],
        finite_logits=finite_logits, finite_output=finite_output, keys=k_len,
    )  # fmt: skip
    return out.to(value.dtype), stats


__all__ = [
    "FLASH_BLOCK_ROWS",
    "STATS_BLOCK_KEYS",
    "STATS_COMPILE_MIN_LOGITS",
    "RowStatistics",
    "plain_softmax_available",
    "plain_softmax_statistics",
    "row_top",
    "softmax_statistics",
]
