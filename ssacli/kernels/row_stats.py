"""The per-row statistics every path of diagnose produces, :class:`RowStatistics`, and the eager path's
producer, :func:`weight_statistics` (a block of weights reduced to them).

Whatever computes a call's attention — the fused torch pass and the native kernels over the logits
(ssacli.kernels.online_stats), or a scorer's eager weights (here) — hands diagnose the same few
numbers per query row, and ssacli.diagnosis.row_metrics derives every row metric from them in one
place. So a new metric costs one derivation there plus, where it needs a new running term, that term
in each producer.

With t a row's transformed logits over its visible keys, the statistics are m = max t,
l = Σ e^(t − m) and spread = Σ e^(t − m)·(m − t) (so the entropy of the row's shape is
H = log l + spread / l, without the cancellation of m + log l − Σ e^(t − m)·t / l), its top-k t, t at
key 0 and at the target key, what the denominator holds besides the keys and, where asked, where the
mass lands by key position and distance (ssacli.kernels.positions: three more sums like l). A block
of weights w is the same thing with t = log w (a zero weight is t = −inf): l = Σw / max w,
e^(t − m) = w / max w computed as that quotient, and the spread −Σ xlogy(w / max w, w / max w), so H
is the xlogy-based entropy of w to rounding (and keeps its digits where a row collapses, where the
plain log Σw − Σ xlogy(w, w) / Σw cancels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .positions import PositionBins, block_terms, visible_per_bin


@dataclass(kw_only=True)
class RowStatistics:
    """Per query row of one attention call, [b, h, q] float64 unless said otherwise.

    t is the transformed logit (the eager path's log w); rows with no visible key, or no weight, have
    ``max`` −inf and ``total`` 0."""

    max: torch.Tensor  # m: the largest t over visible keys
    total: torch.Tensor  # l = Σ e^(t − m) over visible keys
    spread: torch.Tensor  # Σ e^(t − m)·(m − t) ≥ 0, so H = log l + spread / l
    top: torch.Tensor  # [b, h, q, k] the k largest t (−inf where the row sees fewer keys)
    first: torch.Tensor  # t at key 0 (−inf where hidden)
    visible: torch.Tensor  # [b|1, h|1, q] keys each row sees
    keys: int  # the call's key length
    target: torch.Tensor | None = None  # t at each sample's target key (−inf where hidden); None: no target
    target_seen: torch.Tensor | None = None  # bool [b|1, h|1, q]: the rows that see their target key
    extra: torch.Tensor | None = None  # t of the denominator's keyless terms, log-summed; None: none
    sink: torch.Tensor | None = None  # t of the learned sink key (one of the keyless terms); None: none
    # z where the row's weights are e^(t − z) without being a softmax over the keys and the keyless
    # terms (the eager path: t = log w, z = 0; its rows may sum to anything). None: a softmax, whose
    # keys and keyless terms share one denominator l·e^m + e^extra.
    log_normalizer: torch.Tensor | None = None
    logit_sq: torch.Tensor | None = None  # Σ x² over the visible, finite logits x (before the transform)
    logit_n: torch.Tensor | None = None  # how many such logits (None with logit_sq: logits not seen)
    target_logit: torch.Tensor | None = None  # x at the target key (NaN where hidden or not finite)
    finite_logits: bool = True  # every computed logit was finite (eager: checked where they are formed)
    finite_output: bool = True  # every output and running sum (the eager path: every weight) was finite
    # Where the mass lands (ssacli.kernels.positions), all None where not measured: the bins, and
    # Σ e^(t − m) per key bin [b, h, q, B] and per distance bin [b, h, q, D], Σ e^(t − m)·|i − j|, and the
    # keys each row sees per key bin [b|1, h|1, q, B] (the uniform reference)
    positions: PositionBins | None = None
    key_mass: torch.Tensor | None = None
    distance_mass: torch.Tensor | None = None
    distance_sum: torch.Tensor | None = None
    key_visible: torch.Tensor | None = None


@torch.no_grad()
def weight_statistics(
    weights: torch.Tensor,
    visible: torch.Tensor | None = None,
    *,
    logits: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    top_k: int = 5,
    sink: torch.Tensor | None = None,
    positions: PositionBins | None = None,
    query_positions: torch.Tensor | None = None,
) -> RowStatistics:
    """One block of any scorer's weights [b, h, q, k] as :class:`RowStatistics` (t = log w, z = 0).

    ``visible`` bool broadcastable to the weights (None: every key visible); weights at hidden keys
    never count. ``logits`` [b, h, q, k]: the logits the scorer saw, for the logit-scale sums (None: not
    measured); ``target`` [b]: a key index per sample; ``sink`` [b, h, q]: the weight each row gave
    the model's learned sink key (None: the model has none); ``positions``: the bins of the position
    terms (None: not measured), with the rows' key positions ``query_positions`` [q] (None: the last q
    keys). The element math and each row's sums in
    the weights' precision (at least float32, the fused pass's block precision; float64 weights give
    the entropy of float64 xlogy to ~1e-13), the statistics in float64."""
    b, h, q, k = weights.shape
    dev = weights.device
    w = weights.to(torch.promote_types(weights.dtype, torch.float32))  # as the scorer computed them
    if visible is None:
        count = torch.full((1, 1, q), float(k), dtype=torch.float64, device=dev)
    else:  # count before broadcasting (cheap), and never let content at hidden keys in
        count = visible.sum(-1).double()
        w = torch.where(visible, w, 0.0)
    w_max = w.amax(-1)  # NaN if a weight is NaN: the row then counts nowhere
    divisor = torch.where(w_max > 0, w_max, 1.0)
    scaled = w / divisor.unsqueeze(-1)  # e^(t − m), exactly w / max w
    top = w.topk(max(1, min(top_k, k)), dim=-1).values
    stats = RowStatistics(
        # l = Σw / max w, so that max p = 1 / l is max w / Σw to one rounding (a row whose largest
        # weight is exactly tau collapses, as its weights say)
        max=torch.log(w_max.double()), total=w.sum(-1).double() / divisor.double(),
        spread=-torch.special.xlogy(scaled, scaled).sum(-1).double(), top=torch.log(top.double()),
        first=torch.log(w[..., 0].double()), visible=count, keys=k,
        log_normalizer=torch.zeros((), dtype=torch.float64, device=dev),
        finite_output=bool(torch.isfinite(weights).all()),
    )  # fmt: skip
    if sink is not None:  # the learned sink is the row's one keyless term
        stats.sink = stats.extra = torch.log(sink.double()).expand(b, h, q)
    if positions is not None:
        at = torch.arange(k - q, k, device=dev) if query_positions is None else query_positions.to(dev)
        stats.positions = positions
        stats.key_mass, stats.distance_mass, stats.distance_sum = block_terms(scaled, positions, at, 0, k)
        stats.key_visible = visible_per_bin(
            positions, k, at, mask=None if visible is None else visible.expand(*visible.shape[:-2], q, k)
        )
    column = None if target is None else target.to(dev).long().reshape(b, 1, 1, 1).expand(b, h, q, 1)
    if column is not None:
        stats.target = torch.log(w.gather(-1, column).squeeze(-1).double())
        if visible is None:
            stats.target_seen = torch.ones(1, 1, q, dtype=torch.bool, device=dev)
        else:  # gather from a broadcast view: [b, heads of the mask (1 or h), q]
            view = visible.expand(b, visible.shape[1], q, k)
            stats.target_seen = view.gather(-1, column[:, : view.shape[1]]).squeeze(-1)
    if logits is not None:
        # (whether every logit is finite, ``finite_logits``, the caller knows: it kept them)
        finite = torch.isfinite(logits)
        shown = finite if visible is None else finite & visible
        x = logits.double()
        stats.logit_sq = torch.where(shown, x * x, 0.0).sum(-1)
        stats.logit_n = shown.sum(-1).double().expand(b, h, q)
        if column is not None:
            at = shown.expand(b, h, q, k).gather(-1, column).squeeze(-1)
            stats.target_logit = torch.where(at, x.gather(-1, column).squeeze(-1), math.nan)
    return stats


__all__ = ["RowStatistics", "weight_statistics"]
