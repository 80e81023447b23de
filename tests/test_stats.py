"""ssacli.stats against values computed by hand from the definitions (and scipy where installed)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ssacli import stats
from ssacli.stats import (
    bootstrap_ci,
    holm,
    paired_differences,
    paired_summary,
    paired_t_test,
    sign_flip_test,
    sign_test,
    student_t_two_sided,
    verdict,
)


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
    assert bootstrap_ci([0.3]) is None  # one pair has no spread to resample: no interval


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


def test_verdict_needs_the_interval_and_the_test():
    def v(low, high, p, **kwargs):
        return verdict({"ci_low": low, "ci_high": high, "differences": [1.0] * 8}, p=p, **kwargs)

    assert v(0.01, 0.2, 0.01) == "worse"
    assert v(0.01, 0.2, 0.01, lower_is_better=False) == "better"
    assert v(-0.2, -0.01, 0.05) == "better"  # p <= alpha
    assert v(-0.2, -0.01, 0.06) == "inconclusive"  # the interval excludes 0, the test does not agree
    assert v(-0.2, 0.1, 0.001) == "inconclusive"  # the test alone does not decide either
    assert v(-0.2, -0.01, 0.06, alpha=0.1) == "better"
    assert verdict({"ci_low": 0.0, "ci_high": 0.0, "differences": [0.0] * 8}) == "equal"
    assert verdict({"ci_low": None, "ci_high": None}) == "n/a"
    assert verdict({"ci_low": 0.1, "ci_high": 0.1, "differences": [0.1, 0.1]}) == "too few seeds"


def test_verdict_of_three_agreeing_seeds_is_inconclusive():
    """With 3 seeds the bootstrap interval is [min, max]: three differences of one sign exclude 0,
    but no sign-flip test of 3 values can go below 2/8 = 0.25."""
    summary = paired_summary({0: 10.0, 1: 10.0, 2: 10.0}, {0: 9.14, 1: 6.11, 2: 9.66})
    assert (summary["ci_low"], summary["ci_high"]) == pytest.approx((-3.89, -0.34))
    assert summary["permutation_p"] == pytest.approx(0.25)
    assert verdict(summary) == "inconclusive"
    # the same summary from a results.json written before the test existed: computed from differences
    legacy = {k: v for k, v in summary.items() if k != "permutation_p"}
    assert verdict(legacy) == "inconclusive"


def test_verdict_of_eight_agreeing_seeds_is_decided():
    a = {s: 1.0 for s in range(8)}
    b = {s: 1.0 - 0.1 * (s + 1) for s in range(8)}
    summary = paired_summary(a, b)
    assert summary["permutation_p"] == pytest.approx(2 / 256)
    assert verdict(summary) == "better"
    assert verdict(summary, p=holm([summary["permutation_p"]] * 7)[0]) == "inconclusive"  # 7 · 2/256


def test_sign_flip_test_by_hand():
    # ±1 ±2 ±3: sums 6, 4, 2, 0, 0, -2, -4, -6; |sum| >= 6 in 2 of 8
    assert sign_flip_test([1, 2, 3]) == pytest.approx(2 / 8)
    # 1 + 2 - 4 = -1: every one of ±1 ±2 ±4 (7, 5, 3, 1 and negatives) reaches |sum| >= 1
    assert sign_flip_test([1, 2, -4]) == 1.0
    # four ±1 summing to 2: |sum| >= 2 for 4 (1 way), 2 (4), -2 (4), -4 (1): 10 of 16
    assert sign_flip_test([1, 1, 1, -1]) == pytest.approx(10 / 16)
    # 5 + 1 + 1 + 1 = 8 is reached only by all + and all -
    assert sign_flip_test([5, 1, 1, 1]) == pytest.approx(2 / 16)
    # zeros flip to themselves: [0, 0, 2] is the one-value test
    assert sign_flip_test([0, 0, 2]) == 1.0
    assert sign_flip_test([0.0, 0.0]) is None and sign_flip_test([]) is None
    # the smallest p of k values is 2 / 2^k
    assert sign_flip_test([0.3] * 8) == pytest.approx(2 / 256)


def test_sign_flip_monte_carlo_agrees_with_full_enumeration():
    rng = np.random.default_rng(7)
    values = list(rng.normal(0.4, 1.0, 17))
    exact = sign_flip_test(values, exact_up_to=17)
    sampled = sign_flip_test(values, resamples=20_000, seed=3)  # 17 > 16: Monte Carlo
    assert sampled == sign_flip_test(values, resamples=20_000, seed=3)  # seeded
    assert sampled != sign_flip_test(values, resamples=20_000, seed=4)
    standard_error = math.sqrt(exact * (1 - exact) / 20_000)
    assert abs(sampled - exact) < 4 * standard_error + 1 / 20_000
    # never 0, even when no random assignment reaches the observed sum
    assert sign_flip_test([1.0] * 40, resamples=100) == pytest.approx(1 / 101)


def test_student_t_tail_by_hand():
    # df = 1 is the Cauchy: P(|T| >= t) = 1 - 2 atan(t) / π
    assert student_t_two_sided(2.0, 1) == pytest.approx(1 - 2 * math.atan(2.0) / math.pi, rel=1e-12)
    # df = 2: P(|T| >= t) = 1 - t / sqrt(2 + t²)
    for t in (0.5, 3.0, 12.0):
        assert student_t_two_sided(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-12)
    # df = 3: 1 - (2/π)(θ + sin θ cos θ), θ = atan(t/√3)
    theta = math.atan(1.5 / math.sqrt(3))
    by_hand = 1 - 2 / math.pi * (theta + math.sin(theta) * math.cos(theta))
    assert student_t_two_sided(1.5, 3) == pytest.approx(by_hand, rel=1e-12)
    assert student_t_two_sided(0.0, 5) == 1.0 and student_t_two_sided(-2.0, 4) == student_t_two_sided(2.0, 4)
    # many degrees of freedom: the normal tail, 2 · (1 - Φ(1.96)) ≈ 0.05
    assert student_t_two_sided(1.96, 4000) == pytest.approx(math.erfc(1.96 / math.sqrt(2)), rel=2e-3)
    with pytest.raises(ValueError):
        student_t_two_sided(1.0, 0)


def test_paired_t_test_by_hand():
    # [1, 2, 3]: mean 2, sd 1, t = 2√3 with 2 df: p = 1 - t / sqrt(2 + t²) = 1 - √(12/14)
    assert paired_t_test([1, 2, 3]) == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-12)
    # [1, 3]: mean 2, sd √2, t = 2 with 1 df
    assert paired_t_test([1, 3]) == pytest.approx(1 - 2 * math.atan(2) / math.pi, rel=1e-12)
    assert paired_t_test([0.5, 0.5, 0.5]) == 0.0  # sd 0, mean not 0
    assert paired_t_test([1.0]) is None and paired_t_test([0, 0, 0]) is None


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 of m = 3: 3 · 0.01, max(0.03, 2 · 0.03), max(0.06, 1 · 0.04)
    assert holm([0.04, 0.01, None, 0.03]) == pytest.approx([0.06, 0.03, None, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert holm([]) == [] and holm([None]) == [None]


def test_against_scipy_where_installed():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(11)
    for k in (2, 3, 5, 8, 12):
        d = rng.normal(0.3, 1.0, k)
        t_p = scipy_stats.ttest_rel(d, np.zeros(k)).pvalue
        assert paired_t_test(d) == pytest.approx(t_p, rel=1e-9)
        exact = scipy_stats.permutation_test(
            (d,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
        ).pvalue
        assert sign_flip_test(d) == pytest.approx(exact, rel=1e-9)
    for df in (1, 2, 3, 7, 30, 101):
        for t in (0.2, 1.0, 2.2, 6.0):
            assert student_t_two_sided(t, df) == pytest.approx(2 * scipy_stats.t.sf(t, df), abs=1e-13)


def test_bootstrap_difference_ci_resamples_both_sides_and_needs_two_on_each():
    from ssacli.stats import bootstrap_difference_ci

    a, b = [0.0, 1.0, 2.0, 3.0], [10.0, 10.0, 10.0, 10.0]
    low, high = bootstrap_difference_ci(a, b)
    # b is constant: every resampled difference is 10 − a resampled mean of a, in [10 − 3, 10 − 0]
    assert 7.0 <= low < 10 - 1.5 < high <= 10.0
    paired = bootstrap_ci([10 - v for v in a])  # one side resampled: the same spread, mirrored
    assert abs((high - low) - (paired[1] - paired[0])) < 0.2 * (paired[1] - paired[0])
    assert bootstrap_difference_ci([1.0], b) is None and bootstrap_difference_ci(a, [1.0]) is None


def test_spearman_by_hand():
    # x ranks 0,1,2,3; y = 10, 30, 20, 40 ranks 0,2,1,3: d = 0,1,1,0, Σd² = 2, ρ = 1 − 6·2/(4·15) = 0.8
    assert stats.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    # ties share their mean rank: x = 1, 1, 2 -> ranks 0.5, 0.5, 2; y = 3, 2, 1 -> ranks 2, 1, 0
    r = np.corrcoef([0.5, 0.5, 2], [2, 1, 0])[0, 1]
    assert stats.spearman([1, 1, 2], [3, 2, 1]) == pytest.approx(r)
    assert stats.spearman([1, 2, 3], [5, 5, 5]) is None  # one side does not vary: undefined
    assert stats.spearman([1, 2], [1, 2]) is None
    with pytest.raises(ValueError, match="paired"):
        stats.spearman([1, 2, 3], [1, 2])


def test_spearman_ci_brackets_rho_and_is_seeded():
    rng = np.random.default_rng(3)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    rho, (low, high) = stats.spearman_ci(x, y, resamples=2000)
    assert low < rho < high and 0 < low  # a strong association's interval excludes 0
    assert stats.spearman_ci(x, y, resamples=2000) == (rho, (low, high))
    _, (low2, high2) = stats.spearman_ci(x, rng.normal(size=40), resamples=2000)
    assert low2 < 0 < high2  # no association: the interval holds 0
    assert stats.spearman_ci([1, 2, 3], [1, 3, 2]) == (stats.spearman([1, 2, 3], [1, 3, 2]), None)


def test_spearman_against_scipy_where_installed():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    for n in (5, 12, 31):
        x, y = rng.integers(0, 6, size=n).astype(float), rng.normal(size=n)  # x with ties
        assert stats.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, rel=1e-12)
