"""Saturation metrics of attention rows, summed as they stream past; what each metric is
(:data:`METRICS`, :class:`MetricSpec`) is :mod:`ssacli.diagnosis.metric_table`'s, torch-free.

Every path of diagnose reduces an attention call to per-row statistics
(:class:`ssacli.kernels.row_stats.RowStatistics`), and :func:`ssacli.diagnosis.row_metrics.row_sums`
derives per-head sums of every metric from them (a few numbers per head; which rows count and each
formula are said there), so diagnose never keeps a weight map beyond the attention call that made it.
:class:`HeadStats` adds those sums up across blocks, batches and calls, and divides at the end;
:class:`LayerStats` does the same for the per-layer metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..defaults import SINK_EPS
from .metric_table import (  # noqa: F401 (the table's names, importable from here as before)
    LAYER_METRICS,
    METRICS,
    POSITION_METRICS,
    POSITION_PROFILES,
    QUALITY_METRICS,
    MetricSpec,
    metric_spec,
)


class HeadStats:
    """Running sums of :func:`~ssacli.diagnosis.row_metrics.row_sums` for one attention layer; ``means()``
    gives [h] per metric."""

    def __init__(self, num_heads: int) -> None:
        self.num_heads = num_heads
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, sums: dict[str, torch.Tensor]) -> None:
        for name, value in sums.items():
            value = value.detach().cpu()
            if name not in self.sums:
                self.sums[name] = value.clone()
                continue
            kept = self.sums[name]
            if value.dim() == 2 and value.shape[-1] != kept.shape[-1]:  # a longer call has more bins
                width = max(value.shape[-1], kept.shape[-1])
                kept = torch.nn.functional.pad(kept, (0, width - kept.shape[-1]))
                value = torch.nn.functional.pad(value, (0, width - value.shape[-1]))
            self.sums[name] = kept + value

    @property
    def rows(self) -> int:
        """Rows counted (the most any head counted; heads differ only for zero-mass rows)."""
        rows = self.sums.get("rows")
        return 0 if rows is None else int(rows.max().item())

    def means(self) -> dict[str, np.ndarray]:
        """Mean of each metric per head; NaN where a head counted no row, and for a metric whose sum
        (or count) the run did not give: the position terms where they were not measured, the
        learned sink in a layer without one."""
        empty = np.full(self.num_heads, math.nan)
        if not self.sums:
            return {name: empty.copy() for name in METRICS}
        out = {}
        for name, spec in METRICS.items():
            if spec.divisor is None:
                continue  # derived below, from the means
            if name not in self.sums or spec.divisor not in self.sums:
                out[name] = empty.copy()
                continue
            count = self.sums[spec.divisor].numpy()
            total = self.sums[name].numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = np.where(count > 0, total / np.maximum(count, 1), math.nan)
        out["sink_rate"] = sink_indicator(out["sink_mass"])
        out["sink_boost"] = empty.copy()
        if "sink_uniform" in self.sums:
            with np.errstate(invalid="ignore", divide="ignore"):
                share, uniform = self.sums["sink_share"].numpy(), self.sums["sink_uniform"].numpy()
                out["sink_boost"] = np.where(uniform > 0, share / np.where(uniform > 0, uniform, 1), math.nan)
        return out

    def profiles(self) -> dict[str, np.ndarray] | None:
        """Per head the position profiles [h, bins], means over the counted rows (``received``: share
        per key bin; ``received_boost``: that over the uniform share; ``distance_profile``: share per
        distance bin); None where the run did not measure them."""
        if "received" not in self.sums:
            return None
        rows = np.maximum(self.sums["rows"].numpy(), 1)[:, None]
        received, uniform = self.sums["received"].numpy(), self.sums["received_uniform"].numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            boost = np.where(uniform > 0, received / np.where(uniform > 0, uniform, 1), math.nan)
        empty = (self.sums["rows"].numpy() == 0)[:, None]
        return {
            "received": np.where(empty, math.nan, received / rows),
            "received_boost": np.where(empty, math.nan, boost),
            "distance_profile": np.where(empty, math.nan, self.sums["distance_profile"].numpy() / rows),
        }


class PromptStats:
    """Each prompt's collapsed and counted rows per head (``row_sums``' prompt sums: one prompt per
    sample, or with ``length`` a sample's rows cut into windows of that many query positions), kept
    per layer and batch, so that a verdict can read a level's change against its prompt-to-prompt
    noise (ssacli.diagnosis.outputs)."""

    def __init__(self, length: int | None = None) -> None:
        self.length = length
        self.sums: dict[int, dict[int, list[torch.Tensor]]] = {}  # layer -> batch -> [b, h, windows] ×2

    def add(self, layer: int, batch: int, values: list[torch.Tensor]) -> None:
        kept = self.sums.setdefault(layer, {}).get(batch)
        if kept is None:
            self.sums[layer][batch] = values
            return
        pad = torch.nn.functional.pad
        for i, value in enumerate(values):
            width = max(value.shape[-1], kept[i].shape[-1])
            kept[i] = pad(kept[i], (0, width - kept[i].shape[-1])) + pad(value, (0, width - value.shape[-1]))

    def rates(self, layers: int, heads: int) -> np.ndarray | None:
        """[prompt, layer, head]: each prompt's collapse rate per head (NaN where it counted no row,
        and in a layer that recorded none), prompts in input order (batch, sample, then window); None
        where nothing was kept."""
        if not self.sums:
            return None
        blocks = []
        for batch in sorted({b for per in self.sums.values() for b in per}):
            kept = [(layer, per[batch]) for layer, per in self.sums.items() if batch in per]
            b, windows = kept[0][1][0].shape[0], max(v[0].shape[-1] for _, v in kept)
            block = np.full((b, windows, layers, heads), math.nan)
            for layer, (collapsed, rows) in kept:
                collapsed, rows = collapsed.numpy(), rows.numpy()
                with np.errstate(invalid="ignore", divide="ignore"):
                    rate = np.where(rows > 0, collapsed / np.maximum(rows, 1), math.nan)  # [b, h, w]
                block[:, : rate.shape[2], layer, : rate.shape[1]] = rate.transpose(0, 2, 1)
            blocks.append(block.reshape(b * windows, layers, heads))
        return np.concatenate(blocks)


def sink_indicator(sink_mass: np.ndarray, eps: float = SINK_EPS) -> np.ndarray:
    """Gu et al. (2024): 1 where a head's mean weight on the first token exceeds ``eps``, 0 where it
    does not, NaN where it is undefined. Its mean over heads is the sink rate."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(sink_mass), (sink_mass > eps).astype(float), math.nan)


def top3_and_median(magnitude: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The three largest values of a 1-d tensor, descending, and its lower median: what
    ``topk(3).values`` and ``median()`` give. On the CPU numpy's partition (introselect) finds the
    median, and the top 3 lie in the part above it: one pass, several times faster than
    torch.median and topk (docs/performance.md); a NaN, which torch ranks above everything and
    numpy sorts last, takes torch's own path."""
    n = magnitude.numel()
    if magnitude.device.type == "cpu" and n >= 3:
        values = magnitude.detach().numpy()
        if not np.isnan(values).any():
            mid = (n - 1) // 2
            part = np.partition(values, mid)
            upper = part[min(mid, n - 3) :]  # holds the 3 largest
            top = np.sort(np.partition(upper, len(upper) - 3)[-3:])[::-1]
            return torch.from_numpy(top.copy()), float(part[mid])
    return magnitude.topk(min(3, n)).values, float(magnitude.median())


class LayerStats:
    """Running per-layer sums: the logits' sum of squares (all and at the target key, added from the
    row statistics by :func:`~ssacli.diagnosis.row_metrics.logit_sums`) and the layer output's top-3
    |h|, per-batch medians and central moments (for the kurtosis)."""

    def __init__(self) -> None:
        self.sums = dict.fromkeys(("logit_sq", "logit_n", "target_sum", "target_sq", "target_n",
                                   "median_sum", "median_n"), 0.0)  # fmt: skip
        self.top: torch.Tensor | None = None
        self.moments = Moments()

    def add_hidden(self, values: torch.Tensor) -> None:
        """values: the layer output's entries on real tokens, flattened."""
        if values.numel() == 0:
            return
        x = values.double()
        top, median = top3_and_median(x.abs())
        if self.top is not None:
            top = torch.cat([self.top, top])
            top = top.topk(min(3, len(top))).values
        self.top = top
        self.sums["median_sum"] += median
        self.sums["median_n"] += 1
        self.moments.merge(Moments.of(x))

    def means(self) -> dict[str, float]:
        s = self.sums
        out = dict.fromkeys(LAYER_METRICS, math.nan)
        if s["logit_n"]:
            out["logit_rms"] = math.sqrt(s["logit_sq"] / s["logit_n"])
        if s["target_n"]:
            out["target_logit_rms"] = math.sqrt(s["target_sq"] / s["target_n"])
            out["target_logit_mean"] = s["target_sum"] / s["target_n"]
        if self.top is not None:
            for i, value in enumerate(self.top.tolist()):
                out[f"massive_top{i + 1}"] = value
            out["hidden_median"] = s["median_sum"] / s["median_n"]
            if out["hidden_median"] > 0:
                out["massive_ratio"] = out["massive_top1"] / out["hidden_median"]
        if self.moments.n:
            out["kurtosis"] = self.moments.kurtosis()
        return out


@dataclass
class Moments:
    """Count, mean and the central sums M2, M3, M4 (Σ(x - mean)^p) of the values seen, in float64.

    Raw power sums Σx..Σx⁴ would lose every digit of the kurtosis exactly where it matters: a layer
    output with a massive mean (|mean| ≫ std) makes Σx⁴ and its correction terms agree in all their
    ~16 digits. So each batch is reduced about its own mean, and batches are combined with the exact
    pairwise update (Chan, Golub & LeVeque 1979; Pébay 2008), which never forms a raw sum."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    m3: float = 0.0
    m4: float = 0.0

    @classmethod
    def of(cls, values: torch.Tensor) -> Moments:
        """The moments of one batch of values (any shape), two-pass about the batch's own mean."""
        x = values.double().flatten()
        if x.numel() == 0:
            return cls()
        # A constant batch has no spread at all; its float64 mean can miss the value by an ulp,
        # which would make a spread of rounding error (and a kurtosis of 1) out of nothing.
        low, high = torch.aminmax(x)  # one pass; a NaN makes both NaN, so the mean (NaN) is taken
        mean = torch.where(low == high, low, x.mean())
        d = x - mean
        d2 = d * d
        values = torch.stack([mean, d2.sum(), (d2 * d).sum(), (d2 * d2).sum()]).tolist()  # one sync
        return cls(x.numel(), *values)

    def merge(self, other: Moments) -> None:
        """Add ``other``'s values to these (in place): the moments of both sets together."""
        a, b = self, other
        if b.n == 0:
            return
        if a.n == 0:
            self.n, self.mean, self.m2, self.m3, self.m4 = b.n, b.mean, b.m2, b.m3, b.m4
            return
        na, nb = float(a.n), float(b.n)
        n = na + nb
        delta = b.mean - a.mean
        m2 = a.m2 + b.m2 + delta**2 * na * nb / n
        m3 = a.m3 + b.m3 + delta**3 * na * nb * (na - nb) / n**2 + 3 * delta * (na * b.m2 - nb * a.m2) / n
        m4 = (
            a.m4 + b.m4
            + delta**4 * na * nb * (na * na - na * nb + nb * nb) / n**3
            + 6 * delta**2 * (na * na * b.m2 + nb * nb * a.m2) / n**2
            + 4 * delta * (na * b.m3 - nb * a.m3) / n
        )  # fmt: skip
        self.n, self.mean, self.m2, self.m3, self.m4 = a.n + b.n, a.mean + delta * nb / n, m2, m3, m4

    def kurtosis(self) -> float:
        """Pearson's kurtosis (M4/n) / (M2/n)² (Gaussian: 3); NaN for no spread or non-finite values."""
        return self.n * self.m4 / (self.m2 * self.m2) if self.m2 > 0 else math.nan
