"""The conversion trade-off rule (docs/results/convert-tradeoff.md), its one owner
:func:`ssacli.quality.tradeoff.apply_rule`, on hand-computed cases, and the paired per-window and
per-prompt intervals it reads (issue 51, item 5)."""

from __future__ import annotations

import math

import pytest

from ssacli.quality.tradeoff import apply_rule, change_interval, ratio_interval


def interval(value, low, high):
    return {"value": value, "low": low, "high": high}


# The study's n = 4 row: ×1.015 [1.015, 1.016] held-out, −31 % [−32, −30] output KL.
CHEAP = interval(1.015, 1.015, 1.016)
ROBUST = interval(-0.31, -0.32, -0.30)


def test_ssa_better_beyond_its_intervals_is_recommended():
    assert apply_rule(CHEAP, ROBUST) == {
        "verdict": "recommended",
        "recommended": True,
        "why": "output KL -31 %, interval below 0; cost ≤ 5 % (upper bound ×1.016)",
    }


@pytest.mark.parametrize(
    "quality, robustness, verdict",
    [
        (interval(1.08, 1.06, 1.10), ROBUST, "more robust, too costly"),  # cost surely over 5 %
        (CHEAP, interval(-0.09, -0.10, -0.09), "a gain under the 25 % bar"),  # the study's n = 8
        (CHEAP, interval(0.04, 0.01, 0.07), "no robustness gain"),  # SSA worse under the probe
        (CHEAP, interval(-0.10, -0.30, 0.10), "no robustness gain"),  # the mean short of the bar
        (interval(1.08, 1.06, 1.10), interval(-0.40, -0.80, 0.05), "too costly"),  # the cost decides
    ],
)
def test_ssa_worse_on_a_condition_beyond_its_interval_is_not_recommended(quality, robustness, verdict):
    decided = apply_rule(quality, robustness)
    assert (decided["verdict"], decided["recommended"]) == (verdict, False)


@pytest.mark.parametrize(
    "quality, robustness, why",
    [
        (interval(1.04, 1.03, 1.07), ROBUST, "the cost interval holds ×1.05"),  # 1.05 inside [1.03, 1.07]
        (CHEAP, interval(-0.40, -0.80, 0.05), "output KL -40 %, interval holds 0"),  # big mean, 0 inside
        (CHEAP, interval(-0.31, None, None), "no interval for output KL"),  # one prompt: no interval
        (None, ROBUST, "no interval for held-out quality"),
    ],
)
def test_where_the_intervals_cannot_decide_it_says_so(quality, robustness, why):
    decided = apply_rule(quality, robustness)
    assert (decided["verdict"], decided["recommended"]) == ("undecided", None)
    assert why in decided["why"]


def test_the_perplexity_ratio_pairs_the_same_windows():
    """Two windows of 4 and 2 tokens: mean NLL per token 1.0, 2.0 (CONTROL) and 1.5, 2.1 (AFTER)."""
    control = {"window_nll": [4.0, 4.0], "window_tokens": [4, 2]}
    after = {"window_nll": [6.0, 4.2], "window_tokens": [4, 2]}
    found = ratio_interval(control, after)
    assert found["value"] == pytest.approx(math.exp((0.5 + 0.1) / 2), rel=1e-12)
    # two differences: every resample's mean lies between them, both ends drawn > 2.5 % of the time
    assert (found["low"], found["high"]) == pytest.approx((math.exp(0.1), math.exp(0.5)), rel=1e-12)
    assert (found["units"], found["unit"]) == (2, "windows")
    assert ratio_interval(control, {**after, "window_tokens": [3, 3]}) is None  # not the same windows
    assert ratio_interval(control, {"nll": 1.0}) is None  # a measurement without windows


def test_the_output_kl_change_is_relative_to_the_controls_mean():
    control, after = [0.10, 0.20, 0.30], [0.05, 0.10, 0.15]  # half the control's on every prompt
    found = change_interval(control, after)
    assert found["value"] == pytest.approx(-0.5, rel=1e-12)
    assert found["low"] == pytest.approx(-0.15 / 0.2, rel=1e-12)  # the most negative difference
    assert found["high"] == pytest.approx(-0.05 / 0.2, rel=1e-12)
    assert change_interval(control, after[:2]) is None  # prompts that do not pair
