""":data:`METRICS`, the table of what each saturation metric is (:class:`MetricSpec`: description,
direction, bounds, labels), beside the per-layer and per-level tables, and :func:`sink_indicator`.
Torch-free, so that a metric named on the command line (``--heatmap``, a ``check`` requirement) is
checked before the model stack loads.

Every path of diagnose reduces an attention call to per-row statistics
(:class:`ssacli.kernels.row_stats.RowStatistics`), and :func:`ssacli.diagnosis.row_metrics.row_sums`
derives per-head sums of every metric from them (a few numbers per head; which rows count and each
formula are said there), so diagnose never keeps a weight map beyond the attention call that made it;
:class:`~ssacli.diagnosis.row_metrics.HeadStats` adds those sums up and divides at the end,
:class:`~ssacli.diagnosis.recorder.LayerStats` does the same for the per-layer metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..defaults import LOCAL_DISTANCE, SINK_EPS, SINK_K

if TYPE_CHECKING:  # numpy itself only where a sink rate is computed: the refusals that read this
    import numpy as np  # table (a metric's name in --tau or a gate) start ~90 ms sooner


@dataclass(frozen=True)
class MetricSpec:
    """Everything said about one metric outside its formula (:func:`~ssacli.diagnosis.row_metrics.row_sums`
    derives it).

    Every reader imports it from here: the JSON schema (``description``), the terminal and HTML
    reports (``header``, ``short``, ``key``, ``compared``, ``bounded``, the direction colors),
    ``ssacli check`` (``direction``, to tell a regression) and :class:`HeadStats` (``divisor``)."""

    name: str
    description: str  # one line, written into every diagnose JSON under "metrics"
    higher_is_saturated: bool | None  # True: higher = more saturated; False: lower; None: no direction
    bounded: bool  # lies in [0, 1], so colors use a fixed [0, 1] scale that compares across models
    header: str  # column header in the per-probe tables (eight fit in 80 characters)
    short: str  # label in the comparison tables' two-line headers (four metrics × A, B, Δ fit 120)
    key: bool = False  # always a column of the per-probe tables (others only where they say something)
    compared: bool = False  # a column of the comparison tables and the A-vs-B figures
    # The per-head count its per-head sum is divided by (HeadStats.means): the rows counted, or the
    # rows it is defined on; None for a metric derived from other metrics' means, not summed.
    divisor: str | None = "rows"

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
                   True, True, "capture", "capt", compared=True, divisor="capture_rows"),
        MetricSpec("row_mass", "sum of the row's weights (1 for normalized scorers)", None, False, "row mass",
                   "row mass"),
        MetricSpec("learned_sink",
                   "weight on the model's learned sink key (gpt-oss), 1 - row mass under softmax; NaN (n/a) "
                   "for models without learned sinks", True, True, "learned sink", "lsink",
                   divisor="sink_rows"),
        MetricSpec("sink_rate",
                   f"1 if the head's mean weight on the first token exceeds {SINK_EPS} (Gu et al. 2024), "
                   "else 0: the layer or model mean is the share of first-token heads (not the head "
                   "class sink)", True, True, "first-tok", "sinkr", compared=True, divisor=None),
        # where the mass lands (the position terms; NaN where a run did not measure them)
        MetricSpec("sink_share", f"weight on the first k keys (k = settings.sink_k, default {SINK_K}; "
                   "StreamingLLM's initial tokens)", True, True, "sink@k", "sink@k"),
        MetricSpec("sink_boost", "sink_share over the share uniform weights would give the first k keys "
                   "(1 = no sink; head mean of each, then their ratio)", True, False, "sink boost", "boost",
                   divisor=None),
        MetricSpec("local_share", f"weight on keys within {LOCAL_DISTANCE} tokens of the query "
                   f"(distance < {LOCAL_DISTANCE}, the query's own key included)", None, True, "local",
                   "local"),
        MetricSpec("attention_distance", "mean distance |i - j| in tokens between a query and the keys it "
                   "weighs", None, False, "distance", "dist"),
    )
}  # fmt: skip
POSITION_METRICS = ("sink_share", "sink_boost", "local_share", "attention_distance")
# The sums of the position metrics that are vectors per head (ssacli.diagnosis.positions reads them)
POSITION_PROFILES = ("received", "received_uniform", "distance_profile")

# Per layer (not per head): the logits' scale (where a probe acts) and the hidden states (massive
# activations, Sun et al. 2024; kurtosis). Arrays [level, layer]; read by the same reports.
LAYER_METRICS: dict[str, MetricSpec] = {
    m.name: m
    for m in (
        MetricSpec("logit_rms", "RMS of the attention logits the scorer sees (visible keys, counted rows)",
                   None, False, "logit rms", "lrms"),
        MetricSpec("target_logit_rms", "RMS of the logits on the probe's target key (rows that see it)",
                   None, False, "target rms", "trms"),
        MetricSpec("target_logit_mean", "mean of the logits on the probe's target key (rows that see it): "
                   "an additive probe's (dominant-key) reach is its shift", None, False, "target mean",
                   "tmean"),
        MetricSpec("massive_top1", "largest |hidden state| of the layer's output (real tokens)", True, False,
                   "top |h|", "top1"),
        MetricSpec("massive_top2", "second largest |hidden state|", True, False, "2nd |h|", "top2"),
        MetricSpec("massive_top3", "third largest |hidden state|", True, False, "3rd |h|", "top3"),
        MetricSpec("hidden_median", "median |hidden state| (mean of the per-batch lower medians)", None,
                   False, "median |h|", "med"),
        MetricSpec("massive_ratio", "massive_top1 / hidden_median (Sun et al. 2024: massive when > ~1000)",
                   True, False, "top/median", "ratio"),
        MetricSpec("kurtosis", "kurtosis E[(h-mu)^4]/var^2 of the layer's output values (Gaussian: 3)",
                   True, False, "kurtosis", "kurt"),
    )
}  # fmt: skip

# Per level (one number per probe level, not per head): what the model still does under the probe.
# Read from a probe's extras by ssacli.diagnosis.outputs (which owns the rules that use them);
# ``ssacli check`` addresses them as loss@PROBE:LEVEL and output_kl@PROBE:LEVEL.
QUALITY_METRICS: dict[str, MetricSpec] = {
    m.name: m
    for m in (
        MetricSpec("loss", "the model's loss on the probe inputs at this level: next-token cross-entropy "
                   "(nats/token) for causal LMs, the task error for ICL models (MSE for linear tasks, "
                   "error rate for classification); null where the model has neither", True, False,
                   "loss", "loss"),
        MetricSpec("output_kl", "KL(unshifted || this level) of the output distribution, nats per token, "
                   "on the same inputs (the unshifted level: the probe's neutral one when swept, else its "
                   "first; 0 there); null for ICL models (point predictions) and probes that change the "
                   "inputs", True, False, "out KL", "kl"),
    )
}  # fmt: skip


def metric_spec(name: str) -> MetricSpec:
    """The spec of any metric: per head (METRICS), per layer (LAYER_METRICS) or per level."""
    for table in (METRICS, LAYER_METRICS, QUALITY_METRICS):
        if name in table:
            return table[name]
    raise KeyError(name)


def sink_indicator(sink_mass: np.ndarray, eps: float = SINK_EPS) -> np.ndarray:
    """Gu et al. (2024): 1 where a head's mean weight on the first token exceeds ``eps``, 0 where it
    does not, NaN where it is undefined. Its mean over heads is the sink rate."""
    import numpy as np

    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(sink_mass), (sink_mass > eps).astype(float), math.nan)
