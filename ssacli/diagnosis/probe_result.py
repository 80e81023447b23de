"""One probe's result: its metric arrays over the levels swept, and what they say per probe.

:class:`ProbeResult` holds the arrays of one probe (every metric ``[level, layer, head]``, NaN where
undefined) and the per-probe summaries every report reads: where the probe acts and whether its
shift arrived there (:meth:`ProbeResult.reached`, :data:`REACH_SHARE`; what absorbed it where it did
not), the baseline-relative collapse point (model-wide, per layer and per head; heads collapsed at
the first level are set apart), the level where heads differ most, and the length probe's fading
slopes. :mod:`ssacli.diagnosis.result` gathers the probes into the whole result and its JSON schema;
:mod:`ssacli.diagnosis.findings` reads them into sentences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .metrics import sink_indicator
from .positions import PositionProfiles
from .probe_kinds import PROBES

COLLAPSE_SHARE = 0.5  # collapse point: first level where the collapse rate reaches this share
# "Reached": at the top measured level, the shift measured where the probe acts is at least this share
# of the shift asked, in every layer: in log space for a factor (asked ×σ: measured ≥ ×σ^0.5), linearly
# for an offset (asked +M: measured ≥ +M/2). Why half: a shift that arrives does so in proportion (keys
# are linear in the token's vector: ×σ; q and k both scaled: ×σ²; an offset on the logits: exactly +M),
# while a normalization leaves a factor of order one that does not grow with σ (RMSNorm divides σ out
# and only the token's direction moves: ×0.95–1.4 at σ = 1000 on tiny Llama/GPT-2, ×1.07 at σ = 10 on a
# real Llama). The geometric midpoint between "nothing" and "all of it" keeps both far from the line
# (σ = 1000: ×31.6) where the top level is large; a top level near 1 (σ = 2: ×1.41) separates less.
REACH_SHARE = 0.5


@dataclass
class ProbeResult:
    """One probe swept over its levels. ``metrics[name]`` has shape [level, layer, head]."""

    name: str
    levels: list[float]
    metrics: dict[str, np.ndarray]
    rows: np.ndarray  # [level, layer]: query rows counted
    extras: dict[str, list[float | None]] = field(default_factory=dict)  # per level, e.g. loss
    note: str | None = None  # why the probe was skipped or limited
    layer_metrics: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [level, layer]
    overflow: list[dict[str, Any] | None] = field(default_factory=list)  # per level: where it overflowed
    insensitive: str | None = None  # why the scorer cannot respond to this probe by construction
    absorbers: list[str | None] = field(default_factory=list)  # per layer: the norm a shift meets before it
    # where attention lands at the probe's reference level (in memory; a result keeps the baseline's)
    positions: PositionProfiles | None = None
    # [level, prompt]: each prompt's fresh collapse rate (the mean over the heads not collapsed at the
    # first level, as fresh_collapse_rate; NaN-padded), prompt j the same text at every level (a longer
    # input cut at the base length); None in results from before it was kept (no noise estimate)
    prompt_collapse: np.ndarray | None = None
    # per level, per input sequence (None where not measured): "output_kl", each prompt's mean KL
    # per token, so that two models probed with one seed pair up prompt by prompt (ssacli report)
    per_input: dict[str, list[list[float] | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.overflow:
            self.overflow = [None] * len(self.levels)
        if "sink_rate" not in self.metrics and "sink_mass" in self.metrics:  # a schema-1 result
            self.metrics["sink_rate"] = sink_indicator(self.metrics["sink_mass"])

    @property
    def skipped(self) -> bool:
        return not any(np.isfinite(v).any() for v in self.metrics.values()) and not any(self.overflow)

    @property
    def kind(self):
        return PROBES.get(self.name)

    def overflowed(self, index: int) -> dict[str, Any] | None:
        return self.overflow[index] if index < len(self.overflow) else None

    @property
    def all_overflowed(self) -> bool:
        """Every level's forward was non-finite: nothing was measured (reports say so, plot nothing)."""
        return bool(self.overflow) and all(self.overflow)

    def first_overflow(self) -> tuple[float, dict[str, Any]] | None:
        for level, where in zip(self.levels, self.overflow):
            if where:
                return level, where
        return None

    # ---- where the probe acts ----------------------------------------------------------------------
    def reach(self) -> np.ndarray | None:
        """[level, layer]: the logits' RMS at each level ÷ at the first level (on the target key
        for probes with one). None where the logits were not observed (eager fallback)."""
        name = "target_logit_rms" if self.kind is not None and self.kind.has_target else "logit_rms"
        values = self.layer_metrics.get(name)
        if values is None or not np.isfinite(values).any():
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return values / values[:1]

    def reach_model(self) -> list[float | None]:
        """Per level: the mean over layers of :meth:`reach` (1.00 = the logits did not move)."""
        ratio = self.reach()
        if ratio is None:
            return [None] * len(self.levels)
        return json_ready(nanmean(ratio, axis=1))

    def reach_measure(self) -> str | None:
        """The layer metric a magnitude probe's reach is read from, where the probe acts: the target
        key's logits for one-token probes (their mean for an offset, dominant-key; their RMS for a
        factor, outlier and key-scale), every visible logit for global ones (embed-scale,
        logit-scale). None for probes that shift no magnitude (length, numeric)."""
        kind = self.kind
        if kind is None or not kind.magnitude:
            return None
        if kind.additive:
            return "target_logit_mean"
        return "target_logit_rms" if kind.has_target else "logit_rms"

    def reach_shift(self) -> np.ndarray | None:
        """[level, layer]: the shift measured where the probe acts, relative to the first level: a
        factor (the RMS ÷ the first level's) or, for an offset, the mean's difference. None where
        not measured (eager fallback, a result from before the measure existed)."""
        name = self.reach_measure()
        values = self.layer_metrics.get(name) if name else None
        if values is None or not np.isfinite(values).any():
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return values - values[:1] if self.kind.additive else values / values[:1]

    def reach_share(self) -> np.ndarray | None:
        """[level, layer]: the share of the asked shift that arrived (1 = all of it; see
        :data:`REACH_SHARE`): log(measured factor) ÷ log(level ÷ first level), or measured offset ÷
        (level − first level). NaN at the first level and wherever nothing was asked or measured."""
        shift = self.reach_shift()
        if shift is None:
            return None
        levels = np.asarray(self.levels, dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.kind.additive:
                asked, got = levels - levels[0], shift
            else:
                asked, got = np.log(levels / levels[0]), np.log(shift)
            share = got / asked[:, None]
        share[~np.isfinite(share) | (asked[:, None] == 0)] = np.nan
        return share

    def reach_index(self) -> int | None:
        """The top measured level (index) that asked for a shift: the one :meth:`reached` judges."""
        share = self.reach_share()
        if share is None:
            return None
        measured = [i for i in range(1, len(self.levels)) if np.isfinite(share[i]).any()]
        return measured[-1] if measured else None

    def reached_layers(self) -> list[bool | None]:
        """Per layer: whether the shift arrived at the top measured level (None: not measured there)."""
        index = self.reach_index()
        if index is None:
            return [None] * self.rows.shape[1]
        return [None if not math.isfinite(v) else bool(v >= REACH_SHARE) for v in self.reach_share()[index]]

    def reached(self) -> bool | None:
        """Whether the probe's shift arrived where it acts, in every measured layer, at the top
        measured level (:data:`REACH_SHARE`); None: not measured, or not a magnitude probe."""
        if self.reach_index() is None:
            return None
        layers = [r for r in self.reached_layers() if r is not None]
        return all(layers) if layers else None

    def absorbed_layer(self) -> int | None:
        """The first layer the shift did not reach (None where it reached, or was not measured)."""
        if self.reached() is not False:
            return None
        return next(i for i, r in enumerate(self.reached_layers()) if r is False)

    def absorbed_by(self) -> str | None:
        """What absorbed a probe that did not arrive: the normalization module the shift met before
        the first layer it did not reach (:attr:`absorbers`, e.g. "model.layers.0.input_layernorm"),
        else that layer itself; None where the probe arrived or was not measured."""
        layer = self.absorbed_layer()
        if layer is None:
            return None
        name = self.absorbers[layer] if layer < len(self.absorbers) else None
        return name or f"layer {layer}'s inputs"

    # ---- baseline-relative collapse ---------------------------------------------------------------
    def baseline_collapsed(self) -> np.ndarray:
        """[layer, head] bool: heads whose collapse rate already reaches COLLAPSE_SHARE at the first level."""
        if "collapse_rate" not in self.metrics:
            return np.zeros(self.rows.shape[1:2] + (0,), dtype=bool)
        first = self.metrics["collapse_rate"][0]
        with np.errstate(invalid="ignore"):
            return np.isfinite(first) & (first >= COLLAPSE_SHARE)

    def baseline_collapsed_heads(self) -> list[tuple[int, int]]:
        return [(int(layer), int(head)) for layer, head in zip(*np.nonzero(self.baseline_collapsed()))]

    def fresh_collapse_rate(self) -> np.ndarray:
        """Per level: the mean collapse rate over the heads not collapsed at the first level."""
        rates = self.metrics["collapse_rate"].copy()
        rates[:, self.baseline_collapsed()] = np.nan
        return nanmean(rates.reshape(len(self.levels), -1), axis=1)

    def prompt_collapse_of(self, per_level: list[np.ndarray | None]) -> np.ndarray | None:
        """:attr:`prompt_collapse` from each level's [prompt, layer, head] collapse rates (None: a
        level that did not run or kept none), over the heads :meth:`fresh_collapse_rate` averages."""
        if not any(rates is not None for rates in per_level):
            return None
        fresh = ~self.baseline_collapsed()
        width = max(len(rates) for rates in per_level if rates is not None)
        out = np.full((len(self.levels), width), np.nan)
        for index, rates in enumerate(per_level):
            if rates is not None and not self.overflowed(index):
                kept = np.where(fresh, rates[:, : fresh.shape[0], : fresh.shape[1]], np.nan)
                out[index, : len(rates)] = nanmean(kept.reshape(len(rates), -1), axis=1)
        return out

    def change_from_first(self, metric: str) -> np.ndarray:
        mean = self.model_mean(metric)
        return mean - mean[0]

    def model_mean(self, metric: str) -> np.ndarray:
        """Mean over every head of every layer, per level (each head counts once)."""
        return nanmean(self.metrics[metric].reshape(len(self.levels), -1), axis=1)

    def layer_mean(self, metric: str) -> np.ndarray:
        """[level, layer]: mean over the heads of each layer."""
        return nanmean(self.metrics[metric], axis=2)

    def collapse_point(self) -> float | None:
        """Smallest level after the first at which the mean collapse rate of the heads not
        collapsed at the first level reaches 0.5; None if never (or undefined: see
        :meth:`collapse_status`)."""
        if self.insensitive:
            return None
        return _first_level(self.levels[1:], self.fresh_collapse_rate()[1:])

    def collapse_status(self) -> str:
        """How to read the collapse point: a level, "none", "n/a" (insensitive by construction),
        "absorbed by MODULE" (the shift did not arrive: :meth:`reached`), or "overflow at LEVEL"
        before any collapse."""
        if self.insensitive:
            return "n/a"
        point = self.collapse_point()
        flow = self.first_overflow()
        if flow is not None and (point is None or flow[0] <= point):
            return f"overflow at {flow[0]:g}"
        if point is not None:
            return f"{point:g}"
        if self.reached() is False:
            return f"absorbed by {self.absorbed_by()}"
        return "none"

    def head_collapse_points(self) -> list[list[float | None]]:
        """[layer][head]: smallest level after the first at which that head's collapse rate reaches
        0.5; None if never, and for heads collapsed at the first level (:meth:`baseline_collapsed_heads`)."""
        rates = self.metrics["collapse_rate"]
        base = self.baseline_collapsed()
        return [
            [
                None if base[layer, head] else _first_level(self.levels[1:], rates[1:, layer, head])
                for head in range(rates.shape[2])
            ]
            for layer in range(rates.shape[1])
        ]

    def layer_collapse_points(self) -> list[float | None]:
        """Per layer: smallest level after the first at which the mean collapse rate of the layer's
        heads not collapsed at the first level reaches 0.5; None if never, if every head of the
        layer is collapsed at baseline, or if the scorer cannot respond to the probe (n/a)."""
        rates = self.metrics["collapse_rate"].copy()
        if self.insensitive:
            return [None] * rates.shape[1]
        rates[:, self.baseline_collapsed()] = np.nan
        layer_rates = nanmean(rates, axis=2)
        return [_first_level(self.levels[1:], layer_rates[1:, layer]) for layer in range(rates.shape[1])]

    def head_spread(self) -> dict[str, np.ndarray]:
        """Per level: the standard deviation across the heads not collapsed at baseline of
        ``collapse_rate`` and of ``max_weight`` (NaN with fewer than two finite heads), rounded to
        1e-9 so that heads equal up to float rounding read 0, not 1e-17."""
        keep = ~self.baseline_collapsed()
        out = {}
        for metric in ("collapse_rate", "max_weight"):
            spread = np.full(len(self.levels), np.nan)
            for i in range(len(self.levels)):
                grid = self.metrics[metric][i][keep]
                finite = grid[np.isfinite(grid)]
                if finite.size > 1:
                    spread[i] = round(float(finite.std()), 9)
            out[metric] = spread
        return out

    def most_different_level(self) -> int:
        """Index of the level where the heads not collapsed at baseline differ most: the largest
        spread (:meth:`head_spread`) of collapse rate; among levels tied on it (e.g. no head
        collapses anywhere), the largest spread of max weight; then the harsher level."""
        if not {"collapse_rate", "max_weight"} <= set(self.metrics):
            return len(self.levels) - 1
        spread = {k: np.nan_to_num(v, nan=-1.0) for k, v in self.head_spread().items()}
        return max(
            range(len(self.levels)), key=lambda i: (spread["collapse_rate"][i], spread["max_weight"][i], i)
        )

    def fading(self) -> dict[str, Any] | None:
        """Length probe: per head, the least-squares slope of normalized entropy, max weight and
        sink mass against log2 of the context length (per doubling of n). None for other probes."""
        tokens = self.extras.get("tokens")
        if self.kind is None or self.kind.name != "length" or not tokens:
            return None
        n = np.array([np.nan if t is None else t for t in tokens], dtype=float)
        out: dict[str, Any] = {"per": "doubling of the context length n", "n": json_ready(n)}
        for metric in ("entropy", "max_weight", "sink_mass"):
            values = self.metrics[metric]
            out[metric] = json_ready(_slopes(np.log2(n), values))
            layers = _slopes(np.log2(n), self.layer_mean(metric)[:, :, None])[:, 0]
            out[f"{metric}_layers"] = json_ready(layers)
        return out


# ---- helpers ---------------------------------------------------------------------------------------


def nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    """``np.nanmean`` without its "Mean of empty slice" warning: an all-NaN slice is NaN, quietly
    (a layer whose heads were all collapsed at baseline has no fresh rate; that is not an error)."""
    finite = np.isfinite(values)
    count = finite.sum(axis=axis)
    total = np.where(finite, values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _slopes(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[layer, head] least-squares slope of values [level, layer, head] against x [level], over the
    levels where both are finite (NaN with fewer than two)."""
    out = np.full(values.shape[1:], np.nan)
    for index in np.ndindex(*values.shape[1:]):
        y = values[(slice(None), *index)]
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() >= 2 and np.ptp(x[ok]) > 0:
            out[index] = np.polyfit(x[ok], y[ok], 1)[0]
    return out


def _first_level(levels: list[float], rates: np.ndarray) -> float | None:
    for level, rate in zip(levels, rates):
        if math.isfinite(rate) and rate >= COLLAPSE_SHARE:
            return level
    return None


def json_ready(value: Any) -> Any:
    """``value`` as JSON can hold it, recursively: NaN/inf -> None (JSON has no NaN), numpy arrays
    -> lists, numpy scalars -> Python numbers. Every ssacli JSON writer of results uses it."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def array_from_json(nested: Any) -> np.ndarray:
    """:func:`json_ready`'s inverse for an array: nested lists, None read as NaN, as float64."""
    return np.asarray(_nan_for_none(nested), dtype=np.float64)


def _nan_for_none(value: Any) -> Any:
    if isinstance(value, list):
        return [_nan_for_none(v) for v in value]
    return np.nan if value is None else value
