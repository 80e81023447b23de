"""Paired statistics for seed-matched studies (the ICL sweep, the language-model study).

Two arms run with the same seed share initialization, data order and evaluation prompts, so the
unit of comparison is the seed: the per-seed difference ``b - a``. Three tools, each on those
differences:

* :func:`bootstrap_ci`: percentile bootstrap of the mean difference (resample the seeds with
  replacement, ``resamples`` times, from a seeded generator: the same inputs give the same
  interval). With 8 seeds the bootstrap is rough; it is reported next to the per-seed values, never
  instead of them.
* :func:`sign_test`: exact two-sided sign test (binomial, p = 1/2) on the non-zero differences;
  zero differences (ties) are dropped, the usual convention. With n seeds the smallest possible
  p-value is 2 / 2^n (0.0078 for n = 8, 0.25 for n = 3).
* :func:`paired_summary`: both, with the values, wins, losses and ties, as one JSON-ready dict.

No multiple-comparison correction is applied; the tables report many cells, so a single p < 0.05
among them is expected by chance. Pure Python and numpy, no torch: a bottom-layer module that any
stage and the study scripts can import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000


def paired_differences(a: Mapping[Any, float], b: Mapping[Any, float]) -> dict[Any, float]:
    """``b[k] - a[k]`` for every key (seed) present in both, in ``a``'s order."""
    return {k: b[k] - a[k] for k in a if k in b}


def bootstrap_ci(
    differences: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``differences`` (None when there are none).

    Each resample draws len(differences) values with replacement (numpy's PCG64 from ``seed``); the
    interval is the (1 - level)/2 and (1 + level)/2 quantiles of the resampled means (numpy's
    default linear interpolation between order statistics)."""
    values = np.asarray(list(differences), dtype=np.float64)
    if values.size == 0:
        return None
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level must be in (0, 1) and resamples >= 1, got {level}, {resamples}")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, values.size, size=(resamples, values.size))
    means = values[index].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


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


def paired_summary(
    a: Mapping[Any, float],
    b: Mapping[Any, float],
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """The paired comparison of arm ``b`` against arm ``a`` (both {seed: value}), JSON-ready:
    seeds, both arms' values, differences b - a, their mean, bootstrap CI, sign-test p, and how
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
        "sign_test_p": sign_test(values),
        "b_higher": sum(1 for d in values if d > 0),
        "b_lower": sum(1 for d in values if d < 0),
        "ties": sum(1 for d in values if d == 0),
    }


def verdict(summary: Mapping[str, Any], *, lower_is_better: bool = True, min_pairs: int = 3) -> str:
    """One word for a paired summary, following the interval: ``better`` / ``worse`` (b against a)
    when the CI excludes 0, ``inconclusive`` when it contains 0, ``equal`` when every pair ties,
    ``too few seeds`` below ``min_pairs`` pairs (a bootstrap of one or two values says nothing)."""
    low, high = summary.get("ci_low"), summary.get("ci_high")
    if low is None or high is None:
        return "n/a"
    if len(summary.get("differences", ())) < min_pairs:
        return "too few seeds"
    if low == high == 0:
        return "equal"
    if low > 0:
        return "worse" if lower_is_better else "better"
    if high < 0:
        return "better" if lower_is_better else "worse"
    return "inconclusive"


__all__ = ["bootstrap_ci", "paired_differences", "paired_summary", "sign_test", "verdict"]
