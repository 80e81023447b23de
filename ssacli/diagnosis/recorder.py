"""The observer diagnose plugs into attention (:class:`Recorder`): a probe's effect inside the
attention function, and what every attention call leaves behind.

Where a probe acts is declared by its kind (:class:`ssacli.diagnosis.probe_kinds.ActsOn`); its effect is
one of :data:`SHIFTS`. On the keys or the attention logits the :class:`Recorder` applies it inside
ssacli's attention function (:attr:`Recorder.probe`); on the input embeddings
:mod:`ssacli.diagnosis.forward`'s hook does. Every attention map reaches :meth:`Recorder.record` with
the logits it was scored from (through ssacli's attention function in query blocks, or on the eager
fallback through the forward hook of :mod:`ssacli.diagnosis.routes` on each attention module), is
reduced to per-row statistics (:func:`ssacli.kernels.row_stats.weight_statistics`, the same
statistics the fused path's :meth:`Recorder.record_rows` receives) and dropped; the statistics leave
as per-head sums (:func:`~ssacli.diagnosis.row_metrics.row_sums` into
:class:`~ssacli.diagnosis.row_metrics.HeadStats`) and per-layer sums (:class:`LayerStats`: the
logits' scale, the layer outputs' magnitudes), beside each prompt's collapse and where a forward
first overflowed (:class:`Overflow`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..attention.forward import Observer
from ..kernels.positions import PositionBins
from ..kernels.row_stats import RowStatistics, weight_statistics
from ..models.integrity import all_finite
from .metrics import LAYER_METRICS
from .probe_kinds import ActsOn, ProbeKind, Shift
from .row_metrics import PROMPT_SUMS, HeadStats, PromptStats, logit_sums, row_sums

# ---- the probes' shifts ------------------------------------------------------------------------------
# Each takes (values, level, target) -> values. Embeddings: [b, tokens, ...] (ICL: x values [b, points]);
# keys: [b, h, k, d]; logits: [b, h, q, k]; target [b] indexes the probed token (probes.Shift).


def scale(values: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    return values * level


def scale_target(values: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    values = values.clone()  # a copy: the module's own output is left as it was
    rows = torch.arange(values.shape[0], device=values.device)
    values[rows, target.to(values.device)] *= level
    return values


def scale_target_key(keys: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    factor = torch.ones(keys.shape[0], 1, keys.shape[2], 1, dtype=keys.dtype, device=keys.device)
    # a level past the dtype's range becomes inf (so the forward overflows, and says so), not an error
    level_t = torch.tensor(level, dtype=torch.float64).to(keys.dtype)
    factor[torch.arange(keys.shape[0], device=keys.device), 0, target.to(keys.device), 0] = level_t
    return keys * factor


def raise_target_key(logits: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    k = logits.shape[-1]
    bump = F.one_hot(target.to(logits.device), k).to(logits.dtype) * level
    return logits + bump.reshape(-1, 1, 1, k)


SHIFTS = {
    Shift.SCALE: scale,
    Shift.SCALE_TARGET: scale_target,
    Shift.SCALE_TARGET_KEY: scale_target_key,
    Shift.RAISE_TARGET_KEY: raise_target_key,
}


def shifted(kind: ProbeKind, values: torch.Tensor, level: float, target: torch.Tensor | None) -> torch.Tensor:
    """``values`` under probe ``kind`` at ``level``."""
    return SHIFTS[kind.effect](values, level, target)


class Overflow:
    """Where a forward first produced a non-finite value (or a norm's sum of squares overflowed)."""

    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None  # {"layer": index or None, "where": module or stage}

    def note(self, layer: int | None, where: str) -> None:
        if self.first is None:
            self.first = {"layer": layer, "where": where}


class Recorder(Observer):
    """The :class:`~ssacli.attention.forward.Observer` diagnose plugs into attention: the probe's
    ``effect`` on every call's keys (:meth:`transform_key`, before the logits are formed) or logits
    (:meth:`transform`) when :attr:`probe` is set, and the reduction of every block of attention
    weights (or of the fused path's row statistics) into per-layer :class:`HeadStats`."""

    def __init__(
        self, layer_of: dict[int, int], *, tau: float, top_k: int, block_size: int, causal: bool,
        stats: str = "eager", positions: PositionBins | None = None, prompts: PromptStats | None = None,
    ):  # fmt: skip
        self.layer_of = layer_of
        self.tau, self.top_k, self.block_size, self.causal = tau, top_k, block_size, causal
        self.positions = positions  # the bins of the sink and position metrics (None: not measured)
        # "eager": blocks of weights reduced to row statistics; "fused": those of one blocked pass
        # (ssacli.attention.forward.online_observed_attention), refused where a call cannot; "auto":
        # fused where a call can.
        self.stats_mode = stats
        self.calls = {"fused": 0, "eager": 0}  # which path measured each attention call
        self.stats: dict[int, HeadStats] = {}
        self.layers: dict[int, LayerStats] = {}  # logits' scale, hidden states
        self.overflow = Overflow()
        self.prompts = prompts  # each prompt's collapse (the noise a verdict reads a change against)
        self.batch = 0  # the index of the batch being recorded (forward_batch sets it)
        self.valid: torch.Tensor | None = None  # [b, t] real tokens of the current batch
        self.target: torch.Tensor | None = None  # [b] target token of the current batch (outlier_capture)
        # Where a shift can be absorbed: the normalization modules run since the last attention layer
        # began, and per layer those that ran before its first call (see :func:`absorber`).
        self.norms_seen: list[str] = []
        self.norms_before: dict[int, list[str]] = {}
        # The probe that acts inside attention in the current forward: (kind, level), or None
        # (reference levels, and probes that act on embeddings or inputs).
        self.probe: tuple[ProbeKind, float] | None = None
        # The kind of the probe being run, at every level (its reference level too): all levels of a
        # probe on the logits take the same attention path (changes_logits), so a level that changes
        # nothing reads exactly as the reference instead of differing by another kernel's rounding.
        self.probe_kind: ProbeKind | None = None

    def transform_key(self, key: torch.Tensor, module: nn.Module) -> torch.Tensor:
        if self.probe is not None and self.probe[0].acts_on is ActsOn.KEYS:
            kind, level = self.probe
            if self.target is not None and key.shape[0] == self.target.shape[0]:
                return shifted(kind, key, level, self.target)
        return key

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        if self.probe is not None and self.probe[0].acts_on is ActsOn.LOGITS:
            kind, level = self.probe
            logits = shifted(kind, logits, level, self.target)
        layer = self.layer_of.get(id(module))
        if layer is not None and not torch.isfinite(logits).all():
            self.overflow.note(layer, "attention logits")
        return logits

    def transform_block(self, logits: torch.Tensor, module: nn.Module, cols: slice) -> torch.Tensor:
        """:meth:`transform` of the key columns ``cols`` (the fused statistics): a target outside them
        is sent to one spare column (dropped after), so the effect changes exactly the entries it
        changes on whole rows."""
        if self.probe is None or self.probe[0].acts_on is not ActsOn.LOGITS:
            return logits
        kind, level = self.probe
        if self.target is None or not kind.has_target:
            return shifted(kind, logits, level, self.target)
        width = logits.shape[-1]
        local = self.target.to(logits.device).long() - cols.start
        local = torch.where((local < 0) | (local >= width), width, local)
        return shifted(kind, F.pad(logits, (0, 1)), level, local)[..., :width]

    def changes_logits(self, module: nn.Module) -> bool:
        # probe_kind while diagnose runs a probe; probe alone where a caller sets only that
        kind = self.probe_kind or (self.probe[0] if self.probe is not None else None)
        return kind is not None and kind.acts_on is ActsOn.LOGITS

    def layer_stats(self, layer: int) -> LayerStats:
        if layer not in self.layers:
            self.layers[layer] = LayerStats()
        return self.layers[layer]

    def record(self, module, weights, visible, query_positions, sink=None, logits=None) -> None:
        """One block of weights, reduced to the per-row statistics :meth:`record_rows` takes (with the
        block's logits, for the logit scale)."""
        layer = self.layer_of.get(id(module))
        if layer is None:
            return
        if logits is not None and logits.shape != weights.shape:
            logits = None
        target = None
        if self.valid is not None and self.valid.shape[-1] == weights.shape[-1]:  # keys: this batch's tokens
            target = self.target
        stats = weight_statistics(
            weights, visible, logits=logits, target=target, top_k=self.top_k, sink=sink,
            positions=self.positions, query_positions=query_positions,
        )  # fmt: skip
        self._add(layer, stats, query_positions, "eager")

    def record_rows(self, module, stats: RowStatistics, query_positions) -> None:
        """:meth:`record` for the fused path: one call's per-row statistics instead of its weights."""
        layer = self.layer_of.get(id(module))
        if layer is not None:
            self._add(layer, stats, query_positions, "fused")

    def _add(self, layer: int, stats: RowStatistics, query_positions, path: str) -> None:
        """One call's (or block's) statistics into the layer's sums: the row metrics and the logit scale."""
        if layer not in self.norms_before:
            self.norms_before[layer] = self.norms_seen
        self.norms_seen = []
        self.calls[path] += 1
        if not stats.finite_logits:
            self.overflow.note(layer, "attention logits")
        if not stats.finite_output:
            self.overflow.note(layer, "attention weights")
        valid = target = None
        if self.valid is not None and self.valid.shape[-1] == stats.keys:  # keys are this batch's tokens
            valid = self.valid.to(stats.max.device)[:, query_positions]
            target = self.target
        sums = logit_sums(stats, query_valid=valid, query_positions=query_positions, target=target)
        if sums:
            layer_stats = self.layer_stats(layer)
            for name, value in sums.items():
                layer_stats.sums[name] += value
        prompts = self.prompts
        sums = row_sums(
            stats, query_valid=valid, query_positions=query_positions, target=target,
            tau=self.tau, top_k=self.top_k,
            prompts=prompts is not None, prompt_length=None if prompts is None else prompts.length,
        )  # fmt: skip
        if prompts is not None:
            prompts.add(layer, self.batch, [sums.pop(name) for name in PROMPT_SUMS])
        if layer not in self.stats:
            self.stats[layer] = HeadStats(stats.max.shape[1])
        self.stats[layer].add(sums)

    def hidden_hook(self, layer: int):
        """Forward hook on a block: its output's values on real tokens feed the layer's massive
        activations and kurtosis; a non-finite output is an overflow."""

        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or not hidden.is_floating_point():
                return
            if not all_finite(hidden):
                self.overflow.note(layer, f"layer {layer} output")
            if self.valid is not None and self.valid.shape == hidden.shape[:2]:
                values = hidden[self.valid.to(hidden.device)]
            else:
                values = hidden.flatten(0, 1)
            self.layer_stats(layer).add_hidden(values.detach().float().flatten())

        return hook

    def norm_hook(self, layer: int | None, name: str):
        """Forward pre-hook on a normalization module: an input whose sum of squares is not finite
        in float32 overflows the norm (RMSNorm turns it into zeros, LayerNorm into NaN)."""

        def hook(module, args):
            self.norms_seen.append(name)
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if x is None or not x.is_floating_point():
                return
            x = x.float()
            if not all_finite(torch.einsum("...i,...i->...", x, x)):  # Σx² per row, no x² tensor
                self.overflow.note(layer, name)

        return hook


# ---- the per-layer sums: the logits' scale and the layer outputs' magnitudes --------------------


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
        m2 = d2.sum()
        # d³ and d⁴ over d's and d²'s own buffers: the same products (d·d² = d²·d), two fewer
        # allocations of the layer's size (8 bytes per value of every token)
        m3 = d.mul_(d2).sum()
        m4 = d2.mul_(d2).sum()
        values = torch.stack([mean, m2, m3, m4]).tolist()  # one sync
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


__all__ = [
    "SHIFTS", "LayerStats", "Moments", "Overflow", "Recorder", "shifted", "top3_and_median",
]  # fmt: skip
