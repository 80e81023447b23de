"""Where attention lands, per head, as a result reports it: :class:`PositionProfiles` (the attention
received by key position, the distance histogram, the secondary sinks and the head classes) and the
bins a run measures them with (:func:`run_bins`).

The numbers come from the row statistics' position terms (ssacli.kernels.positions) through
:func:`ssacli.diagnosis.row_metrics.row_sums` and :meth:`~ssacli.diagnosis.row_metrics.HeadStats.profiles`
(:func:`~ssacli.diagnosis.row_metrics.position_profiles` builds a level's): this module keeps them
for one probe level (the unshifted model: the baseline probe's first
level), names the bins and classifies heads. The scalar metrics (sink_share, sink_boost,
local_share, attention_distance) are per level in every probe's arrays, like every metric.

Head classes (the first that applies; thresholds in ssacli.defaults, stated in every result):

* ``sink``: sink_share >= CLASS_SINK_SHARE (StreamingLLM's attention sinks: mass parked on the first
  tokens whatever their content). Not the findings' "first-token heads" (``sink_rate``, Gu et al.:
  mean weight on token 0 > SINK_EPS, whatever else the head does): this is what the head mostly does,
  so it counts fewer heads (ssacli.diagnosis.findings says why both are kept, under two names);
* ``local``: local_share >= CLASS_LOCAL_SHARE (recency / previous-token heads: TransformerLens's
  head detector's previous- and current-token patterns are the extreme);
* ``focused``: normalized entropy <= CLASS_FOCUSED_ENTROPY (sharp attention on a few keys that are
  neither the first k nor nearby: what retrieval heads look like, Wu et al. 2024; their retrieval
  score needs a copy-paste task, which this does not run, so this is retrieval-*like* only);
* ``distributed``: the rest (attention spread over many keys);
* None where a head counted no row (not measured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import defaults
from ..kernels.positions import PositionBins

HEAD_CLASSES = ("sink", "local", "focused", "distributed")
CLASS_RULES = {
    "sink": f"sink_share >= {defaults.CLASS_SINK_SHARE}",
    "local": f"local_share >= {defaults.CLASS_LOCAL_SHARE} (distance < {defaults.LOCAL_DISTANCE})",
    "focused": f"entropy <= {defaults.CLASS_FOCUSED_ENTROPY} (retrieval-like)",
    "distributed": "otherwise",
}


def run_bins(length: int, sink_k: int = defaults.SINK_K) -> PositionBins:
    """The bins of a run of ``length`` tokens: the first ``sink_k``, then POSITION_BINS over the rest."""
    width = max(1, math.ceil(max(1, length - sink_k) / defaults.POSITION_BINS))
    return PositionBins(sink_k=sink_k, bin_width=width)


def head_class(sink_share: float, local_share: float, entropy: float) -> str | None:
    """The class of one head from its means (module docstring); None where they are not numbers."""
    if not all(math.isfinite(v) for v in (sink_share, local_share, entropy)):
        return None
    if sink_share >= defaults.CLASS_SINK_SHARE:
        return "sink"
    if local_share >= defaults.CLASS_LOCAL_SHARE:
        return "local"
    if entropy <= defaults.CLASS_FOCUSED_ENTROPY:
        return "focused"
    return "distributed"


@dataclass
class PositionProfiles:
    """Per head at one probe level: arrays [layer, head, bin] (NaN where a head counted no row or a
    layer has fewer heads), the bins' edges and each head's class."""

    probe: str
    level: float
    sink_k: int
    bin_width: int
    key_edges: list[int]  # key bin b holds keys [key_edges[b], key_edges[b + 1])
    distance_edges: list[int]  # distance bin b holds |i - j| in [distance_edges[b], distance_edges[b + 1])
    received: np.ndarray  # mean share of a row's weight on each key bin
    received_boost: np.ndarray  # that over the share uniform weights would give the bin (1 = uniform)
    distance: np.ndarray  # mean share of a row's weight on each distance bin
    classes: list[list[str | None]]  # [layer][head]

    def secondary_sinks(self, count: int = defaults.SECONDARY_SINKS) -> list[list[list[dict[str, Any]]]]:
        """Per layer and head, the ``count`` key bins past the first k that receive the largest mean
        share (the position resolution is the bin width), largest first: keys [start, stop), share and
        boost over uniform. Empty for a head not measured."""
        out = []
        for layer in range(self.received.shape[0]):
            row = []
            for head in range(self.received.shape[1]):
                shares = self.received[layer, head, 1:]
                order = [int(i) for i in np.argsort(-np.nan_to_num(shares, nan=-1.0), kind="stable")]
                picked = [i for i in order if math.isfinite(shares[i]) and shares[i] > 0][:count]
                row.append([
                    {"keys": [self.key_edges[i + 1], self.key_edges[i + 2]], "share": float(shares[i]),
                     "boost": _number(self.received_boost[layer, head, i + 1])}
                    for i in picked
                ])  # fmt: skip
            out.append(row)
        return out

    def class_counts(self, layer: int | None = None) -> dict[str, int]:
        """How many heads of each class (in ``layer``, or the whole model)."""
        rows = self.classes if layer is None else [self.classes[layer]]
        return {name: sum(row.count(name) for row in rows) for name in HEAD_CLASSES}

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe, "level": self.level, "sink_k": self.sink_k, "bin_width": self.bin_width,
            "key_edges": self.key_edges, "distance_edges": self.distance_edges,
            "received": _nested(self.received), "received_boost": _nested(self.received_boost),
            "distance": _nested(self.distance), "classes": self.classes,
            "class_rules": CLASS_RULES, "class_counts": self.class_counts(),
            "secondary_sinks": self.secondary_sinks(),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PositionProfiles:
        names = ("received", "received_boost", "distance")
        arrays = {k: np.asarray(_nan_in(data[k]), dtype=np.float64) for k in names}
        return cls(
            data["probe"], float(data["level"]), int(data["sink_k"]), int(data["bin_width"]),
            [int(e) for e in data["key_edges"]], [int(e) for e in data["distance_edges"]],
            arrays["received"], arrays["received_boost"], arrays["distance"],
            [list(row) for row in data["classes"]],
        )  # fmt: skip


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _nested(values: np.ndarray) -> list:
    return [[[_number(v) for v in head] for head in layer] for layer in values]


def _nan_in(value: Any) -> Any:
    if isinstance(value, list):
        return [_nan_in(v) for v in value]
    return math.nan if value is None else value


__all__ = ["CLASS_RULES", "HEAD_CLASSES", "PositionProfiles", "head_class", "run_bins"]
