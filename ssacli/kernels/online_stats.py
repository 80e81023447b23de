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
* for the layer's logit scale: Σ x² and the count of the visible, finite logits x, and x at the target;
* where the call asks (:attr:`StatisticsCall.positions`), the position terms of
  ssacli.kernels.positions: Σ e^(t − m) per key bin and per distance bin and Σ e^(t − m)·|i − j|,
  rescaled with l (a vector of bins per row, never a [rows, keys] map).

Block math runs in float32, or the model's dtype if wider (as the eager scorer computes its weights);
the running sums are float64. Which form runs is ssacli.kernels.routing.choose_backend's choice: plain
softmax over a causal band or every key (:attr:`StatisticsCall.plain`) in float32 on the CPU takes one
native loop (``"one-loop"``: logits, statistics and p·v per cached tile); other float32 CPU calls the
block loop with the native row pass for a block's elementwise work (``"native-blocks"``: the
logit-scale sums before the transform; after it the max, e^(t − m), the total, the spread and the
top-k, two passes per row in C); CUDA calls of plain softmax or SSA with nothing else on the logits
one Triton kernel (``"triton"``, ssacli.kernels.triton_stats: every running sum in one
FlashAttention-2 pass, float32); the rest (float64, the other CUDA calls, nothing built) the block
loop with the same work as torch ops (``"torch-blocks"``). All four compute the same statistics.
What a call is — its mask, the logits' form, the probe, the transform, the keyless terms — comes in as
one :class:`~ssacli.kernels.stats_call.StatisticsCall` (ssacli.attention.forward's
online_observed_attention builds it), and what comes out is the
:class:`~ssacli.kernels.row_stats.RowStatistics` every path of diagnose produces.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import native, native_blocks, routing
from .positions import PositionBins, block_terms
from .row_stats import RowStatistics
from .stats_call import CallBlocks, StatisticsCall, triton_lacks

# Key columns per block: with the default 256 query rows, one [b, h, 256, 1024] fp32 tile per
# temporary (8 MB on an 8-head model, whatever the sequence length).
STATS_BLOCK_KEYS = 1024
# Columns per group in the top-k search (row_top).
TOP_GROUP = 32
# Query rows per task (at most) of the one-loop native path of plain calls: a [64, 1024] fp32 logit tile
# (256 KB) stays in a core's L2 cache between its two products.
FLASH_BLOCK_ROWS = 64


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


def _row_state(
    b: int, h: int, r: int, k: int, d: int, compute: torch.dtype, dev: torch.device,
    bins: PositionBins | None = None, keys: int = 0,
):  # fmt: skip
    """The running state of one query block's rows, as the native pass updates it in place: m, l,
    spread, shrink, top, the logit-scale sums sq and cnt, and the output accumulator acc; with
    ``bins`` (for a call of ``keys`` keys) the position terms kb, db and dist too."""
    f64 = dict(dtype=torch.float64, device=dev)
    positions = {} if bins is None else {
        "bins": bins, "kb": torch.zeros((b, h, r, bins.key_bins(keys)), **f64),
        "db": torch.zeros((b, h, r, bins.distance_bins(keys)), **f64), "dist": torch.zeros((b, h, r), **f64),
    }  # fmt: skip
    return positions | {
        "m": torch.full((b, h, r), -math.inf, **f64), "l": torch.zeros((b, h, r), **f64),
        "spread": torch.zeros((b, h, r), **f64), "shrink": torch.zeros((b, h, r), device=dev),
        "top": torch.full((b, h, r, k), -math.inf, **f64), "sq": torch.zeros((b, h, r), **f64),
        "cnt": torch.zeros((b, h, r), **f64), "acc": torch.zeros((b, h, r, d), dtype=compute, device=dev),
    }  # fmt: skip


def _torch_update(state: dict, t, raw, vis, value_cols, where: tuple) -> torch.Tensor:
    """One key block into the rows' state through the torch block math (``where``: the rows' key
    positions [r], the block's first key and the call's key count, for the position terms); returns
    whether every raw logit was finite (a tensor, read once at the end: a bool() per block syncs a
    GPU)."""
    square, counted, all_finite = _scale_block(raw, vis)
    state["sq"] += square
    state["cnt"] += counted
    m = state["m"]
    t, new_max, ref, p, block_total, block_spread, group_max = _softmax_block(t, vis, m)
    k_top = state["top"].shape[-1]
    block_top = row_top(t, k_top, group_max=group_max).double()
    state["top"] = torch.cat([state["top"], block_top], dim=-1).topk(k_top, dim=-1).values
    pv = torch.matmul(p, value_cols)
    empty = m == -math.inf  # rows that had no key before this block
    delta = ref - torch.where(empty, 0.0, m)  # ≥ 0 where the row had keys before
    shrink = torch.where(empty, 0.0, torch.exp(-delta))
    state["spread"] = shrink * (state["spread"] + torch.where(empty, 0.0, delta) * state["l"]) + block_spread
    state["l"] = shrink * state["l"] + block_total
    state["acc"] = state["acc"] * shrink.unsqueeze(-1).to(state["acc"].dtype) + pv
    state["m"] = new_max
    if "kb" in state:
        key_mass, distance_mass, distance_sum = block_terms(p, state["bins"], *where)
        state["kb"] = shrink.unsqueeze(-1) * state["kb"] + key_mass
        state["db"] = shrink.unsqueeze(-1) * state["db"] + distance_mass
        state["dist"] = shrink * state["dist"] + distance_sum
    return all_finite


def _native_update(state: dict, t, raw, vis, value_cols, key0: int, pos0: int) -> torch.Tensor:
    """One key block into the rows' state through the native row pass (float32 on the CPU); p is
    written over t (a block formed for this call alone, its key 0 and target already read). The
    block's columns start at key ``key0``, its rows at key position ``pos0``."""
    raw, t = raw.contiguous(), t.contiguous()
    finite = native_blocks.row_stats(t, raw, vis, state, key0=key0, pos0=pos0)
    state["acc"].mul_(state["shrink"].unsqueeze(-1)).add_(torch.matmul(t, value_cols))
    return finite


def softmax_statistics(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    call: StatisticsCall,
    *,
    block_rows: int = 256,
    block_keys: int = STATS_BLOCK_KEYS,
    backend: str = "auto",
) -> tuple[torch.Tensor, RowStatistics]:
    """(output [b, h, q, d] in value's dtype, :class:`RowStatistics`) of softmax(t) attention.

    query [b, h, q, d], key/value [b, h_kv, k, d] (h a multiple of h_kv), ``call`` the rest. Blocks of
    ``block_rows`` queries × ``block_keys`` keys. ``backend`` (ssacli.kernels.routing.BACKENDS;
    "auto" reads SSACLI_BACKEND first): ssacli.kernels.routing.choose_backend picks the one native loop
    for plain calls (:attr:`StatisticsCall.plain`) in float32 on the CPU where it is built and torch's
    sgemm found (at most FLASH_BLOCK_ROWS rows a task), the native row pass per block for other
    float32 CPU calls, the Triton kernel for the CUDA calls it computes whole, the torch block math for
    the rest; or "one-loop", "native-blocks", "torch-blocks", "triton" force one (a ValueError where it
    cannot run here; "triton" on CPU tensors only under TRITON_INTERPRET=1)."""
    compute = torch.promote_types(value.dtype, torch.float32)  # the eager scorer's dtype
    path = routing.choose_backend(statistics_facts(query, value, call, backend))
    if path == "eager":
        raise ValueError("softmax_statistics runs the fused paths; the eager statistics are the observer's")
    if path == "triton":  # imported here: importing triton costs ~1 s, and only CUDA calls need it
        from .triton_stats import triton_statistics

        return triton_statistics(query, key, value, call)
    if path == "one-loop":
        blocks = CallBlocks(call, query, key, compute)  # the loop reads grouped K/V heads itself
        return _one_loop(blocks, value, min(max(1, block_rows), FLASH_BLOCK_ROWS), max(1, block_keys))
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each K/V head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    blocks = CallBlocks(call, query, key, compute)
    b, h, k_len, d = value.shape
    q_len, dev = blocks.q_len, value.device
    use_native = path == "native-blocks"
    f64 = dict(dtype=torch.float64, device=dev)
    k_top = max(1, min(call.top_k, k_len))
    rows_max = torch.full((b, h, q_len), -math.inf, **f64)
    total, spread, logit_sq, logit_n = (torch.zeros((b, h, q_len), **f64) for _ in range(4))
    first = torch.full((b, h, q_len), -math.inf, **f64)
    top = torch.full((b, h, q_len, k_top), -math.inf, **f64)
    bins, positions = call.positions, blocks.positions()
    terms = None if bins is None else {
        "kb": torch.zeros((b, h, q_len, bins.key_bins(k_len)), **f64),
        "db": torch.zeros((b, h, q_len, bins.distance_bins(k_len)), **f64),
        "dist": torch.zeros((b, h, q_len), **f64),
    }  # fmt: skip
    target = t_target = x_target = None
    if call.target is not None:
        target = call.target.to(dev).long()
        t_target = torch.full((b, h, q_len), -math.inf, **f64)
        x_target = torch.full((b, h, q_len), math.nan, **f64)
    sink_t, extra = blocks.keyless_terms(b, h, compute)
    out = torch.zeros((b, h, q_len, d), dtype=compute, device=dev)
    finite_flags: list[torch.Tensor] = []
    v32 = value.to(compute)
    for r0 in range(0, q_len, max(1, block_rows)):
        rows = slice(r0, min(r0 + max(1, block_rows), q_len))
        edges = blocks.key_span(rows)
        state = _row_state(b, h, rows.stop - rows.start, k_top, d, compute, dev, bins, k_len)
        formed = False
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            for c0 in range(lo, hi, max(1, block_keys)):
                cols = slice(c0, min(c0 + max(1, block_keys), hi))
                vis = blocks.visible(rows, cols)
                if vis is not None and not bool(vis.any()):
                    continue  # nothing visible in this block (padding, the causal future)
                formed = True
                raw = blocks.logits(rows, cols).to(compute)
                t = blocks.transformed(raw, vis, rows)
                if c0 == 0:
                    first[:, :, rows] = _hidden_to_inf(t[..., 0], None if vis is None else vis[..., 0])
                if target is not None:
                    at = (t_target[:, :, rows], x_target[:, :, rows])
                    _record_target(t, raw, vis, target, c0, cols.stop, *at)
                if use_native:
                    pos0 = blocks.offset + rows.start
                    finite_flags.append(_native_update(state, t, raw, vis, v32[:, :, cols], c0, pos0))
                else:
                    where = (positions[rows], c0, k_len)
                    finite_flags.append(_torch_update(state, t, raw, vis, v32[:, :, cols], where))
        if not formed:
            continue  # no block visible: the rows keep max −inf, total 0, output 0
        logit_sq[:, :, rows], logit_n[:, :, rows], top[:, :, rows] = state["sq"], state["cnt"], state["top"]
        m, l_ = state["m"], state["l"]
        denominator = l_
        if extra is not None:
            e = extra.expand(b, h, q_len)[:, :, rows].double()
            denominator = l_ + torch.exp(e - torch.where(m == -math.inf, 0.0, m))
        denominator = torch.where(denominator > 0, denominator, 1.0)
        out[:, :, rows] = state["acc"] / denominator.unsqueeze(-1).to(compute)
        rows_max[:, :, rows], total[:, :, rows], spread[:, :, rows] = m, l_, state["spread"]
        if terms is not None:
            for name, values in terms.items():
                values[:, :, rows] = state[name]
    stats = RowStatistics(
        max=rows_max, total=total, spread=spread, top=top, first=first, visible=blocks.count.double(),
        keys=k_len, target=t_target, target_seen=None if t_target is None else t_target > -math.inf,
        extra=None if extra is None else extra.expand(b, h, q_len).double(),
        sink=None if sink_t is None else sink_t.double(), logit_sq=logit_sq, logit_n=logit_n,
        target_logit=x_target,
        finite_logits=bool(torch.stack(finite_flags).all()) if finite_flags else True,
        finite_output=bool(torch.isfinite(out).all()) and bool(torch.isfinite(total).all()),
    )  # fmt: skip
    if terms is not None:
        _position_statistics(stats, blocks, terms)
    return out.to(value.dtype), stats


def statistics_facts(
    query: torch.Tensor, value: torch.Tensor, call: StatisticsCall, backend: str = "auto"
) -> routing.Call:
    """The facts :func:`ssacli.kernels.routing.choose_backend` decides a statistics call on; the native
    library is looked up (built) only where it may run the call."""
    compute = torch.promote_types(value.dtype, torch.float32)  # the eager scorer's dtype
    backend = routing.requested(backend)
    may_be_native = backend in ("auto", "fused", "one-loop", "native-blocks")
    here = native.kernels_here() if may_be_native and routing.native_fits(value.device.type, compute) else ""
    # the one loop reads float32 queries as they are
    single = call.plain and query.dtype == torch.float32
    # the Triton kernel: looked at (a float mask read once) only where it may run the call
    triton = value.device.type == "cuda" and backend in ("auto", "fused") and routing.triton_installed()
    return routing.Call(
        value.device.type, compute, kind="statistics", backend=backend, window=call.window is not None,
        head_dim=query.shape[-1], triton=triton, mask=not single, native=here,
        triton_stats=triton and triton_lacks(call, query) is None,
    )  # fmt: skip


def _position_statistics(stats: RowStatistics, blocks: CallBlocks, terms: dict) -> None:
    """The position terms (kb, db, dist of the call's rows) and the call's geometry into ``stats``."""
    stats.positions = blocks.call.positions
    stats.key_mass, stats.distance_mass, stats.distance_sum = terms["kb"], terms["db"], terms["dist"]
    stats.key_visible = blocks.key_visible()


def _one_loop(blocks: CallBlocks, value: torch.Tensor, block_rows: int, block_keys: int):
    """:func:`softmax_statistics` of a plain call in one native loop (ssacli.kernels.native.stats_flash):
    each [rows, keys] logit tile is formed by torch's own sgemm (the products round as torch.matmul's
    on some CPUs, and within float32 rounding of them on others: ssacli.kernels.native), reduced while
    it sits in cache, and multiplied by v."""
    call, query = blocks.call, blocks.query
    b, h, q_len, _ = query.shape
    k_top = max(1, min(call.top_k, blocks.k_len))
    f64 = dict(dtype=torch.float64, device=query.device)
    # as the row pass starts its rows
    state = _row_state(b, h, q_len, k_top, 0, torch.float32, query.device, call.positions, blocks.k_len)
    state["first"] = torch.full((b, h, q_len), -math.inf, **f64)
    state["t_target"] = torch.full((b, h, q_len), -math.inf, **f64)
    state["x_target"] = torch.full((b, h, q_len), math.nan, **f64)
    target = None if call.target is None else call.target.to(query.device).long()
    out, finite_logits, finite_output = native.stats_flash(
        query, blocks.key, value, float(call.scaling), state, causal=call.causal, window=call.window,
        target=target, block_rows=block_rows, block_keys=block_keys,
    )  # fmt: skip
    t_target = None if target is None else state["t_target"]
    stats = RowStatistics(
        max=state["m"], total=state["l"], spread=state["spread"], top=state["top"], first=state["first"],
        visible=blocks.count.double(), keys=blocks.k_len, target=t_target,
        target_seen=None if t_target is None else t_target > -math.inf, logit_sq=state["sq"],
        logit_n=state["cnt"], target_logit=None if target is None else state["x_target"],
        finite_logits=finite_logits, finite_output=finite_output,
    )  # fmt: skip
    if "kb" in state:
        _position_statistics(stats, blocks, state)
    return out.to(value.dtype), stats


__all__ = ["FLASH_BLOCK_ROWS", "STATS_BLOCK_KEYS", "row_top", "softmax_statistics", "statistics_facts"]
