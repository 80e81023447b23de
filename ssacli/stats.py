"""Paired statistics for seed-matched studies (the ICL sweep, the language-model study).

Two arms run with the same seed share initialization, data order and evaluation prompts, so the
unit of comparison is the seed: the per-seed difference ``b - a``. The tools, each on those
differences:

* :func:`bootstrap_ci`: percentile bootstrap of the mean difference (resample the seeds with
  replacement, ``resamples`` times, from a seeded generator: the same inputs give the same
  interval). With few seeds it is optimistic: with 3 seeds it is [min, max] of the differences
  (every resample mean lies between them, and both ends are drawn with probability 1/27 > 2.5 %),
  so "the interval excludes 0" means "all three agree", which two arms that do not differ give
  1 time in 4. It is reported next to the per-seed values and a test, never instead of them.
* :func:`bootstrap_difference_ci`: the same for two unpaired samples (the difference of their means,
  each resampled on its own): documents of two corpora, which are no pairs.
* :func:`sign_flip_test`: the paired permutation test. Under "the arms do not differ" each
  difference is as likely positive as negative, so the observed |sum| is compared with the |sum|
  of every one of the 2^k sign assignments (exact, k <= 16) or of ``resamples`` random ones
  (seeded). Distribution-free; its smallest possible p is 2 / 2^k (0.25 for k = 3, 0.0078 for 8).
* :func:`paired_t_test`: the two-sided paired t-test (Student's t with k - 1 degrees of
  freedom). It assumes normally distributed differences, which a handful of seeds cannot check;
  it is shown beside the permutation test, which decides (:func:`verdict`).
* :func:`sign_test`: exact two-sided sign test (binomial, p = 1/2) on the non-zero differences;
  zero differences (ties) are dropped, the usual convention.
* :func:`holm`: Holm's step-down adjustment of a family of p-values (valid under any dependence,
  e.g. levels of one shift measured on the same models).
* :func:`spearman` and :func:`spearman_ci`: Spearman's rank correlation of paired values (ties
  share their mean rank) and its percentile bootstrap interval, the pairs resampled together.
* :func:`paired_summary`: all of them, with the values, wins, losses and ties, as one JSON-ready
  dict; :func:`verdict` turns one into a word.

Pure Python and numpy, no torch: a bottom-layer module that any stage and the study scripts can
import. (scipy, which has these tests, is not a dependency; tests/test_stats.py compares against it
where it is installed.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .defaults import RESAMPLES

LEVEL = 0.95
ALPHA = 0.05  # the level at which verdict() calls a difference better or worse
EXACT_SIGN_FLIPS = 16  # up to 2^16 = 65,536 assignments are enumerated; beyond, Monte Carlo


def paired_differences(a: Mapping[Any, float], b: Mapping[Any, float]) -> dict[Any, float]:
    """``b[k] - a[k]`` for every key (seed) present in both, in ``a``'s order."""
    return {k: b[k] - a[k] for k in a if k in b}


def bootstrap_ci(
    differences: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``differences`` (None with fewer than two: one
    pair resampled is itself every time, a zero-width "interval" that says nothing about spread).

    Each resample draws len(differences) values with replacement (numpy's PCG64 from ``seed``); the
    interval is the (1 - level)/2 and (1 + level)/2 quantiles of the resampled means (numpy's
    default linear interpolation between order statistics)."""
    values = np.asarray(list(differences), dtype=np.float64)
    if values.size < 2:
        return None
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level must be in (0, 1) and resamples >= 1, got {level}, {resamples}")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, values.size, size=(resamples, values.size))
    means = values[index].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def bootstrap_difference_ci(
    a: Sequence[float], b: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``mean(b) - mean(a)`` for two unpaired samples (each
    resampled with replacement on its own, from one seeded generator; None where either has fewer
    than two values). The unpaired counterpart of :func:`bootstrap_ci`: documents of two corpora
    are no pairs, so both means' uncertainty enters the interval."""
    x = np.asarray(list(a), dtype=np.float64)
    y = np.asarray(list(b), dtype=np.float64)
    if x.size < 2 or y.size < 2:
        return None
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level must be in (0, 1) and resamples >= 1, got {level}, {resamples}")
    rng = np.random.default_rng(seed)
    means_x = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    means_y = y[rng.integers(0, y.size, size=(resamples, y.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means_y - means_x, [tail, 1 - tail])
    return float(low), float(high)


def ranks(values: Sequence[float]) -> np.ndarray:
    """Average ranks, 0-based (ties share their mean rank), as Spearman's ρ needs."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    r = np.empty(len(v))
    r[order] = np.arange(len(v), dtype=np.float64)
    for value in np.unique(v):
        tied = v == value
        if tied.sum() > 1:
            r[tied] = r[tied].mean()
    return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's ρ of paired values: the Pearson correlation of their ranks. None where there are
    fewer than 3 pairs or either side does not vary (ρ is undefined there, not 0)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"spearman needs paired values, got {a.shape} and {b.shape}")
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def spearman_ci(
    x: Sequence[float], y: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float | None, tuple[float, float] | None]:
    """Spearman's ρ and its percentile bootstrap interval: each resample draws the pairs with
    replacement (x and y together); resamples where ρ is undefined (a side that does not vary) are
    left out. (None, None) where ρ itself is undefined; no interval with fewer than 4 pairs."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    rho = spearman(a, b)
    if rho is None or a.size < 4:
        return rho, None
    rng = np.random.default_rng(seed)
    draws = [spearman(a[i], b[i]) for i in rng.integers(0, a.size, size=(resamples, a.size))]
    kept = [d for d in draws if d is not None]
    if not kept:
        return rho, None
    tail = (1 - level) / 2
    low, high = np.quantile(kept, [tail, 1 - tail])
    return rho, (float(low), float(high))


def sign_test(differences: Sequence[float]) -> float | None:
    """Exact two-sided sign-test p-value: P(a split at least as uneven as the observed one) under
    "positive and negative are equally likely", ties dropped. None when every difference is 0."""
    positive = sum(1 for d in differences if d > 0)
    negative = sum(1 for d in differences if d < 0)
    n = positive + negative
    if n == 0:
        return None
    k = min(positive, negative)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def sign_flip_test(
    differences: Sequence[float],
    *,
    exact_up_to: int = EXACT_SIGN_FLIPS,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> float | None:
    """Two-sided paired permutation (sign-flip) test of "mean difference 0": the share of sign
    assignments s (each difference kept or negated) with |Σ s·d| >= |Σ d|. Exact over all 2^k
    assignments for k <= ``exact_up_to`` differences; otherwise ``resamples`` random assignments
    from numpy's PCG64 at ``seed``, counted as (1 + hits) / (1 + resamples) so that p is never 0.
    None when there is nothing to test (no differences, or all 0)."""
    values = np.asarray(list(differences), dtype=np.float64)
    if values.size == 0 or not np.any(values):
        return None
    observed = abs(values.sum())
    # sums that equal the observed one up to rounding count as "at least as extreme"
    tolerance = 1e-9 * np.abs(values).sum()
    k = values.size
    if k <= exact_up_to:
        bits = (np.arange(2**k)[:, None] >> np.arange(k)) & 1
        sums = (1 - 2 * bits) @ values
        return float(np.mean(np.abs(sums) >= observed - tolerance))
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    hits, left = 0, resamples
    while left:  # in chunks: resamples x k signs at once could be large
        n = min(left, 8192)
        signs = rng.integers(0, 2, size=(n, k)) * 2 - 1
        hits += int(np.sum(np.abs(signs @ values) >= observed - tolerance))
        left -= n
    return (1 + hits) / (1 + resamples)


def student_t_two_sided(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with an integer ``df`` >= 1, from the closed form of
    Abramowitz & Stegun 26.7.3-4 (θ = atan(|t|/√df); a finite series in cos θ). Accurate to about
    1e-15 absolute, so p-values below ~1e-12 are only "very small"."""
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2:  # odd: (2/π)(θ + sin θ (cos θ + 2/3 cos³θ + (2·4)/(3·5) cos⁵θ + …))
        term, series = c, 0.0
        for j in range(1, (df - 1) // 2 + 1):
            series += term
            term *= c * c * (2 * j) / (2 * j + 1)
        inside = 2 / math.pi * (theta + s * series)
    else:  # even: sin θ (1 + 1/2 cos²θ + (1·3)/(2·4) cos⁴θ + …)
        term, series = 1.0, 0.0
        for j in range(1, df // 2 + 1):
            series += term
            term *= c * c * (2 * j - 1) / (2 * j)
        inside = s * series
    return min(1.0, max(0.0, 1.0 - inside))


def paired_t_test(differences: Sequence[float]) -> float | None:
    """Two-sided paired t-test p of "mean difference 0": t = mean / (sd / √k), k - 1 degrees of
    freedom (sd with k - 1 in the denominator). None for fewer than 2 differences or all 0; 0 when
    every difference is the same non-zero number (sd = 0)."""
    values = np.asarray(list(differences), dtype=np.float64)
    k = values.size
    if k < 2 or not np.any(values):
        return None
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if sd == 0:
        return 0.0
    return student_t_two_sided(mean / (sd / math.sqrt(k)), k - 1)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of m p-values (None entries are not tested and stay
    None): the i-th smallest becomes max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where
    the adjusted p <= α keeps the chance of any false "better"/"worse" in the family <= α."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(tested)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def paired_summary(
    a: Mapping[Any, float],
    b: Mapping[Any, float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """The paired comparison of arm ``b`` against arm ``a`` (both {seed: value}), JSON-ready:
    seeds, both arms' values, differences b - a, their mean, bootstrap CI, the sign-flip
    permutation p (``permutation_p``), the paired t-test p (``t_test_p``), the sign-test p, and how
    many seeds have b above (``b_higher``), below (``b_lower``) or equal to a."""
    diffs = paired_differences(a, b)
    values = list(diffs.values())
    ci = bootstrap_ci(values, level=level, resamples=resamples, seed=seed)
    return {
        "seeds": list(diffs),
        "a": [a[k] for k in diffs],
        "b": [b[k] for k in diffs],
        "differences": values,
        "mean_difference": sum(values) / len(values) if values else None,
        "ci_low": None if ci is None else ci[0],
        "ci_high": None if ci is None else ci[1],
        "level": level,
        "permutation_p": sign_flip_test(values, resamples=resamples, seed=seed),
        "t_test_p": paired_t_test(values),
        "sign_test_p": sign_test(values),
        "b_higher": sum(1 for d in values if d > 0),
        "b_lower": sum(1 for d in values if d < 0),
        "ties": sum(1 for d in values if d == 0),
    }


def verdict(
    summary: Mapping[str, Any],
    *,
    lower_is_better: bool = True,
    min_pairs: int = 3,
    p: float | None = None,
    alpha: float = ALPHA,
) -> str:
    """One word for a paired summary: ``better`` / ``worse`` (b against a) when the CI excludes 0
    **and** the test's p <= ``alpha``; ``inconclusive`` otherwise; ``equal`` when every pair ties;
    ``too few seeds`` below ``min_pairs`` pairs (a bootstrap of one or two values says nothing).

    ``p`` is the p-value that decides: by default the summary's ``permutation_p`` (computed from its
    ``differences`` when a summary written before the test existed lacks it); pass a Holm-adjusted
    one (:func:`holm`) to decide within a family of comparisons. The interval alone never decides:
    with 3 seeds it excludes 0 whenever the three agree in sign."""
    low, high = summary.get("ci_low"), summary.get("ci_high")
    if low is None or high is None:
        return "n/a"
    differences = summary.get("differences", ())
    if len(differences) < min_pairs:
        return "too few seeds"
    if low == high == 0:
        return "equal"
    if p is None:
        p = summary["permutation_p"] if "permutation_p" in summary else sign_flip_test(differences)
    if p is None or p > alpha or low <= 0 <= high:
        return "inconclusive"
    if low > 0:
        return "worse" if lower_is_better else "better"
    return "better" if lower_is_better else "worse"


__all__ = [
    "bootstrap_ci",
    "holm",
    "paired_differences",
    "paired_summary",
    "paired_t_test",
    "sign_flip_test",
    "sign_test",
    "student_t_two_sided",
    "verdict",
]
