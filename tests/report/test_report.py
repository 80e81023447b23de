"""Reports of a diagnose result: terminal text, the HTML page, the comparison dict, the JSON schema.

The results are built from small hand-written arrays (tests/helpers/report_fixtures.py: 2 layers × 3
heads), so every expected number below (model means, collapse points, B − A deltas) is worked out
from those arrays, not read back from the code under test.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest
from rich.console import Console

from ssacli.diagnosis.comparison import compare_results
from ssacli.diagnosis.result import DiagnoseResult
from ssacli.errors import UsageError
from ssacli.report.html import Section, comparison_html, diagnose_html, page
from ssacli.report.summary import pick_heatmap
from ssacli.report.terminal import render_comparison, render_diagnose
from ssacli.report.terminal_layout import heat_cell
from tests.helpers.report_fixtures import (
    NAN,
    SKIP_NOTE,
    diagnose_result,
    probe_result,
    result_a,
    result_b,
    wide_result,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _render(fn, *args, **kwargs) -> str:
    console = Console(record=True, width=160, color_system=None, file=io.StringIO())
    fn(*args, console, **kwargs)
    return console.export_text()


# ---- terminal --------------------------------------------------------------------------------------


def test_terminal_report_shows_collapse_points_heatmap_and_skip_note():
    text = _render(render_diagnose, result_a(), top=3)
    assert "embed-scale · model means · collapse point 4" in text
    assert "outlier · model means · collapse point none" in text
    assert "embed-scale: 4; outlier: none; numeric: skipped" in text  # the summary panel
    assert f"numeric: skipped — {SKIP_NOTE}" in text
    assert "tiny<gpt>&co" in text and "2 × 3" in text
    # The heatmap defaults to embed-scale (last-level mean max weight 0.705 > outlier's 0.3), at
    # its collapse point σ=4, where the probe acts (not level 2, where the heads differ most).
    assert "heatmap: max_weight, probe embed-scale at σ=4 (its collapse point)" in text
    assert "max_weight per head · embed-scale at σ=4" in text  # the grid's own title
    heat_rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [".55", ".60", ".65"] in [row[1:] for row in heat_rows]
    assert [".70", ".80", ".93"] in [row[1:] for row in heat_rows]
    # Per-head collapse points: layer 0 collapses at 4, layer 1 heads 0-1 at 4, head 2 at baseline.
    cells = [row[1:] for row in heat_rows]
    assert ["4", "4", "4"] in cells and ["4", "4", "B"] in cells
    assert "collapsed at baseline (not counted in its collapse point): L1H2" in text
    # outlier_capture gets a column only where it is defined; row mass is 1 everywhere: no column.
    assert text.count("capture") == 1  # the outlier table's header
    assert "row mass" not in text
    assert "loss" in text
    # Most saturated, each probe at its most different level, baseline-collapsed heads left out:
    # embed-scale 2 layer 1 heads 0, 1 (0.4), then outlier 100 (0.3 everywhere) layer 0 head 0.
    table = text[text.index("most saturated heads") :]
    probes = (["embed-scale"], ["outlier"])
    heads = [line.split()[:5] for line in table.splitlines() if line.split()[:1] in probes]
    assert heads == [
        ["embed-scale", "2", "1", "0", "0.4"],
        ["embed-scale", "2", "1", "1", "0.4"],
        ["outlier", "100", "0", "0", "0.3"],
    ]


def test_heatmap_of_another_metric_and_probe():
    text = _render(render_diagnose, result_a(), heatmap_metric="outlier_capture", heatmap_probe="outlier")
    # outlier never collapses: the heatmap shows its harshest level and says why
    caption = "heatmap: outlier_capture, probe outlier at σ=100 (its harshest level; no model-level collapse"
    assert caption in text
    heat_rows = [line.split() for line in text.splitlines() if line.split()[:1] == ["1"]]
    assert [".40", ".40", ".40"] in [row[1:] for row in heat_rows]


def test_heatmap_choice_errors():
    result = result_a()
    with pytest.raises(UsageError, match="unknown heatmap metric"):
        pick_heatmap(result, "nope", None)
    with pytest.raises(UsageError, match=SKIP_NOTE):
        pick_heatmap(result, "max_weight", "numeric")
    with pytest.raises(UsageError, match="no probe"):
        pick_heatmap(result, "max_weight", "absent")


def test_heatmap_colors_only_where_color_is_allowed():
    """Cells carry a background color on a color terminal and none under NO_COLOR, where the
    printed values alone must tell the story."""
    outputs = {}
    for no_color in (False, True):
        file = io.StringIO()
        console = Console(
            file=file, width=160, force_terminal=True, color_system="truecolor", no_color=no_color
        )
        render_diagnose(result_a(), console)
        outputs[no_color] = file.getvalue()
    assert "48;2;" in outputs[False]  # 24-bit background
    assert "48;2;" not in outputs[True] and ".55" in outputs[True]


def test_heat_cell_format():
    assert heat_cell(0.93) == ".93"
    assert heat_cell(0.0) == ".00"
    assert heat_cell(0.996) == "1.0"  # not ".00": rounding up to 1 keeps the leading digit
    assert heat_cell(12.34) == "12.3"
    assert heat_cell(NAN) == "·"


def test_terminal_comparison_on_common_levels():
    text = _render(render_comparison, result_a(), result_b())
    assert "embed-scale · collapse point A 4 → B 8" in text
    assert "outlier · collapse point A none → B none" in text
    assert "numeric: skipped in A and B" in text
    rows = {
        line.split()[0]: line.split()
        for line in text.splitlines()
        if line.split()[:1] in (["1"], ["2"], ["4"], ["8"])
    }
    assert "8" not in rows  # B's extra level is not compared
    # columns: level, entropy A/B/Δ, max_w A/B/Δ, collapse A/B/Δ; collapse Δ by hand: -0.1, -0.15, -0.25
    assert [rows[level][9] for level in ("1", "2", "4")] == ["-0.100", "-0.150", "-0.250"]
    # max weight at level 4: A mean (0.55+0.6+0.65+0.7+0.8+0.93)/6 = 0.705, B 0.5 -> Δ -0.205
    assert rows["4"][4:7] == ["0.705", "0.500", "-0.205"]


# ---- comparison dict ---------------------------------------------------------------------------------


def test_compare_results_deltas_by_hand():
    data = compare_results(result_a(), result_b())
    json.dumps(data, allow_nan=False)  # no NaN may leak into the JSON
    assert data["schema"] == "ssacli-diagnose-comparison" and data["schema_version"] == 2
    assert set(data["deltas"]) == {"embed-scale", "outlier"}  # numeric is skipped in both
    embed = data["deltas"]["embed-scale"]
    assert embed["levels"] == [1.0, 2.0, 4.0]
    assert embed["collapse_rate"] == pytest.approx([-0.1, -0.15, -0.25])
    # A max-weight means: 0.2, 0.45, 0.705; B: 0.1, 0.3, 0.5
    assert embed["max_weight"] == pytest.approx([-0.1, -0.15, -0.205])
    assert embed["entropy"] == pytest.approx([0.1, 0.15, 0.205])
    assert embed["outlier_capture"] == [None, None, None]  # undefined for embed-scale on both sides
    outlier = data["deltas"]["outlier"]
    # level 0: B's mean skips the NaN head: (0.4 * 5) / 5 = 0.4 against A's 0.1
    assert outlier["max_weight"] == pytest.approx([0.3, 0.0, 0.0])
    assert outlier["outlier_capture"] == pytest.approx([0.0, 0.0, 0.0])
    assert data["collapse_points"] == {
        "embed-scale": {"a": 4.0, "b": 8.0},
        "outlier": {"a": None, "b": None},
    }
    assert DiagnoseResult.from_dict(data["b"]).probe("embed-scale").levels == [1.0, 2.0, 4.0, 8.0]


def test_comparison_findings_by_hand():
    """A -> B (report_fixtures): A's layer 1 head 2 is collapsed at level 1 (0.6), B has no such head;
    the collapse point moves 4 -> 8 (every layer alike, so no per-layer finding); at the common
    levels the collapse-rate means move -0.1, -0.15, -0.25 (most at 4: 0.6 -> 0.35, max weight
    0.705 -> 0.5); outlier's collapse rates are equal, its max weight moves most at level 0. What the
    shift did to each: A's fresh heads (L1H2 left out) go from 0 at σ=1 to (.5+.5+.5+.6+.7)/5 = .56
    at σ=4, +56 points; B's from 0 to .35, +35."""
    data = compare_results(result_a(), result_b())
    found = data["findings"]
    assert [f["kind"] for f in found] == [
        "baseline_collapse_change", "collapse_change", "shift_change",
        "saturation_change", "saturation_change",
    ]  # fmt: skip
    base, point, shift, embed, outlier = found
    changed = "embed-scale σ=4: collapse +56.0 points from the unshifted σ=1 in A → +35.0 in B"
    assert shift["text"].startswith(changed)
    assert (base["a"], base["b"], base["heads_a"], base["heads_b"]) == (1, 0, [[1, 2]], [])
    assert base["text"] == "heads collapsed before any shift: 1 → 0 of 6 (A: L1H2; B: none)"
    assert (point["level_a"], point["level_b"], point["a"], point["b"]) == (4.0, 8.0, "4", "8")
    assert point["text"] == "embed-scale collapse point: σ=4 in A → σ=8 in B"
    assert embed["level"] == 4.0 and embed["collapse_rate"] == pytest.approx({"a": 0.6, "b": 0.35})
    assert embed["max_weight"] == pytest.approx({"a": 0.705, "b": 0.5})
    assert embed["text"].startswith("embed-scale σ=4: collapse 60% → 35%, max weight 0.70 → 0.50 (B less")
    assert outlier["level"] == 0.0 and outlier["max_weight"] == pytest.approx({"a": 0.1, "b": 0.4})
    assert outlier["text"].endswith("(B more saturated)")


def test_per_layer_points_and_head_spread_by_hand():
    probe = result_a().probe("embed-scale")
    # layer 0: mean .0 .2 .5 -> 4; layer 1 without the baseline head 2: .0 .4 .65 -> 4
    assert probe.layer_collapse_points() == [4.0, 4.0]
    # level 2, the five heads not collapsed at baseline: .2 .2 .2 .4 .4, std sqrt(.0096)
    assert probe.head_spread()["collapse_rate"][1] == pytest.approx(math.sqrt(0.0096), abs=1e-9)
    summary = json.loads(result_a().to_json())["probes"][0]["summary"]
    assert summary["layer_collapse_points"] == [4.0, 4.0] and summary["most_different_level"] == 2.0
    text = _render(render_diagnose, result_a())
    assert (
        "collapse point per layer: layers 0–1 at 4 · per head: first at 4 (L0H0, L0H1, L0H2, L1H0 +1 more)"
        in text
    )


# ---- HTML ---------------------------------------------------------------------------------------------


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.sources.append(attrs.get("src", ""))
        for key in ("src", "href"):
            if (attrs.get(key) or "").startswith(("http:", "https:", "//")):
                self.external.append(attrs[key])


def _check_images(page: str, expected: int) -> None:
    parser = _Images()
    parser.feed(page)
    assert parser.external == []
    assert len(parser.sources) == expected
    for src in parser.sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1], validate=True)[:8] == PNG_MAGIC


def test_diagnose_html_is_self_contained():
    page = diagnose_html(result_a())
    _check_images(page, expected=5)  # the overview, 2 figures (lines, heatmaps) per non-skipped probe
    assert "tiny&lt;gpt&gt;&amp;co" in page and "<gpt>" not in page
    assert SKIP_NOTE in page
    assert "collapse point: <b>4</b>" in page and "collapse point: <b>none</b>" in page
    assert "<link" not in page and "<script" not in page
    assert "&quot;tau&quot;: 0.9" in page  # settings in the footer's JSON block
    assert len(page) < 2_000_000


def test_comparison_html_overlays_and_deltas():
    page = comparison_html(result_a(), result_b())
    _check_images(page, expected=2)  # one overlay figure per probe shared and live in both
    assert "<th>A</th><td>tiny&lt;gpt&gt;&amp;co · softmax</td>" in page  # once "A: A: tiny…"
    assert "<th>B</th><td>other · ssa</td>" in page and "A: A:" not in page
    assert "<td>-0.25</td>" in page.replace(' class="better"', "")
    assert "skipped in A and B" in page


def test_pages_are_built_from_sections_in_order():
    sections = [Section("title <1>", ["<p>a</p>"], level=1), Section(None, ["<p>b</p>"]), Section("c & d")]
    built = page("tab & title", sections)
    assert "<title>tab &amp; title</title>" in built
    body = built[built.index("<body>") : built.index("</body>")]
    assert body.index("<h1>title &lt;1&gt;</h1>") < body.index("<p>a</p>") < body.index("<p>b</p>")
    assert body.index("<p>b</p>") < body.index("<h2>c &amp; d</h2>")


def test_importing_the_plotting_modules_selects_no_matplotlib_backend():
    """No import-time side effects: the renderers draw on Figure objects, never through pyplot."""
    code = (
        "import sys, matplotlib, ssacli.report.html, ssacli.report.before_after, ssacli.report.plots\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "print(matplotlib.get_backend())\n"
    )
    env = {**os.environ, "MPLBACKEND": "template"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().lower() == "template"


# ---- JSON schema -----------------------------------------------------------------------------------


def test_json_round_trip_keeps_nan_and_collapse_points():
    original = result_b()
    text = original.to_json()  # allow_nan=False inside: NaN must have become null
    loaded = DiagnoseResult.from_dict(json.loads(text))
    assert loaded.collapse_points() == original.collapse_points() == {"embed-scale": 8.0, "outlier": None}
    for before, after in zip(original.probes, loaded.probes):
        assert after.name == before.name and after.levels == before.levels and after.note == before.note
        assert after.skipped == before.skipped
        assert after.rows.tolist() == before.rows.tolist()
        for name, values in before.metrics.items():
            np.testing.assert_array_equal(after.metrics[name], values)  # NaN == NaN here
    assert math.isnan(loaded.probe("outlier").metrics["max_weight"][0, 0, 0])
    assert loaded.probe("numeric").skipped and loaded.probe("numeric").note == SKIP_NOTE
    a = DiagnoseResult.from_dict(result_a().to_dict())
    assert a.probe("embed-scale").extras == {"loss": [3.0, 3.5, None]}
    assert a.most_saturated(3) == result_a().most_saturated(3)


# ---- 80 columns ------------------------------------------------------------------------------------


def test_every_table_reads_at_80_columns_without_truncation():
    """A fixed 80-column console: no cell is cut to '…', no line is longer than 80; wide tables split
    (the level column repeats) rather than drop columns."""
    a, b = wide_result("a"), result_b()
    texts = [
        _render80(render_diagnose, a),
        _render80(render_diagnose, result_a()),
        _render80(render_comparison, result_a(), b),
        _render80(render_comparison, a, wide_result("b")),
    ]
    for text in texts:
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= 80
    # every column of the wide probe table is there, split over two tables
    first = texts[0]
    for header in (
        "entropy",
        "max w",
        "collapse",
        "eff. tok",
        "top-k",
        "sink",
        "capture",
        "row mass",
        "logit rms ×",
        "loss",
        "error",
    ):
        assert header in first, header
    assert first.count(" level") >= 2
    assert "0.000123" in first and "13.25" in first  # (12.5 + 14) / 2


def _render80(fn, *args, **kwargs) -> str:
    console = Console(record=True, width=80, color_system=None, file=io.StringIO())
    fn(*args, console, **kwargs)
    return console.export_text()


def _length_probe(layer1_slope: float):
    """Length probe at n = 64, 128: layer 0's max weight falls by 0.1 per doubling (entropy rises,
    entropy = 1 - max weight), layer 1's rises by ``layer1_slope`` (entropy falls by it)."""
    max_weight = [[[0.5] * 3, [0.5] * 3], [[0.4] * 3, [0.5 + layer1_slope] * 3]]
    collapse = [[[0.0] * 3] * 2] * 2
    return probe_result("length", [1, 2], collapse, max_weight, extras={"tokens": [64, 128]})


def test_fading_finding_names_only_layers_that_fade_at_the_precision_shown():
    def fading_text(slope):
        (line,) = [
            f["text"]
            for f in diagnose_result([_length_probe(slope)]).findings()
            if "per doubling" in f["text"]
        ]
        return line

    # layer 1's entropy falls 0.05 per doubling: named with its slope (by hand: -0.050)
    assert "fastest in layers 1 (-0.050)" in fading_text(0.05)
    # falls by 0.0001, which prints as -0.000: noise at the precision shown, not named
    assert "fastest" not in fading_text(0.0001)
