"""What the model still does under a probe, and the rules that read it: the one place where "outputs
held", "robust" and "degenerate" are decided (the findings, the verdict lines of
:mod:`ssacli.diagnosis.verdicts`, the terminal, HTML and JSON and ``ssacli check`` read these
functions and never restate the rules).

Saturation metrics alone reward broken attention: a model whose attention is uniform everywhere
never collapses, and one whose outputs fell apart under a probe can still spread its weights
evenly. So a verdict also reads the model's outputs (per level, :data:`QUALITY_METRICS`):

* ``loss``: the loss on the probe inputs at that level (next-token cross-entropy for causal LMs,
  the task error for ICL models; None where the model has neither);
* ``output_kl``: KL(reference ‖ this level) of the output distribution per token on the same
  inputs, the reference being the unshifted (neutral) level when swept, else the first
  (:func:`reference_index`); None for ICL models, whose outputs are point predictions, and for
  probes that change the inputs themselves.

The rules:

* **outputs held** at a level (:func:`outputs_held`): ``output_kl`` ≤ :data:`OUTPUT_KL_HELD`; for
  ICL models (no distribution) the task error stays within :data:`ERROR_HELD_RATIO` × the
  reference level's. None when neither is measured.
* **the change a shift made** (:func:`collapse_change`): a level's fresh collapse rate is read
  against the same model's unshifted level (:func:`reference_index`) on the same prompts, never on
  its own: what collapses before any shift is the baseline's finding, not the probe's effect. The
  change counts only beyond its prompt-to-prompt noise: the standard error of the paired per-prompt
  differences (level − unshifted, each prompt's fresh rate: ``ProbeResult.prompt_collapse``; a longer
  input is cut at the base length, so a pair is the same tokens), and a change counts when it exceeds
  :data:`NOISE_SIGMAS` standard errors. Results saved before the per-prompt rates were kept have no
  noise estimate: every change counts there, and the verdict says the noise was not measured.
* **robust up to a level** (:func:`robust_index`): every level from the first up to it raises the
  fresh collapse rate by at most :data:`ROBUST_COLLAPSE` over the unshifted level (or by no more than
  its noise) AND has outputs that held; a level where the outputs broke ends it, however little
  attention collapsed there. A level whose collapse rises more than :data:`ROBUST_COLLAPSE` beyond
  its noise, short of the collapse point's share, "partly collapses" (:func:`partly_collapsed_at`):
  46 % more of the rows collapsed is no robustness, even though the collapse point (half the rows)
  was not reached. A probe whose collapse falls below the unshifted level's beyond the noise, and
  rises nowhere, "falls with the shift" (:func:`collapse_falls`): no failure.
* **degenerate** (:func:`degenerate`): at the baseline (the unshifted first level) either the mean
  normalized entropy of every layer is ≥ :data:`NEAR_UNIFORM_ENTROPY` (attention is near-uniform
  everywhere: nothing is attended to), or the LM loss is ≥ :data:`UNIFORM_LOSS_SHARE` × log(vocab)
  (no better than guessing uniformly). A degenerate model reads "degenerate", never "robust".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .probe_kinds import PROBES
from .probe_result import COLLAPSE_SHARE, ProbeResult

OUTPUT_KL_HELD = 0.1  # nats per token: outputs moved less than this from the reference's have held
ROBUST_COLLAPSE = 0.1  # robust: collapse rises by at most this share of the fresh rows over the unshifted
# A change in collapse counts beyond this many standard errors of the paired per-prompt differences
# (one-sided; with ~8 prompts, Student's t on 7 degrees of freedom puts ~1 % of pure noise past it,
# so a sweep of several levels and probes rarely reads noise as an effect)
NOISE_SIGMAS = 3.0
ERROR_HELD_RATIO = 2.0  # ICL models: the task error at most this × the reference level's
NEAR_UNIFORM_ENTROPY = 0.98  # degenerate: every layer's mean normalized entropy at baseline is >= this
UNIFORM_LOSS_SHARE = 0.9  # degenerate: baseline LM loss >= this share of log(vocab), uniform guessing

# Where each quality value lives in a probe's extras (the run writes them under these names).
LOSS_EXTRAS = ("loss", "error")  # LM loss (causal LMs), task error (ICL models)


def reference_index(name: str, levels: Sequence[float]) -> int:
    """The level ``output_kl`` is measured against: the probe's neutral (unshifted) level when it is
    among ``levels``, else the first."""
    kind = PROBES.get(name)
    neutral = None if kind is None else kind.neutral
    return next((i for i, v in enumerate(levels) if neutral is not None and v == neutral), 0)


def level_loss(probe: ProbeResult) -> list[float | None]:
    """Per level: the loss on the probe inputs (LM loss, or the ICL task error); None where undefined."""
    for key in LOSS_EXTRAS:
        values = probe.extras.get(key)
        if values:
            return [_finite(v) for v in values]
    return [None] * len(probe.levels)


def level_output_kl(probe: ProbeResult) -> list[float | None]:
    """Per level: KL(reference level ‖ level) of the outputs, nats per token; None where not measured."""
    values = probe.extras.get("output_kl") or [None] * len(probe.levels)
    return [_finite(v) for v in values]


def quality_values(probe: ProbeResult, metric: str) -> list[float | None]:
    """The per-level values of a quality metric (:data:`QUALITY_METRICS` names them)."""
    return {"loss": level_loss, "output_kl": level_output_kl}[metric](probe)


def outputs_held(probe: ProbeResult, index: int) -> bool | None:
    """Whether the model's outputs at level ``index`` are still what they were at the reference level
    (see the module docstring); None where no output measure exists for this probe and model."""
    if probe.overflowed(index):
        return False
    kl = level_output_kl(probe)[index] if index < len(probe.levels) else None
    if kl is not None:
        return kl <= OUTPUT_KL_HELD
    if "error" in probe.extras:  # an ICL model: point predictions, no distribution
        errors = level_loss(probe)
        first, now = errors[reference_index(probe.name, probe.levels)], errors[index]
        if first is not None and now is not None:
            return now <= ERROR_HELD_RATIO * first + 1e-12
    return None


@dataclass(frozen=True)
class CollapseChange:
    """A level's fresh collapse rate against the unshifted level's (share of the rows)."""

    reference: int  # the unshifted level's index
    before: float  # the unshifted level's fresh collapse rate
    after: float  # this level's
    noise: float | None  # standard error of the change over paired prompts; None: not measured
    prompts: int  # the pairs the noise was estimated from

    @property
    def change(self) -> float:
        return self.after - self.before

    def beyond_noise(self) -> bool:
        """Whether the change is more than :data:`NOISE_SIGMAS` standard errors from 0 (unmeasured
        noise: any change)."""
        if not math.isfinite(self.change) or self.change == 0:
            return False
        return self.noise is None or abs(self.change) > NOISE_SIGMAS * self.noise

    def rises(self) -> bool:
        """A rise that counts: more than :data:`ROBUST_COLLAPSE` and beyond the noise."""
        return self.change > ROBUST_COLLAPSE and self.beyond_noise()

    def noise_text(self) -> str:
        if self.noise is None:
            return "noise not measured"
        return f"noise ±{100 * self.noise:.1f} over {self.prompts} prompts"


def collapse_change(probe: ProbeResult, index: int) -> CollapseChange:
    """Level ``index``'s fresh collapse rate against the unshifted level's, with the standard error of
    the change from the paired per-prompt rates (see the module docstring)."""
    ref = reference_index(probe.name, probe.levels)
    fresh = probe.fresh_collapse_rate()
    noise, pairs = None, 0
    prompts = probe.prompt_collapse
    if prompts is not None and index < len(prompts):
        diff = prompts[index] - prompts[ref]
        diff = diff[np.isfinite(diff)]
        pairs = int(diff.size)
        if pairs >= 2:
            noise = float(diff.std(ddof=1) / math.sqrt(pairs))
    return CollapseChange(ref, float(fresh[ref]), float(fresh[index]), noise, pairs)


def robust_index(probe: ProbeResult) -> int | None:
    """The last level index up to which the probe leaves the model robust: collapse that rises by
    at most :data:`ROBUST_COLLAPSE` over the unshifted level (or within its noise) and outputs that
    held at every level so far; None if the first level already fails or nothing tells (outputs
    unmeasured)."""
    fresh = probe.fresh_collapse_rate()
    last = None
    for index in range(len(probe.levels)):
        held = outputs_held(probe, index)
        if not math.isfinite(fresh[index]) or collapse_change(probe, index).rises() or held is not True:
            break
        last = index
    return last


def partly_collapsed_at(probe: ProbeResult) -> int | None:
    """The first level index whose fresh collapse rate rises more than :data:`ROBUST_COLLAPSE` over
    the unshifted level, beyond its noise, while staying below the collapse share (None if there is
    none, or if some level reaches the collapse point)."""
    rates = [float(r) for r in probe.fresh_collapse_rate()]
    if any(math.isfinite(r) and r >= COLLAPSE_SHARE for r in rates):
        return None
    return next((i for i in range(len(rates)) if collapse_change(probe, i).rises()), None)


def collapse_falls(probe: ProbeResult) -> CollapseChange | None:
    """The change at the top measured level where the probe's collapse falls with the shift: below
    the unshifted level's beyond the noise there, and beyond the noise above it at no level; None
    otherwise."""
    measured = [i for i, r in enumerate(probe.fresh_collapse_rate()) if math.isfinite(r)]
    if len(measured) < 2:
        return None
    changes = [collapse_change(probe, i) for i in measured]
    if any(c.change > 0 and c.beyond_noise() for c in changes):
        return None
    top = changes[-1]
    return top if top.change < 0 and top.beyond_noise() else None


def outputs_broke_at(probe: ProbeResult) -> int | None:
    """The first level index whose outputs did not hold (None if they held wherever measured)."""
    for index in range(len(probe.levels)):
        if outputs_held(probe, index) is False and not probe.overflowed(index):
            return index
    return None


def degenerate(
    probes: Sequence[ProbeResult], vocab_size: int | None = None, base: ProbeResult | None = None
) -> dict[str, Any] | None:
    """Why the model is degenerate at baseline (see the module docstring), or None. ``base``: the
    probe whose first level is the unshifted model (default: the first measured probe)."""
    if base is None:
        base = next((p for p in probes if not p.skipped and not p.overflowed(0)), None)
    if base is None:
        return None
    if "entropy" in base.metrics:
        layers = base.layer_mean("entropy")[0]
        finite = layers[np.isfinite(layers)]
        if finite.size == len(layers) and finite.size and float(finite.min()) >= NEAR_UNIFORM_ENTROPY:
            return {
                "rule": "near_uniform", "value": float(finite.min()), "bound": NEAR_UNIFORM_ENTROPY,
                "text": f"attention is near-uniform everywhere at baseline (every layer's mean normalized "
                        f"entropy ≥ {float(finite.min()):.3f} ≥ {NEAR_UNIFORM_ENTROPY:g}): nothing is "
                        "attended to, so no collapse here means nothing",
            }  # fmt: skip
    loss = level_loss(base)[0] if "loss" in base.extras else None
    if loss is not None and vocab_size and vocab_size > 1:
        uniform = math.log(vocab_size)
        if loss >= UNIFORM_LOSS_SHARE * uniform:
            return {
                "rule": "uniform_loss", "value": loss, "bound": UNIFORM_LOSS_SHARE * uniform,
                "uniform_loss": uniform,
                "text": f"the model's baseline loss {loss:.2f} is no better than guessing uniformly "
                        f"(log vocabulary = {uniform:.2f}; degenerate from {UNIFORM_LOSS_SHARE:g}× that)",
            }  # fmt: skip
    return None


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
