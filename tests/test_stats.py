"""ssacli.stats against values computed by hand from the definitions."""

from __future__ import annotations

import itertools
import math

import pytest

from ssacli.stats import bootstrap_ci, paired_differences, paired_summary, sign_test, verdict


def test_sign_test_by_hand():
    # 8 of 8 positive: 2 · (1/2)^8
    assert sign_test([0.1] * 8) == pytest.approx(2 / 256)
    # 7 against 1: 2 · (C(8,0) + C(8,1)) / 2^8 = 2 · 9 / 256
    assert sign_test([1, 2, 3, 4, 5, 6, 7, -1]) == pytest.approx(18 / 256)
    # 6 against 2: 2 · (1 + 8 + 28) / 256
    assert sign_test([-1, -2, -3, -4, -5, -6, 1, 2]) == pytest.approx(74 / 256)
    # an even split caps at 1
    assert sign_test([1, -1, 2, -2]) == 1.0
    # ties are dropped: three positives and two zeros is the n = 3 test, 2 · 1/8
    assert sign_test([1, 1, 1, 0, 0]) == pytest.approx(0.25)
    assert sign_test([0, 0]) is None and sign_test([]) is None


def test_sign_test_matches_the_binomial_sum_written_out():
    for n in range(1, 11):
        for positive in range(n + 1):
            k = min(positive, n - positive)
            expected = min(1.0, 2 * sum(math.factorial(n) / (math.factorial(i) * math.factorial(n - i))
                                        for i in range(k + 1)) / 2**n)  # fmt: skip
            assert sign_test([1] * positive + [-1] * (n - positive)) == pytest.approx(expected)


def test_bootstrap_of_a_constant_difference_is_a_point():
    assert bootstrap_ci([0.25] * 8) == (0.25, 0.25)
    assert bootstrap_ci([0.0] * 3, resamples=50) == (0.0, 0.0)
    assert bootstrap_ci([]) is None


def test_bootstrap_interval_on_two_values_by_hand():
    # resampled means of {0, 1}: 0 (1/4), 0.5 (1/2), 1 (1/4); the 2.5 % and 97.5 % quantiles fall
    # inside the atoms at 0 and 1
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)


def test_bootstrap_interval_on_three_values_by_hand():
    # {0, 0, 3}: the mean of a resample is the number j of 3s drawn, j ~ Binomial(3, 1/3):
    # P(j = 0) = 8/27 > 2.5 %, P(j = 3) = 1/27 > 2.5 %, so the interval is [0, 3]
    assert bootstrap_ci([0.0, 0.0, 3.0]) == (0.0, 3.0)


def test_bootstrap_quantiles_match_full_enumeration():
    """Every one of the n^n resamples of 4 values, equally likely: the exact bootstrap distribution.
    At a 50 % level both ends fall strictly inside atoms of it, so 10,000 draws find the same ends."""
    values = [0.0, 1.0, 2.0, 10.0]
    means = sorted(sum(c) / 4 for c in itertools.product(values, repeat=4))
    low, high = bootstrap_ci(values, level=0.5, resamples=20_000)

    def cdf(x):
        return sum(m <= x for m in means) / len(means)

    # the exact 25 % and 75 % quantiles: the smallest atoms whose CDF reaches them
    exact_low = next(m for m in means if cdf(m) >= 0.25)
    exact_high = next(m for m in means if cdf(m) >= 0.75)
    assert low == pytest.approx(exact_low, abs=0.26)  # atoms are 0.25 apart
    assert high == pytest.approx(exact_high, abs=0.26)


def test_bootstrap_is_seeded():
    values = [0.3, -0.1, 0.8, 0.05, 0.4, -0.2, 0.6, 0.1]
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    low, high = bootstrap_ci(values)
    assert low < sum(values) / len(values) < high


def test_paired_summary_pairs_by_seed():
    a = {0: 0.10, 1: 0.20, 2: 0.30, 5: 1.0}
    b = {2: 0.10, 1: 0.25, 0: 0.10, 7: 9.0}  # seeds 5 and 7 have no partner
    assert paired_differences(a, b) == pytest.approx({0: 0.0, 1: 0.05, 2: -0.2})
    summary = paired_summary(a, b)
    assert summary["seeds"] == [0, 1, 2]
    assert summary["a"] == [0.10, 0.20, 0.30] and summary["b"] == [0.10, 0.25, 0.10]
    assert summary["mean_difference"] == pytest.approx(-0.05)
    assert (summary["b_higher"], summary["b_lower"], summary["ties"]) == (1, 1, 1)
    assert summary["sign_test_p"] == 1.0
    assert summary["ci_low"] <= summary["mean_difference"] <= summary["ci_high"]


def test_verdict_follows_the_interval():
    def v(low, high, **kwargs):
        return verdict({"ci_low": low, "ci_high": high, "differences": [0.0] * 8}, **kwargs)

    assert v(0.01, 0.2) == "worse"
    assert v(0.01, 0.2, lower_is_better=False) == "better"
    assert v(-0.2, -0.01) == "better"
    assert v(-0.2, 0.1) == "inconclusive"
    assert v(0.0, 0.0) == "equal"
    assert verdict({"ci_low": None, "ci_high": None}) == "n/a"
    assert verdict({"ci_low": 0.1, "ci_high": 0.1, "differences": [0.1, 0.1]}) == "too few seeds"
