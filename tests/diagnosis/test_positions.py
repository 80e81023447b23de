"""The sink and position metrics derived from the row statistics (row_sums, HeadStats, the profiles
and head classes), by hand and through ssacli.diagnose on both statistics paths."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import ssacli
from ssacli import defaults
from ssacli.diagnosis.metrics import POSITION_METRICS
from ssacli.diagnosis.positions import PositionProfiles, head_class, run_bins
from ssacli.diagnosis.row_metrics import HeadStats, row_sums
from ssacli.kernels.positions import PositionBins
from ssacli.kernels.row_stats import weight_statistics
from tests.helpers.cli import run_main
from tests.helpers.result_schema import schema_errors


def _causal_weights() -> torch.Tensor:
    """Two heads over 4 causal rows: head 0 puts 0.7 on key 0 and the rest on the query's own key,
    head 1 is uniform over what each row sees."""
    w = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    for i in range(4):
        w[0, 1, i, : i + 1] = 1.0 / (i + 1)
        w[0, 0, i, 0] = 0.7 if i else 1.0
        if i:
            w[0, 0, i, i] = 0.3
    return w


def test_row_sums_by_hand():
    bins = PositionBins(sink_k=1, bin_width=2)  # key bins {0}, {1, 2}, {3}
    w = _causal_weights()
    visible = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    stats = HeadStats(2)
    stats.add(row_sums(weight_statistics(w, visible, positions=bins), local_distance=2))
    means = stats.means()
    # rows 1..3 count (row 0 has one key); head 0: share on key 0 is 0.7 in each
    assert means["sink_share"] == pytest.approx([0.7, (1 / 2 + 1 / 3 + 1 / 4) / 3], rel=1e-12)
    uniform = (1 / 2 + 1 / 3 + 1 / 4) / 3  # what uniform weights put on key 0
    assert means["sink_boost"] == pytest.approx([0.7 / uniform, 1.0], rel=1e-12)
    # local: distance < 2 (d = 0, 1): head 0's own-key 0.3 plus row 1's key 0 (d = 1)
    assert means["local_share"][0] == pytest.approx((1.0 + 0.3 + 0.3) / 3, rel=1e-12)
    assert means["attention_distance"][0] == pytest.approx((0.7 * 1 + 0.7 * 2 + 0.7 * 3) / 3, rel=1e-12)
    profiles = stats.profiles()
    # head 1 is uniform: every key bin receives exactly its uniform share
    assert profiles["received_boost"][1] == pytest.approx([1.0, 1.0, 1.0], rel=1e-12)
    assert profiles["received"][0] == pytest.approx([0.7, 0.2, 0.1], rel=1e-12)  # 0.3 on keys 1, 2, 3
    assert profiles["distance_profile"][0].sum() == pytest.approx(1.0, rel=1e-12)


def test_sums_of_calls_of_different_lengths_add_bin_by_bin():
    bins = PositionBins(sink_k=1, bin_width=1)
    stats = HeadStats(1)
    for k in (3, 6):
        w = torch.full((1, 1, 1, k), 1.0 / k, dtype=torch.float64)
        stats.add(row_sums(weight_statistics(w, positions=bins)))
    half = (1 / 3 + 1 / 6) / 2  # a mean over the two rows: the short call's keys get both rows' share
    assert stats.profiles()["received"][0] == pytest.approx([half] * 3 + [1 / 12] * 3)


def test_not_measured_reads_nan_not_zero():
    stats = HeadStats(2)
    stats.add(row_sums(weight_statistics(_causal_weights())))
    means = stats.means()
    for name in POSITION_METRICS:
        assert np.isnan(means[name]).all(), name
    assert stats.profiles() is None


def test_head_classes_follow_the_stated_thresholds():
    assert head_class(defaults.CLASS_SINK_SHARE, 0.9, 0.1) == "sink"
    assert head_class(0.1, defaults.CLASS_LOCAL_SHARE, 0.1) == "local"
    assert head_class(0.1, 0.1, defaults.CLASS_FOCUSED_ENTROPY) == "focused"
    assert head_class(0.1, 0.1, 0.9) == "distributed"
    assert head_class(math.nan, 0.1, 0.9) is None


def test_run_bins_cover_the_length_in_position_bins():
    bins = run_bins(8192, 4)
    assert bins.bin_width == 128 and bins.key_bins(8192) == 1 + defaults.POSITION_BINS
    assert run_bins(10, 4).bin_width == 1


@pytest.fixture(scope="module")
def both_paths():
    kwargs = dict(probes=["logit-scale:1,8"], samples=2, length=24, sink_k=2)
    return {
        stats: ssacli.diagnose("builtin:every-softmax", stats=stats, **kwargs) for stats in ("eager", "fused")
    }


def test_diagnose_measures_them_and_both_paths_agree(both_paths):
    eager, fused = both_paths["eager"], both_paths["fused"]
    assert fused.settings["stats_calls"]["fused"] > 0 and eager.settings["sink_k"] == 2
    for name in POSITION_METRICS:
        a, b = fused.probes[0].metrics[name], eager.probes[0].metrics[name]
        assert np.isfinite(b).any() and np.array_equal(np.isnan(a), np.isnan(b)), name
        scale = np.maximum(1.0, np.abs(np.nan_to_num(b)))
        assert np.nanmax(np.abs(a - b) / scale) < 1e-6, name
    pa, pb = fused.position_profiles(), eager.position_profiles()
    assert pa.key_edges == pb.key_edges and pa.sink_k == 2 and pa.level == 1.0
    for name in ("received", "received_boost", "distance"):
        x, y = getattr(pa, name), getattr(pb, name)
        scale = np.maximum(1.0, np.abs(np.nan_to_num(y)))
        assert np.nanmax(np.abs(x - y) / scale) < 1e-6, name
    assert pa.classes == pb.classes


def test_sink_k_1_is_the_first_token_weight(both_paths):
    """sink_mass (p at key 0, from the statistics' first t) and sink_share with k = 1 (key bin 0 of
    the position terms) are one number computed two ways."""
    result = ssacli.diagnose(
        "builtin:every-softmax", probes=["logit-scale:1"], samples=2, length=24, sink_k=1
    )
    metrics = result.probes[0].metrics
    assert np.allclose(metrics["sink_share"], metrics["sink_mass"], rtol=1e-6, atol=1e-9, equal_nan=True)


def test_json_schema_and_round_trip(both_paths):
    result = both_paths["fused"]
    document = json.loads(result.to_json())
    assert schema_errors(document) == []
    profiles = document["positions"]
    assert profiles["sink_k"] == 2 and set(profiles["class_counts"]) == {
        "sink",
        "local",
        "focused",
        "distributed",
    }
    back = ssacli.DiagnoseResult.from_dict(document)
    assert back.position_profiles().to_dict() == result.position_profiles().to_dict()
    # an older file without it still reads: not measured, not zero
    del document["positions"]
    assert ssacli.DiagnoseResult.from_dict(document).position_profiles() is None


def test_secondary_sinks_are_the_most_received_bins_past_the_first_k():
    received = np.array([[[0.5, 0.1, 0.3, 0.05, np.nan]]])
    profiles = PositionProfiles("p", 1.0, 2, 3, [0, 2, 5, 8, 11, 14], [0, 1, 2], received, received * 2,
                                np.zeros((1, 1, 2)), [["sink"]])  # fmt: skip
    sinks = profiles.secondary_sinks(2)[0][0]
    assert [s["keys"] for s in sinks] == [[5, 8], [2, 5]]
    assert sinks[0]["share"] == pytest.approx(0.3) and sinks[0]["boost"] == pytest.approx(0.6)


def test_the_cli_takes_sink_k_and_reports_where_attention_lands(monkeypatch, capsys, tmp_path):
    """``ssacli diagnose --sink-k 3`` at 80 columns: the section, its legend, the JSON's setting."""
    out = tmp_path / "out.json"
    monkeypatch.setenv("COLUMNS", "80")
    args = ["diagnose", "builtin:every-softmax", "--probe", "logit-scale:1", "--samples", "1",
            "--sink-k", "3", "--json", str(out)]  # fmt: skip
    code, stdout, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    assert "where attention lands" in stdout and "first k = 3" in stdout and "head classes" in stdout
    # (the "wrote PATH" line excepted: xdist's temporary paths are longer)
    assert max(len(line) for line in stdout.splitlines() if not line.startswith("wrote ")) <= 80
    document = json.loads(out.read_text())
    assert document["settings"]["sink_k"] == 3 and document["positions"]["sink_k"] == 3
    code, _, stderr = run_main([*args[:-2], "--sink-k", "0"], monkeypatch, capsys)
    assert code != 0
