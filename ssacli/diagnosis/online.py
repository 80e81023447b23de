"""Diagnose's metrics from the fused pass's per-row statistics (ssacli.kernels.online_stats) instead
of a block of weights: the same per-head sums as :func:`ssacli.diagnosis.metrics.row_sums`, row for
row, counted by the same rule (valid queries, at least two visible keys, positive mass).

With t the transformed logits, m their row max, l = Σ e^(t − m) and spread = Σ e^(t − m)(m − t):
p_j = e^(t_j − m) / l over the keys, H = log l + spread / l, max p = 1 / l, and a keyless term with
logit e (learned sink, sink scorer) takes e^(e − m) of the denominator l + e^(e − m).
"""

from __future__ import annotations

import torch

from ..defaults import TAU, TOP_K
from ..kernels.online_stats import RowStatistics


def _heads(x: torch.Tensor) -> torch.Tensor:
    return x.double().sum(dim=(0, 2))


@torch.no_grad()
def online_row_sums(
    stats: RowStatistics,
    *,
    query_valid: torch.Tensor | None = None,
    query_positions: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    tau: float = TAU,
    top_k: int = TOP_K,
    sink: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`~ssacli.diagnosis.metrics.row_sums` of one attention call, from its row statistics.

    query_valid [b, q]; query_positions [q] (each row's key index); target [b] (None: no capture
    measured); sink [b, h, q]: the learned sink's transformed logit (None: the model has none)."""
    m, l_, spread = stats.max, stats.total, stats.spread
    b, h, q = m.shape
    n_visible = stats.visible.expand(b, h, q)
    seen = l_ > 0
    safe_l = torch.where(seen, l_, 1.0)
    ref = torch.where(seen, m, 0.0)
    # Mass of the keys: l over the whole denominator (l + e^(extra − m)), computed at a common
    # stabilizer so that a dominant keyless term cannot overflow.
    if stats.extra is None:
        mass = seen.double()
    else:
        top = torch.maximum(torch.where(seen, m, -torch.inf), stats.extra)
        keys = l_ * torch.exp(torch.where(seen, m - top, -torch.inf))
        mass = keys / (keys + torch.exp(stats.extra - top))
    counted = (n_visible >= 2) & (mass > 0) & torch.isfinite(mass) & seen
    if query_valid is not None:
        counted &= query_valid.to(torch.bool).reshape(b, 1, q)
    entropy = (torch.log(safe_l) + spread / safe_l).clamp_min(0.0)
    k_top = stats.top.shape[-1] if top_k >= stats.top.shape[-1] else top_k
    max_p = 1.0 / safe_l
    per_row = {
        "entropy": entropy / torch.log(n_visible.clamp_min(2)),
        "max_weight": max_p,
        "collapse_rate": (max_p >= tau).double(),
        "effective_tokens": torch.exp(entropy),
        "topk_mass": torch.exp(stats.top[..., :k_top] - ref.unsqueeze(-1)).sum(-1) / safe_l,
        "sink_mass": torch.exp(stats.first - ref) / safe_l,
        "row_mass": mass,
    }
    sums = {name: _heads(torch.where(counted, value, 0.0)) for name, value in per_row.items()}
    sums["rows"] = _heads(counted.double())
    if sink is not None:
        sink_rows = torch.isfinite(sink).expand(b, h, q)
        if query_valid is not None:
            sink_rows = sink_rows & query_valid.to(torch.bool).reshape(b, 1, q)
        top = torch.maximum(torch.where(seen, m, -torch.inf), stats.extra)
        denominator = l_ * torch.exp(torch.where(seen, m - top, -torch.inf)) + torch.exp(stats.extra - top)
        share = torch.exp(sink.double() - top) / denominator
        sums["learned_sink"] = _heads(torch.where(sink_rows, share, 0.0))
        sums["sink_rows"] = _heads(sink_rows.double())
    zeros = torch.zeros(h, dtype=torch.float64, device=m.device)
    if target is None or stats.target is None:
        sums["outlier_capture"], sums["capture_rows"] = zeros, zeros.clone()
        return sums
    at_target = torch.exp(stats.target - ref) / safe_l
    sees_target = stats.target > -torch.inf
    if query_positions is None:
        query_positions = torch.arange(q, device=m.device)
    not_itself = query_positions.to(m.device).reshape(1, 1, q) != target.to(m.device).long().reshape(b, 1, 1)
    capture_rows = counted & sees_target & not_itself
    sums["outlier_capture"] = _heads(torch.where(capture_rows, at_target, 0.0))
    sums["capture_rows"] = _heads(capture_rows.double())
    return sums


@torch.no_grad()
def online_logit_sums(
    stats: RowStatistics,
    *,
    query_valid: torch.Tensor | None,
    query_positions: torch.Tensor,
    target: torch.Tensor | None,
) -> dict[str, float]:
    """The layer's logit-scale sums (:meth:`ssacli.diagnosis.metrics.LayerStats.add_logits`'s
    ``logit_sq``, ``logit_n`` and, with a target, ``target_sum``, ``target_sq``, ``target_n``) over
    the valid rows."""
    b, h, q = stats.logit_sq.shape
    rows = torch.ones(b, 1, q, dtype=torch.bool, device=stats.logit_sq.device)
    if query_valid is not None:
        rows = rows & query_valid.to(torch.bool).reshape(b, 1, q)
    out = {
        "logit_sq": float(torch.where(rows, stats.logit_sq, 0.0).sum()),
        "logit_n": float(torch.where(rows, stats.logit_n, 0.0).sum()),
    }
    if target is not None and stats.target_logit is not None:
        positions = query_positions.to(rows.device).reshape(1, 1, q)
        itself = positions == target.to(rows.device).long().reshape(b, 1, 1)
        x = stats.target_logit
        at = rows & ~itself & torch.isfinite(x)
        out["target_sum"] = float(torch.where(at, x, 0.0).sum())
        out["target_sq"] = float(torch.where(at, x * x, 0.0).sum())
        out["target_n"] = float(at.sum())
    return out


__all__ = ["online_logit_sums", "online_row_sums"]
