"""The figures say what they show: axes carry the probe's variable and unit (from the probe kind's
own declaration), bounded metrics sit on a fixed 0–1 axis when two models are compared, no y axis
prints an offset ("1e-9", "+0.8") over its title, the heatmaps show the level where the probe acts,
and no panel is drawn empty. Inspected on the matplotlib Figure objects the public figure
functions return (drawn once, so tick and offset texts exist), on hand-written results."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ssacli.diagnosis.metrics import METRICS
from ssacli.diagnosis.probe_kinds import PROBES
from ssacli.report.before_after import trajectory_figure, trajectory_notes
from ssacli.report.figures import compare_figure, heatmap_figure, line_figure, overview_figure
from ssacli.report.summary import heatmap_level_text
from tests.helpers.report_fixtures import probe_result, result_a, result_b


def drawn(fig):
    fig.savefig(io.BytesIO(), format="png", dpi=50)
    return fig


def metric_of(ax) -> str:
    return ax.get_title().split(" ")[0]


def test_every_probe_kind_declares_its_axis():
    """The variable and unit the figures print (one owner: the probe kind)."""
    expected = {"embed-scale": "σ", "outlier": "σ", "key-scale": "σ", "logit-scale": "α", "dominant-key": "M",
                "length": "tokens", "numeric": "digits", "shift": "corpus"}  # fmt: skip
    for name, kind in PROBES.items():
        assert expected[name] in kind.axis, (name, kind.axis)


def test_line_figure_labels_the_probe_variable_the_layers_and_no_offset():
    probe = result_a().probe("embed-scale")
    fig = drawn(line_figure(probe))
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert panels and all(ax.get_xlabel() == "σ (input embeddings × σ)" for ax in panels)
    assert any(ax.get_ylabel() == "layer" for ax in fig.axes)  # the colour bar names the layer lines
    assert fig.legends and "model mean" in fig.legends[0].texts[0].get_text()
    for ax in panels:
        assert ax.yaxis.get_offset_text().get_text() == "", ax.get_title()
        if metric_of(ax) in METRICS and METRICS[metric_of(ax)].bounded:
            assert ax.get_ylim() == pytest.approx((-0.02, 1.02))


def test_comparison_figure_puts_bounded_metrics_on_0_to_1():
    """A difference of 0.78 vs 0.84 is drawn as the small difference it is (it filled the axis)."""
    pa, pb = result_a().probe("embed-scale"), result_b().probe("embed-scale")
    fig = drawn(compare_figure(pa, pb, "A: x", "B: y"))
    panels = [ax for ax in fig.axes if ax.get_title()]
    bounded = [ax for ax in panels if METRICS[metric_of(ax)].bounded]
    assert {metric_of(ax) for ax in bounded} >= {"entropy", "max_weight", "collapse_rate"}
    for ax in bounded:
        assert ax.get_ylim() == pytest.approx((-0.02, 1.02)), ax.get_title()
    for ax in panels:
        assert ax.get_xlabel() == PROBES["embed-scale"].axis
        assert ax.yaxis.get_offset_text().get_text() == ""
    labels = [t.get_text() for t in fig.legends[0].texts]
    assert labels == ["A: x", "B: y"]


def test_heatmaps_show_the_collapse_point_or_the_harshest_level():
    """embed-scale collapses at σ=4 (its collapse rate rows, report_fixtures): the heatmaps show σ=4;
    a probe that never collapses shows its harshest level. Cell values are at least 8 pt."""
    result = result_a()
    fig = drawn(heatmap_figure(result.probe("embed-scale")))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert "collapse_rate at σ=4" in titles and "max_weight at σ=4" in titles
    assert (
        heatmap_level_text(result.probe("embed-scale")) == "embed-scale: heatmaps at σ=4 (its collapse point)"
    )
    cells = [t for ax in fig.axes for t in ax.texts]
    assert cells and min(t.get_fontsize() for t in cells) >= 8
    assert ".93" in {t.get_text() for t in cells}  # layer 1 head 2's max weight at σ=4
    calm = probe_result("outlier", [1, 10, 100], np.zeros((3, 2, 3)), np.full((3, 2, 3), 0.3))
    fig = drawn(heatmap_figure(calm))
    assert "max_weight at σ=100" in [ax.get_title() for ax in fig.axes]


def test_overview_figure_has_a_row_per_live_probe_and_a_cell_per_layer():
    result = result_a()  # embed-scale collapses at σ=4 in both layers; outlier never; numeric skipped
    fig = drawn(overview_figure(result))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["embed-scale", "outlier"]
    assert ax.get_xlabel() == "layer"
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("σ=4") == 2 and texts.count("never") == 2


def trajectory(kl: bool) -> list[dict]:
    return [{"step": s, "loss": 3.0 - 0.1 * s, "heldout_loss": 3.1 - 0.1 * s,
             "kl_to_source": 1e-3 * s if kl else None, "scorer": {"n": [4.0 - s, 4.0], "b": [0.25, 0.25]}}
            for s in range(3)]  # fmt: skip


def test_trajectory_figure_draws_no_empty_kl_panel():
    titles = [ax.get_title() for ax in drawn(trajectory_figure(trajectory(kl=False))).axes if ax.get_title()]
    assert titles == ["loss", "SSA n per layer", "SSA b per layer"]
    assert trajectory_notes(trajectory(kl=False)) == [
        "no KL to the source model was recorded (not a language model, or no source)"
    ]
    titles = [ax.get_title() for ax in drawn(trajectory_figure(trajectory(kl=True))).axes if ax.get_title()]
    assert "KL to the source model" in titles and trajectory_notes(trajectory(kl=True)) == []
