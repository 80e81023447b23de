"""Is the SSA conversion worth it against softmax fine-tuned with the same budget? The decision of
``ssacli report BEFORE AFTER CONTROL``, from the user's own run: one line per question (quality
against the control in and out of domain and at a longer context, robustness under each probe that
reached attention), each with a 95 % interval over this run's own windows or prompts, then the rule
of docs/results/convert-tradeoff.md applied to these numbers (:func:`apply_rule`, the rule's one
owner: the study's table maker calls it too).

Intervals pair AFTER and CONTROL unit by unit, as the study pairs seeds:

* quality: each held-out window's mean NLL per token, AFTER − CONTROL (the same windows of the same
  text for both: :func:`~ssacli.quality.measures.language_model_loss` keeps them); the ratio of
  perplexities is exp(mean difference), its interval the percentile bootstrap of the mean
  (:func:`ssacli.stats.bootstrap_ci`) exponentiated;
* robustness: each probe prompt's output KL (unshifted ‖ shifted) at the probe's level, AFTER −
  CONTROL (one seed, so the same prompts: ``ProbeResult.per_input``), as a change relative to
  CONTROL's mean, its interval the bootstrap interval of the mean difference over that mean.

The windows are one text and the prompts a handful of sequences: the intervals say how sure this
run's comparison is on these inputs, not on other texts or other seeds of the fine-tuning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..stats import LEVEL, bootstrap_ci

MAX_RATIO = 1.05  # rule (b): the upper 95 % bound of the held-out perplexity ratio to the control
MIN_KL_DROP = 0.25  # rule (a): output KL at least 25 % lower on average, its interval below zero
RULE_PROBE, RULE_LEVEL = "key-scale", 8.0  # rule (a) reads the output KL under key-scale σ = 8

RECOMMENDED = "recommended"
UNDECIDED = "undecided"


def apply_rule(quality: dict[str, Any] | None, robustness: dict[str, Any] | None) -> dict[str, Any]:
    """The decision rule of docs/results/convert-tradeoff.md, stated there before the study's runs:

        "an n is *recommended* when, against the control on the same seeds, (a) its output KL
        under key-scale σ = 8 is lower with the 95 % interval of the difference below zero **and**
        at least 25 % lower on average, and (b) the upper end of the 95 % interval of its held-out
        perplexity ratio to the control is at most 1.05 (at most 5 % worse)."

    ``quality``: the held-out perplexity ratio AFTER / CONTROL, ``{"value", "low", "high"}``;
    ``robustness``: the relative change of the output KL under key-scale σ = 8, ``{"value",
    "low", "high"}`` (−0.31 = 31 % lower). Either None (not measured), or an interval None (too
    few units), reads "undecided".

    Returns ``{"verdict", "recommended", "why"}``: ``recommended`` True or False where the rule
    decides, None where the intervals cannot: (b)'s interval holds 1.05, or (a)'s mean clears the
    25 % bar while its interval holds zero. A condition that fails beyond its interval (a cost
    surely over 5 %; a mean gain under the bar, which the rule reads on the mean) decides "no"
    whatever the other. The verdict words are the study's: "recommended", "more robust, too
    costly", "a gain under the 25 % bar", "no robustness gain", or "undecided"."""
    bar = percent(MIN_KL_DROP, sign=False)
    if not _has_interval(quality) or not _has_interval(robustness):
        missing = [name for name, x in (("held-out quality", quality), ("output KL", robustness))
                   if not _has_interval(x)]  # fmt: skip
        return {"verdict": UNDECIDED, "recommended": None,
                "why": f"no interval for {' and '.join(missing)}"}  # fmt: skip
    # (b): met, missed beyond the interval, or the interval holds the bound
    cheap = True if quality["high"] <= MAX_RATIO else (False if quality["low"] > MAX_RATIO else None)
    lower = robustness["high"] < 0  # the interval of the difference below zero
    big = robustness["value"] <= -MIN_KL_DROP
    robust = True if lower and big else (None if big else False)  # a big mean, zero inside: undecided
    if robust and cheap:
        verdict, recommended = RECOMMENDED, True
    elif robust is False or cheap is False:
        recommended = False
        if robust and cheap is False:
            verdict = "more robust, too costly"
        elif robust is False and lower:
            verdict = f"a gain under the {bar} bar"
        elif robust is False:
            verdict = "no robustness gain"
        else:  # robustness undecided, but the cost alone decides
            verdict = "too costly"
    else:
        verdict, recommended = UNDECIDED, None
    return {"verdict": verdict, "recommended": recommended, "why": _why(quality, robustness, cheap, robust)}


def _why(quality: dict[str, Any], robustness: dict[str, Any], cheap: bool | None, robust: bool | None) -> str:
    """Which condition decided, in words a user can check against the lines above."""
    limit, bar = percent(MAX_RATIO - 1, sign=False), percent(MIN_KL_DROP, sign=False)
    cost = {True: f"cost ≤ {limit} (upper bound ×{quality['high']:.3f})",
            False: f"cost > {limit} (lower bound ×{quality['low']:.3f})",
            None: f"the cost interval holds ×{MAX_RATIO:g}"}[cheap]  # fmt: skip
    change = f"output KL {percent(robustness['value'])}"
    gain = {True: f"{change}, interval below 0",
            False: change + (f", short of −{bar}" if robustness["high"] < 0 else ""),
            None: f"{change}, interval holds 0"}[robust]  # fmt: skip
    return f"{gain}; {cost}"


def percent(x: float, *, sign: bool = True) -> str:
    """0.31 → "+31 %" (the project writes a space before %)."""
    return f"{100 * x:+.0f} %" if sign else f"{100 * x:.0f} %"


def _has_interval(x: dict[str, Any] | None) -> bool:
    return x is not None and x.get("low") is not None and x.get("high") is not None


def ratio_interval(
    control: dict[str, Any], after: dict[str, Any], *, level: float = LEVEL
) -> dict[str, Any] | None:
    """AFTER's perplexity over CONTROL's on the same windows: exp of the mean per-window difference
    of mean NLL per token, with its bootstrap interval exponentiated. None when the two were not
    measured on the same windows (older measurements keep no windows)."""
    a, b = _window_means(control), _window_means(after)
    if a is None or b is None or control.get("window_tokens") != after.get("window_tokens"):
        return None
    differences = [y - x for x, y in zip(a, b)]
    mean = math.fsum(differences) / len(differences)
    interval = bootstrap_ci(differences, level=level)
    low, high = (None, None) if interval is None else (math.exp(interval[0]), math.exp(interval[1]))
    return {"value": math.exp(mean), "low": low, "high": high, "units": len(differences), "unit": "windows"}


def _window_means(measured: dict[str, Any]) -> list[float] | None:
    nll, tokens = measured.get("window_nll"), measured.get("window_tokens")
    if not nll or not tokens:
        return None
    return [s / t for s, t in zip(nll, tokens) if t]


def change_interval(
    control: Sequence[float], after: Sequence[float], *, level: float = LEVEL
) -> dict[str, Any] | None:
    """AFTER's change relative to CONTROL's mean, paired prompt by prompt: mean(after − control) ÷
    mean(control), with its bootstrap interval over the same scale (the study's output-KL change)."""
    if not control or len(control) != len(after):
        return None
    base = math.fsum(control) / len(control)
    if not base > 0:
        return None
    differences = [b - a for a, b in zip(control, after)]
    interval = bootstrap_ci(differences, level=level)
    low, high = (None, None) if interval is None else (interval[0] / base, interval[1] / base)
    return {"value": math.fsum(differences) / len(differences) / base, "low": low, "high": high,
            "units": len(differences), "unit": "prompts", "control": base,
            "after": math.fsum(after) / len(after)}  # fmt: skip


__all__ = [
    "MAX_RATIO",
    "MIN_KL_DROP",
    "RECOMMENDED",
    "RULE_LEVEL",
    "RULE_PROBE",
    "UNDECIDED",
    "apply_rule",
    "percent",
    "change_interval",
    "ratio_interval",
]
