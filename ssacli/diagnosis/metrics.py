"""Saturation metrics of attention rows, reduced as they stream past, and :data:`METRICS`, the table
of what each metric is (:class:`MetricSpec`: description, direction, bounds, labels).

:func:`row_sums` turns one block of attention weights ``[batch, heads, q, k]`` into per-head sums
(a few numbers per head), so diagnose never keeps a weight map beyond the attention call that made
it. :class:`HeadStats` adds those sums up across blocks, batches and calls, and divides at the end.

Which rows count: valid queries only (padding queries are excluded), with at least two visible
keys (a row with one key has nothing to choose) and positive mass. Shape metrics read the row
normalized to sum to one, p = w / Σw, so scorers whose rows do not sum to one (sigmoid, softpick)
are compared on the shape of their attention; ``row_mass`` reports Σw itself.

* entropy: H(p) / log N_i, with N_i the row's visible keys (1 = uniform, 0 = one key);
* max_weight: max p; collapse_rate: share of rows with max p >= tau;
* effective_tokens: exp H(p); topk_mass: sum of the k largest p (k capped by N_i);
* sink_mass: p at key 0; outlier_capture: p at the probe's target key, over the rows that see it
  (the target's own row excluded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..defaults import TAU, TOP_K


@dataclass(frozen=True)
class MetricSpec:
    """Everything said about one metric outside its formula (:func:`row_sums` computes it).

    Every reader imports it from here: the JSON schema (``description``), the terminal and HTML
    reports (``header``, ``short``, ``key``, ``compared``, ``bounded``, the direction colors) and
    ``ssacli check`` (``direction``, to tell a regression)."""

    name: str
    description: str  # one line, written into every diagnose JSON under "metrics"
    higher_is_saturated: bool | None  # True: higher = more saturated; False: lower; None: no direction
    bounded: bool  # lies in [0, 1], so colors use a fixed [0, 1] scale that compares across models
    header: str  # column header in the per-probe tables (eight fit in 80 characters)
    short: str  # label in the comparison tables' two-line headers (four metrics × A, B, Δ fit 120)
    key: bool = False  # always a column of the per-probe tables (others only where they say something)
    compared: bool = False  # a column of the comparison tables and the A-vs-B figures

    @property
    def direction(self) -> str:
        """``"high"``, ``"low"`` or ``"none"``: which values mean saturated."""
        if self.higher_is_saturated is None:
            return "none"
        return "high" if self.higher_is_saturated else "low"


# The one table of metrics, in display order (also the order of every result's arrays).
METRICS: dict[str, MetricSpec] = {
    m.name: m
    for m in (
        MetricSpec("entropy", "normalized entropy H / log N_i (1 = uniform over visible keys, 0 = one key)",
                   False, True, "entropy", "ent", key=True, compared=True),
        MetricSpec("max_weight", "largest weight in the row", True, True, "max w", "maxw", key=True,
                   compared=True),
        MetricSpec("collapse_rate", "share of rows whose largest weight is >= tau", True, True, "collapse",
                   "coll", key=True, compared=True),
        MetricSpec("effective_tokens", "exp(H): how many keys the row effectively averages", False, False,
                   "eff. tok", "eff. tok", key=True),
        MetricSpec("topk_mass", "mass on the row's k largest weights", True, True, "top-k", "top-k",
                   key=True),
        MetricSpec("sink_mass", "weight on position 0", True, True, "sink", "sink", key=True),
        MetricSpec("outlier_capture",
                   "weight on the probe's target token, from the other queries that see it",
                   True, True, "capture", "capt", compared=True),
        MetricSpec("row_mass", "sum of the row's weights (1 for normalized scorers)", None, False, "row mass",
                   "row mass"),
    )
}  # fmt: skip


@torch.no_grad()
def row_sums(
    weights: torch.Tensor,
    visible: torch.Tensor | None = None,
    *,
    query_valid: torch.Tensor | None = None,
    query_positions: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    tau: float = TAU,
    top_k: int = TOP_K,
) -> dict[str, torch.Tensor]:
    """Per-head sums of every metric over the counted rows of one block.

    weights [b, h, q, k]; visible bool, broadcastable to it (None = all visible); query_valid
    [b, q] bool (None = all valid); query_positions [q]: each row's key index (to exclude the
    target's own row; default: bottom-right aligned, q rows ending at key k-1); target [b]: the
    key index whose captured mass ``outlier_capture`` measures (None = not measured).
    Returns float64 tensors [h]: ``<metric>`` sums, ``rows`` and ``capture_rows`` counts.
    """
    b, h, q, k = weights.shape
    w = weights.float()
    if visible is None:
        n_visible = torch.full((1, 1, q), k, device=w.device)
    else:  # count before broadcasting (cheap), and never let content at hidden keys in
        n_visible = visible.sum(-1)
        w = torch.where(visible, w, 0.0)
    n_visible = n_visible.expand(b, h, q)
    mass = w.sum(-1)
    counted = (n_visible >= 2) & (mass > 0) & torch.isfinite(mass)
    if query_valid is not None:
        counted &= query_valid.to(torch.bool).reshape(b, 1, q)
    # Shape metrics of p = w / m without building p: H(p) = log m - sum(w log w) / m.
    m = torch.where(counted, mass, 1.0)
    entropy = (torch.log(m) - torch.special.xlogy(w, w).sum(-1) / m).clamp_min(0.0)  # rounding
    max_p = w.amax(-1) / m
    k_top = min(top_k, k)
    per_row = {
        "entropy": entropy / torch.log(n_visible.clamp_min(2).float()),
        "max_weight": max_p,
        "collapse_rate": (max_p >= tau).float(),
        "effective_tokens": torch.exp(entropy),
        "topk_mass": w.topk(k_top, dim=-1).values.sum(-1) / m,
        "sink_mass": w[..., 0] / m,
        "row_mass": mass,
    }
    sums = {name: _sum_heads(torch.where(counted, value, 0.0)) for name, value in per_row.items()}
    sums["rows"] = _sum_heads(counted.double())
    if target is None:
        sums["outlier_capture"] = torch.zeros(h, dtype=torch.float64, device=w.device)
        sums["capture_rows"] = torch.zeros(h, dtype=torch.float64, device=w.device)
        return sums
    if query_positions is None:
        query_positions = torch.arange(k - q, k, device=w.device)
    target = target.to(w.device).long().reshape(b, 1, 1, 1)
    at_target = w.gather(-1, target.expand(b, h, q, 1)).squeeze(-1) / m
    if visible is None:
        sees_target = torch.ones(1, 1, q, dtype=torch.bool, device=w.device)
    else:  # gather from a broadcast view: [b, heads of the mask (1 or h), q]
        view = visible.expand(b, visible.shape[1], q, k)
        sees_target = view.gather(-1, target.expand(b, view.shape[1], q, 1)).squeeze(-1)
    not_itself = query_positions.to(w.device).reshape(1, 1, q) != target.reshape(b, 1, 1)
    capture_rows = counted & sees_target & not_itself
    sums["outlier_capture"] = _sum_heads(torch.where(capture_rows, at_target, 0.0))
    sums["capture_rows"] = _sum_heads(capture_rows.double())
    return sums


def _sum_heads(x: torch.Tensor) -> torch.Tensor:
    return x.double().sum(dim=(0, 2))


class HeadStats:
    """Running sums of :func:`row_sums` for one attention layer; ``means()`` gives [h] per metric."""

    def __init__(self, num_heads: int) -> None:
        self.num_heads = num_heads
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, sums: dict[str, torch.Tensor]) -> None:
        for name, value in sums.items():
            value = value.detach().cpu()
            if name in self.sums:
                self.sums[name] += value
            else:
                self.sums[name] = value.clone()

    @property
    def rows(self) -> int:
        """Rows counted (the most any head counted; heads differ only for zero-mass rows)."""
        rows = self.sums.get("rows")
        return 0 if rows is None else int(rows.max().item())

    def means(self) -> dict[str, np.ndarray]:
        """Mean of each metric per head; NaN where a head counted no row."""
        empty = np.full(self.num_heads, math.nan)
        if not self.sums:
            return {name: empty.copy() for name in METRICS}
        out = {}
        for name in METRICS:
            count = self.sums["capture_rows" if name == "outlier_capture" else "rows"].numpy()
            total = self.sums[name].numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = np.where(count > 0, total / np.maximum(count, 1), math.nan)
        return out
