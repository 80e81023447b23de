"""The row metrics by hand: small weight tensors written out below, reduced to row statistics
(ssacli.kernels.row_stats.weight_statistics) and derived (ssacli.diagnosis.row_metrics.row_sums), with
expectations worked out with plain ``math`` from the definitions in row_metrics' docstring (never
read back from the code); and ssacli.diagnosis.metrics' streaming sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ssacli.defaults import TAU, TOP_K
from ssacli.diagnosis.metrics import METRICS
from ssacli.diagnosis.recorder import LayerStats, Moments
from ssacli.diagnosis.row_metrics import HeadStats, row_sums
from ssacli.kernels.positions import PositionBins
from ssacli.kernels.row_stats import weight_statistics

J = 0.7  # junk written where a key is not visible: the metrics must ignore it


def _sums(weights, visible=None, *, query_valid=None, query_positions=None, target=None, tau=TAU,
          top_k=TOP_K, sink=None):  # fmt: skip
    """The per-head sums of a block of weights, as diagnose's eager path computes them (the position
    terms over the first 2 keys and bins of 2)."""
    stats = weight_statistics(
        weights, visible, target=target, top_k=top_k, sink=sink, positions=POSITIONS,
        query_positions=query_positions,
    )  # fmt: skip
    return row_sums(
        stats, query_valid=query_valid, query_positions=query_positions, target=target, tau=tau, top_k=top_k
    )


POSITIONS = PositionBins(sink_k=2, bin_width=2)


def _entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def _means(rows: list[tuple[list[float], float]], tau: float, top_k: int) -> dict[str, float]:
    """Mean of every row metric over ``rows`` = [(visible weights, mass), ...], straight from the
    definitions: p = w / mass, entropy H(p) / log N_i, and so on."""
    out = dict.fromkeys(("entropy", "max_weight", "collapse_rate", "effective_tokens", "topk_mass"), 0.0)
    out |= {"sink_mass": 0.0, "row_mass": 0.0}
    for w, mass in rows:
        p = [x / mass for x in w]
        h = _entropy(p)
        out["entropy"] += h / math.log(len(p))
        out["max_weight"] += max(p)
        out["collapse_rate"] += 1.0 if max(p) >= tau else 0.0
        out["effective_tokens"] += math.exp(h)
        out["topk_mass"] += sum(sorted(p, reverse=True)[:top_k])
        out["sink_mass"] += p[0]
        out["row_mass"] += mass
    return {k: v / len(rows) for k, v in out.items()}


def _stats(sums: dict[str, torch.Tensor], heads: int) -> dict[str, np.ndarray]:
    stats = HeadStats(heads)
    stats.add(sums)
    return stats.means()


# [1, 2, 4, 4]: causal rows (query i sees keys 0..i), query 3 is padding. Head 0 sums to one,
# head 1 to one half (an unnormalized scorer such as sigmoid).
WEIGHTS = torch.tensor(
    [
        [
            [[1.0, J, J, J], [0.25, 0.75, J, J], [0.02, 0.96, 0.02, J], [0.1, 0.2, 0.3, 0.4]],
            [[0.5, J, J, J], [0.1, 0.4, J, J], [0.2, 0.2, 0.1, J], [0.1, 0.1, 0.1, 0.2]],
        ]
    ]
)
CAUSAL = torch.ones(4, 4, dtype=torch.bool).tril().reshape(1, 1, 4, 4)
VALID = torch.tensor([[True, True, True, False]])
# The counted rows by hand: row 0 has one visible key (nothing to choose), row 3 is padding.
HEAD_ROWS = [
    [([0.25, 0.75], 1.0), ([0.02, 0.96, 0.02], 1.0)],
    [([0.1, 0.4], 0.5), ([0.2, 0.2, 0.1], 0.5)],
]


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_every_row_metric_by_hand(top_k):
    sums = _sums(WEIGHTS, CAUSAL, query_valid=VALID, tau=0.9, top_k=top_k)
    assert sums["rows"].tolist() == [2.0, 2.0]
    assert sums["capture_rows"].tolist() == [0.0, 0.0]  # no target given
    means = _stats(sums, 2)
    for head, rows in enumerate(HEAD_ROWS):
        expected = _means(rows, tau=0.9, top_k=top_k)
        for name, value in expected.items():
            assert means[name][head] == pytest.approx(value, abs=1e-6), (head, name)
        assert math.isnan(means["outlier_capture"][head])
    # spot checks of the hand formulas themselves, so a wrong helper cannot hide a wrong metric
    assert means["collapse_rate"].tolist() == [0.5, 0.0]  # only 0.96 reaches tau
    assert means["row_mass"].tolist() == pytest.approx([1.0, 0.5])
    assert means["sink_mass"][1] == pytest.approx((0.2 + 0.4) / 2)  # of the normalized row
    if top_k >= 3:  # k capped by N_i: the whole row
        assert means["topk_mass"].tolist() == pytest.approx([1.0, 1.0])


def test_padding_and_junk_matter_when_counted():
    """The same tensor with every query valid counts row 3 too, and changing junk at invisible
    keys changes nothing."""
    sums = _sums(WEIGHTS, CAUSAL, tau=0.9, top_k=2)
    assert sums["rows"].tolist() == [3.0, 3.0]
    means = _stats(sums, 2)
    head0 = [*HEAD_ROWS[0], ([0.1, 0.2, 0.3, 0.4], 1.0)]
    assert means["entropy"][0] == pytest.approx(_means(head0, 0.9, 2)["entropy"], abs=1e-6)
    junk = torch.where(CAUSAL, WEIGHTS, 123.0)
    again = _sums(junk, CAUSAL, query_valid=VALID, tau=0.9, top_k=2)
    base = _sums(WEIGHTS, CAUSAL, query_valid=VALID, tau=0.9, top_k=2)
    for name in base:
        assert torch.allclose(again[name], base[name], atol=1e-12), name


def test_tau_is_inclusive_and_moves_the_collapse_rate():
    loose = _stats(_sums(WEIGHTS, CAUSAL, query_valid=VALID, tau=0.75), 2)
    assert loose["collapse_rate"].tolist() == [1.0, 0.5]  # 0.75 >= 0.75 and 0.96; head 1: 0.8
    strict = _stats(_sums(WEIGHTS, CAUSAL, query_valid=VALID, tau=0.97), 2)
    assert strict["collapse_rate"].tolist() == [0.0, 0.0]


def test_zero_and_non_finite_rows_are_not_counted():
    w = torch.tensor([[[[0.5, 0.5], [0.0, 0.0]], [[0.3, 0.7], [float("nan"), 0.2]]]])  # [1, 2, 2, 2]
    sums = _sums(w)  # everything visible, every query valid
    assert sums["rows"].tolist() == [1.0, 1.0]
    stats = HeadStats(2)
    stats.add(sums)
    assert stats.rows == 1
    means = stats.means()
    assert means["max_weight"].tolist() == pytest.approx([0.5, 0.7])
    assert means["entropy"][0] == pytest.approx(1.0)  # uniform over 2 keys


def test_empty_stats_and_heads_without_rows_are_nan():
    assert all(np.isnan(v).all() and v.shape == (3,) for v in HeadStats(3).means().values())
    assert HeadStats(3).rows == 0
    w = torch.tensor([[[[0.4, 0.6]], [[0.0, 0.0]]]])  # head 1 has no mass at all
    stats = HeadStats(2)
    stats.add(_sums(w))
    means = stats.means()
    assert stats.rows == 1
    assert means["max_weight"][0] == pytest.approx(0.6) and math.isnan(means["max_weight"][1])
    assert set(means) == set(METRICS)


# Capture: [2, 1, 5, 5], causal. Sample 0 targets key 2, sample 1 targets key 1 and has a
# padding query at 4. The rows that count for capture are worked out in the test below.
CAPTURE_W = torch.tensor(
    [
        [
            [
                [1.0, 0, 0, 0, 0],
                [0.5, 0.5, 0, 0, 0],
                [0.2, 0.3, 0.5, 0, 0],
                [0.1, 0.2, 0.6, 0.1, 0],
                [0.1, 0.1, 0.2, 0.3, 0.3],
            ]
        ],
        [
            [
                [1.0, 0, 0, 0, 0],
                [0.4, 0.6, 0, 0, 0],
                [0.25, 0.25, 0.5, 0, 0],
                [0.1, 0.7, 0.1, 0.1, 0],
                [0.2, 0.2, 0.2, 0.2, 0.2],
            ]
        ],
    ]
)
CAUSAL5 = torch.ones(5, 5, dtype=torch.bool).tril().reshape(1, 1, 5, 5)
VALID5 = torch.tensor([[True] * 5, [True, True, True, True, False]])
TARGET = torch.tensor([2, 1])
# sample 0: row 1 cannot see key 2, row 2 is the target itself -> rows 3, 4 (0.6, 0.2)
# sample 1: row 1 is the target itself, row 4 is padding -> rows 2, 3 (0.25, 0.7)
EXPECTED_CAPTURE = (0.6 + 0.2 + 0.25 + 0.7) / 4


def test_outlier_capture_by_hand():
    sums = _sums(CAPTURE_W, CAUSAL5, query_valid=VALID5, target=TARGET)
    assert sums["capture_rows"].item() == 4.0
    assert sums["rows"].item() == 4 + 3  # rows 1..4 of sample 0, rows 1..3 of sample 1
    means = _stats(sums, 1)
    assert means["outlier_capture"][0] == pytest.approx(EXPECTED_CAPTURE)


def test_blocks_with_query_positions_add_up_to_the_whole_map():
    """Streaming: rows 0-1 and 2-4 sent as two blocks (with their key indices) give the same means
    as the whole map at once, capture included."""
    whole = _stats(_sums(CAPTURE_W, CAUSAL5, query_valid=VALID5, target=TARGET), 1)
    stats = HeadStats(1)
    for rows in (slice(0, 2), slice(2, 5)):
        positions = torch.arange(5)[rows]
        stats.add(
            _sums(
                CAPTURE_W[:, :, rows], CAUSAL5[:, :, rows], query_valid=VALID5[:, rows],
                query_positions=positions, target=TARGET,
            )
        )  # fmt: skip
    blocked = stats.means()
    assert stats.rows == 7
    for name in METRICS:
        if name == "learned_sink":  # NaN without a learned sink: tests/diagnosis/test_learned_sinks.py
            assert np.isnan(blocked[name][0]) and np.isnan(whole[name][0])
            continue
        assert blocked[name][0] == pytest.approx(whole[name][0], abs=1e-12), name
    assert blocked["outlier_capture"][0] == pytest.approx(EXPECTED_CAPTURE)


def test_default_query_positions_are_bottom_right_aligned():
    """Two query rows against five keys (a KV cache) are keys 3 and 4: with target 3, row 3 is the
    target's own row and only row 4 counts."""
    w = CAPTURE_W[:1, :, 3:]  # sample 0, rows 3 and 4
    sums = _sums(w, CAUSAL5[:, :, 3:], target=torch.tensor([3]))
    assert sums["capture_rows"].item() == 1.0
    assert sums["outlier_capture"].item() == pytest.approx(0.3)


@pytest.mark.parametrize("kind", ["softmax", "collapsed", "sigmoid", "sparse"])
def test_entropy_of_the_row_statistics_is_the_xlogy_entropy_in_float64(kind):
    """float64 weights reduced to (m, l, spread): H = log l + spread / l is the entropy of the
    normalized row computed the plain way, log Σw − Σ xlogy(w, w) / Σw, within 1e-12 relative
    (within rounding of the plain way's own cancellation, 1e-14 absolute, on collapsed rows)."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 3, 9, 40, generator=gen, dtype=torch.float64)
    visible = torch.rand(2, 1, 9, 40, generator=gen) > 0.3
    visible[..., :2] = True
    hidden = logits.masked_fill(~visible, -math.inf)
    weights = {
        "softmax": torch.softmax(hidden, -1),
        "collapsed": torch.softmax(hidden * 40, -1),
        "sigmoid": torch.sigmoid(logits) * visible,  # rows summing to anything
        "sparse": torch.softmax(hidden, -1) * (torch.rand(2, 3, 9, 40, generator=gen) > 0.5),  # exact zeros
    }[kind]
    stats = weight_statistics(weights, visible)
    entropy = torch.log(stats.total) + stats.spread / stats.total
    w = torch.where(visible, weights, 0.0)
    mass = w.sum(-1)
    plain = torch.log(mass) - torch.special.xlogy(w, w).sum(-1) / mass
    assert stats.total.dtype == torch.float64 and (mass > 0).all()
    assert ((entropy - plain).abs() <= 1e-12 * plain.abs() + 1e-14).all(), (entropy - plain).abs().max()
    assert torch.allclose(stats.total * torch.exp(stats.max), mass, rtol=1e-14, atol=0)  # l·e^m = Σw
    if kind == "collapsed":
        assert (plain < 1e-6).any()  # the case really has collapsed rows


def test_the_metric_table_says_what_the_metrics_do():
    """METRICS' claims checked against row_sums: a bounded metric stays in [0, 1] on any rows, an
    unbounded one leaves it somewhere; and as one row sharpens from uniform to one key, a metric
    that saturates upwards rises, downwards falls, and one with no direction (row mass) stays."""
    generator = torch.Generator().manual_seed(0)
    # Uniform rows over 8 keys with mass 3 (an unnormalized scorer), then random rows.
    weights = torch.cat([torch.full((1, 1, 4, 8), 3 / 8), torch.rand(1, 1, 4, 8, generator=generator)], 2)
    sink = torch.rand(1, 1, 8, generator=generator)  # a learned sink's weight per row
    means = _stats(_sums(weights, target=torch.tensor([2]), sink=sink), 1)
    for name, spec in METRICS.items():
        inside = 0 <= means[name][0] <= 1
        assert inside if spec.bounded else not inside, name
    # One query row over 8 keys, largest logit at key 0 (also the target), sharpened from nearly
    # uniform (max 0.14 < tau, top-2 0.27) to nearly one key: every metric moves, or stays.
    logits = -torch.arange(8.0)
    sums = [
        _sums(torch.softmax(logits * a, -1).reshape(1, 1, 1, 8), target=torch.tensor([0]), top_k=2)
        for a in (0.05, 10.0)
    ]
    soft, sharp = _stats(sums[0], 1), _stats(sums[1], 1)
    for name, spec in METRICS.items():
        before, after = soft[name][0], sharp[name][0]
        if name == "learned_sink":  # not a property of the row's shape; no sink here: NaN
            assert np.isnan(before) and np.isnan(after)
            continue
        if name == "attention_distance":  # where the mass lands, not how sharp: onto key 0, 7 away
            assert before < after == pytest.approx(7.0, abs=1e-3)
        elif spec.higher_is_saturated is None:
            assert after == pytest.approx(before), name
        else:
            assert (after > before) == spec.higher_is_saturated and after != before, name


# ---- the kurtosis of a layer's output, accumulated over batches ------------------------------------


def _two_pass_kurtosis(x: np.ndarray) -> float:
    """Pearson's kurtosis of all values at once in float64, about their own mean."""
    d = x - x.mean()
    return float((d**4).mean() / (d**2).mean() ** 2)


def _raw_sum_kurtosis(x: np.ndarray) -> float:
    """The same kurtosis from the raw sums Σx..Σx⁴ (how the batches used to be accumulated)."""
    n, (s1, s2, s3, s4) = len(x), [float((x**p).sum()) for p in (1, 2, 3, 4)]
    mu = s1 / n
    return (s4 / n - 4 * mu * s3 / n + 6 * mu * mu * s2 / n - 3 * mu**4) / (s2 / n - mu * mu) ** 2


@pytest.mark.parametrize("mean", [0.0, 1e4, -3e5])
def test_kurtosis_over_batches_is_the_two_pass_value_even_for_a_massive_mean(mean):
    """A layer output with mean ≫ std (a massive activation, what the metric is for) as float32
    values over uneven batches (one of a single value): its kurtosis is the two-pass float64 one
    (and scipy's, where installed). Raw power sums lose every digit of it at mean 1e4."""
    gen = np.random.default_rng(0)
    values = (mean + gen.standard_t(5, size=20_000)).astype(np.float32)
    stats = LayerStats()
    for chunk in np.array_split(values, [7, 5000, 5001, 12_000]):
        stats.add_hidden(torch.from_numpy(chunk))
    x = values.astype(np.float64)
    expected = _two_pass_kurtosis(x)
    assert stats.means()["kurtosis"] == pytest.approx(expected, rel=1e-6)
    try:
        from scipy.stats import kurtosis
    except ImportError:
        pass
    else:
        assert expected == pytest.approx(kurtosis(x, fisher=False), rel=1e-9)
    if mean:  # the failure the accumulation avoids is real: the raw sums are far off here
        assert not _raw_sum_kurtosis(x) == pytest.approx(expected, rel=0.1)


def test_moments_merge_is_the_moments_of_all_values_and_a_constant_has_no_kurtosis():
    gen = np.random.default_rng(1)
    parts = [gen.gamma(2.0, size=n) + 50 * i for i, n in enumerate((1, 300, 2, 4000))]  # skewed, apart
    merged = Moments()
    for part in [np.empty(0), *parts]:
        merged.merge(Moments.of(torch.from_numpy(part)))
    x = np.concatenate(parts)
    d = x - x.mean()
    assert merged.n == len(x) and merged.mean == pytest.approx(x.mean(), rel=1e-12)
    for got, power in ((merged.m2, 2), (merged.m3, 3), (merged.m4, 4)):
        assert got == pytest.approx(float((d**power).sum()), rel=1e-9), power
    constant = LayerStats()
    for _ in range(3):
        constant.add_hidden(torch.full((5,), 10_000.1, dtype=torch.float32))
    assert math.isnan(constant.means()["kurtosis"])
