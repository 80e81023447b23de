"""The position terms of the row statistics (ssacli.kernels.positions): their bins by hand, and every
producer (the torch block math, the native row pass, the one-loop native kernel) against the eager
reference, weight_statistics on float64 weights of the same float32 inputs."""

from __future__ import annotations

import math

import pytest
import torch

from ssacli.kernels import native
from ssacli.kernels.online_stats import softmax_statistics
from ssacli.kernels.positions import PositionBins, distance_bin_of, visible_per_bin
from ssacli.kernels.row_stats import weight_statistics
from ssacli.kernels.stats_call import StatisticsCall

# float32 logits against float64 ones: a weight's relative error is ~|x|·6e-8 (|x| up to ~60 here, the
# dominant key), so a share of a row is within 1e-6 absolute, and within 1e-5 relative where it is
# above 1e-3 (measured: 4e-7 and 4e-6 at most; the mean distance 9e-7 relative)
# A share sums up to 40 (the longest row here) float32 weights, each within float32 rounding of the
# eager reference's, which is float32 too and computed with whatever sgemm the CPU has (MKL's SSE4.2
# one differs from its AVX-512 one by 2e-6 here): 40 roundings apart at most. A wrong bin moves a
# share by a whole weight, about 1/40.
ABS, RTOL = 40 * torch.finfo(torch.float32).eps, 1e-5


def test_bins_by_hand():
    bins = PositionBins(sink_k=2, bin_width=3)
    assert bins.key_bins(9) == 1 + 3 and bins.key_edges(9) == [0, 2, 5, 8, 9]
    assert bins.key_bin_of(torch.arange(9)).tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert PositionBins.distance_bins(9) == 5 and PositionBins.distance_edges(9) == [0, 1, 2, 4, 8, 9]
    assert distance_bin_of(torch.tensor([0, 1, 2, 3, 4, 7, 8, 15, 16])).tolist() == [
        0,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
        5,
    ]
    assert bins.key_bins(1) == 1 and bins.key_bins(2) == 1 and bins.key_bins(3) == 2
    with pytest.raises(ValueError):
        PositionBins(0, 4)


def test_weight_statistics_terms_by_hand():
    """One causal row at position 5 over six keys with weights w: every term computed by hand."""
    w = torch.tensor([0.4, 0.1, 0.05, 0.05, 0.1, 0.3], dtype=torch.float64).reshape(1, 1, 1, 6)
    bins = PositionBins(sink_k=1, bin_width=2)  # key bins {0}, {1, 2}, {3, 4}, {5}
    stats = weight_statistics(w, positions=bins, query_positions=torch.tensor([5]))
    share = (stats.key_mass / stats.total[..., None]).flatten().tolist()
    assert share == pytest.approx([0.4, 0.15, 0.15, 0.3], rel=1e-12)
    # distances 5, 4, 3, 2, 1, 0: bins 0 {0}, 1 {1}, 2 {2, 3}, 3 {4, 5}
    dist = (stats.distance_mass / stats.total[..., None]).flatten().tolist()
    assert dist == pytest.approx([0.3, 0.1, 0.1, 0.5], rel=1e-12)
    mean = float(stats.distance_sum / stats.total)
    assert mean == pytest.approx(0.4 * 5 + 0.1 * 4 + 0.05 * 3 + 0.05 * 2 + 0.1 * 1, rel=1e-12)
    assert stats.key_visible.flatten().tolist() == [1, 2, 2, 1]


def test_visible_per_bin_from_the_band_equals_the_mask():
    bins = PositionBins(sink_k=3, bin_width=4)
    positions = torch.arange(5, 20)
    keys = torch.arange(20)
    for window in (None, 6):
        shown = keys[None] <= positions[:, None]
        if window is not None:
            shown &= positions[:, None] - keys[None] < window
        from_band = visible_per_bin(bins, 20, positions, causal=True, window=window)
        from_mask = visible_per_bin(bins, 20, positions, mask=shown[None, None])
        assert torch.equal(from_band, from_mask)
    every = visible_per_bin(bins, 20, positions)
    assert every[0, 0, 0].tolist() == [3, 4, 4, 4, 4, 1]


def _shares(stats):
    total = stats.total
    return {
        "key": stats.key_mass / total[..., None],
        "distance": stats.distance_mass / total[..., None],
        "mean_distance": stats.distance_sum / total,
    }


def _call_case(causal, window, q_len, k_len, masked, seed=5):
    gen = torch.Generator().manual_seed(seed)
    b, heads, kv_heads, d, scaling = 2, 4, 2, 8, 0.5
    q = torch.randn(b, heads, q_len, d, generator=gen) * 2
    k = torch.randn(b, kv_heads, k_len, d, generator=gen)
    k[1, :, k_len - q_len + 1] *= 30.0  # a dominant key: rows that see it collapse onto it
    v = torch.randn(b, kv_heads, k_len, d, generator=gen)
    pos = torch.arange(k_len - q_len, k_len)[:, None]
    keys = torch.arange(k_len)[None]
    shown = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal:
        shown &= keys <= pos
    if window is not None:
        shown &= pos - keys < window
    shown = shown.expand(b, 1, q_len, k_len).clone()
    if masked:
        shown[0, :, :, :2] = False  # left padding of sample 0: its first two keys hidden
    logits = (q.double() @ k.repeat_interleave(2, 1).double().transpose(-1, -2)) * scaling
    weights = torch.softmax(logits.masked_fill(~shown, -math.inf), -1).nan_to_num(0.0)
    return q, k, v, scaling, shown, weights


@pytest.mark.parametrize(
    "causal,window,q_len,k_len,masked",
    [(True, None, 37, 37, False), (True, 9, 37, 37, False), (False, None, 30, 30, False),
     (True, 12, 7, 40, False), (True, None, 33, 33, True)],
    ids=["causal", "window", "non-causal", "kv-offset-window", "mask"],
)  # fmt: skip
def test_every_producer_equals_the_eager_reference(causal, window, q_len, k_len, masked):
    bins = PositionBins(sink_k=3, bin_width=5)
    q, k, v, scaling, shown, weights = _call_case(causal, window, q_len, k_len, masked)
    want = weight_statistics(weights, shown, positions=bins)
    mask = shown if masked else None
    band = dict(causal=causal, window=window) if mask is None else {}
    call = StatisticsCall(scaling=scaling, mask=mask, positions=bins, **band)
    runs = {}
    blocks = dict(block_rows=7, block_keys=13)
    runs["torch"] = softmax_statistics(q, k, v, call, **blocks, backend="torch-blocks")[1]
    if native.available():
        runs["row pass"] = softmax_statistics(q, k, v, call, **blocks, backend="native-blocks")[1]
        threads = torch.get_num_threads()
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                runs[f"one loop/{n}"] = softmax_statistics(q, k, v, call, block_rows=7, block_keys=13)[1]
        finally:
            torch.set_num_threads(threads)
    expect = _shares(want)
    seen = want.total > 0
    for path, got in runs.items():
        assert got.positions == bins
        assert torch.equal(got.key_visible.expand_as(want.key_visible), want.key_visible), path
        for name, have in _shares(got).items():
            ref = expect[name]
            rows = (seen if have.dim() == 3 else seen[..., None]).expand_as(ref)
            gap = (have - ref).abs()[rows]
            if name != "mean_distance":  # shares of a row: within float32 rounding of the largest weight
                assert float(gap.max()) < ABS, (path, name)
            large = ref[rows].abs() > 1e-3
            assert float((gap / ref[rows].abs())[large].max()) < RTOL, (path, name)
        # the bins partition the row: each sums to l
        assert torch.allclose(got.key_mass.sum(-1)[seen], got.total[seen], rtol=1e-6)
        assert torch.allclose(got.distance_mass.sum(-1)[seen], got.total[seen], rtol=1e-6)


def test_without_positions_nothing_is_measured():
    q, k, v, scaling, _, weights = _call_case(True, None, 9, 9, False)
    _, stats = softmax_statistics(q, k, v, StatisticsCall(scaling=scaling, causal=True))
    assert stats.positions is stats.key_mass is stats.distance_mass is stats.distance_sum is None
    assert weight_statistics(weights).key_mass is None


def test_a_broken_row_has_nan_terms_as_its_total():
    q, k, v, scaling, _, _ = _call_case(True, None, 9, 9, False)
    q[0, 0, 4] = math.inf
    call = StatisticsCall(scaling=scaling, causal=True, positions=PositionBins(2, 3))
    for backend in ("auto", "torch-blocks"):
        _, stats = softmax_statistics(q, k, v, call, block_rows=4, block_keys=5, backend=backend)
        broken = ~torch.isfinite(stats.total)
        assert broken.any()
        assert not torch.isfinite(stats.key_mass[broken]).any()
        assert not torch.isfinite(stats.distance_sum[broken]).any()
