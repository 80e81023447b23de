"""Results in a notebook (issue 42, item 2): ``_repr_html_`` of DiagnoseResult, QualityReport and
CheckReport (verdict first, the rest folded, the page's CSS scoped to the output), ``plot(kind)``,
and ``--png`` / ``--svg``: the report's figures as files, replacing only ssacli's own.

The results are tests/helpers/report_fixtures.py's hand-written arrays, so every drawn value is
checked against numbers worked out here with numpy, not read back from the code under test.
"""

from __future__ import annotations

import html
import io
import json
import re

import numpy as np
import pytest
from matplotlib.figure import Figure

import ssacli
from ssacli.check.requirements import CheckReport, parse_requirement
from ssacli.diagnosis.comparison import compare_results
from ssacli.errors import EXIT_USAGE, UsageError
from ssacli.quality.result import QualityReport
from ssacli.report.figure_files import figure_bytes, figure_written_by_ssacli
from ssacli.report.html import CSS
from tests.helpers.cli import run_main
from tests.helpers.report_fixtures import A_EMBED_COLLAPSE, result_a, result_b

EMBED = "embed-scale"


def folded_start(fragment: str) -> int:
    return fragment.index("<details>")


def test_a_result_shows_its_verdict_first_and_folds_the_rest():
    result = result_a()
    fragment = result._repr_html_()
    assert fragment.startswith('<div class="ssacli-output"><style>') and fragment.endswith("</div>")
    assert not re.search(r"<(html|body|head|h1|h2)\b", fragment)  # a piece of the notebook, not a page
    assert "tiny&lt;gpt&gt;&amp;co" in fragment and "tiny<gpt>" not in fragment  # the model name, escaped
    verdicts = result.verdicts()  # the result's own summary (its JSON), one line per probe
    assert verdicts and all(html.escape(v["text"], quote=True) in fragment[: folded_start(fragment)]
                            for v in verdicts.values())  # fmt: skip
    findings = [html.escape(f["text"], quote=True) for f in result.findings()]
    summary = fragment.index(f"<summary>findings ({len(findings)})</summary>")
    assert all(fragment.index(text) > summary for text in findings)
    assert "<summary>run</summary>" in fragment and fragment.count("data:image/png;base64,") == 1


def test_the_page_css_comes_scoped_to_the_output():
    """A notebook puts output HTML into its own page: an unscoped `table` or `body` rule would
    restyle every cell of it. Every rule of the page's CSS is there, each selector inside the div."""
    style = re.search(r"<style>(.*?)</style>", result_a()._repr_html_(), re.S).group(1)
    rules = re.findall(r"([^{}]+)\{[^{}]*\}", style)
    assert len(rules) == CSS.count("{")
    selectors = [s.strip() for rule in rules for s in rule.split(",")]
    assert selectors and all(
        s == "div.ssacli-output" or s.startswith("div.ssacli-output ") for s in selectors
    )


def line_of(figure: Figure, title: str, color: str = "black"):
    (ax,) = [ax for ax in figure.axes if ax.get_title().startswith(title)]
    return [line for line in ax.get_lines() if line.get_color() == color]


def test_plot_draws_the_results_own_arrays():
    a, b = result_a(), result_b()
    means = np.asarray(A_EMBED_COLLAPSE).mean(axis=(1, 2))  # per level, over layers and heads
    (mean,) = line_of(a.plot("lines", probe=EMBED), "collapse_rate")
    assert isinstance(a.plot(), Figure) and np.allclose(mean.get_ydata(), means)
    assert np.allclose(mean.get_xdata(), [1, 2, 4])
    # the heatmap shows the level where the probe collapses: 4 (collapse rate mean 0.6 ≥ 0.5)
    heat = a.plot("heatmap", probe=EMBED)
    (ax,) = [ax for ax in heat.axes if ax.get_title().startswith("collapse_rate at")]
    assert ax.get_title().endswith("4") and np.allclose(ax.get_images()[0].get_array(), A_EMBED_COLLAPSE[2])
    compared = a.plot("compare", probe=EMBED, other=b)
    (ax,) = [ax for ax in compared.axes if ax.get_title().startswith("collapse_rate")]
    solid, dashed = ax.get_lines()[:2]
    assert np.allclose(solid.get_ydata(), means)
    assert np.allclose(dashed.get_ydata(), [0.0, 0.15, 0.35, 0.6])  # result_b's means, by hand there
    with pytest.raises(UsageError, match="draws: overview, lines, heatmap, compare, generation"):
        a.plot("bars")
    with pytest.raises(UsageError, match=r"no probe 'nope' in .* \(have: embed-scale, outlier, numeric\)"):
        a.plot("lines", probe="nope")
    with pytest.raises(UsageError, match="probe 'numeric' of .* was skipped"):
        a.plot("heatmap", probe="numeric")
    with pytest.raises(UsageError, match="no generation in this result"):
        a.plot("generation")


def quality_report(trajectory=None) -> QualityReport:
    a, b = result_a(), result_b()
    side = {"model": "before<1>", "family": "gpt2", "kind": "causal", "scorer": "softmax"}
    rows = [
        {"label": "perplexity (built-in)", "before": 20.25, "after": 18.5, "delta": -1.75, "better": "lower"},
        {"label": "minimal pairs", "before": 0.8, "after": 0.75, "delta": -0.05, "better": "higher"},
    ]
    conversion = {"after": {"trajectory": trajectory}} if trajectory else {}
    return QualityReport(side, {**side, "model": "after", "scorer": "ssa"}, {"seed": 0}, rows, {},
                         compare_results(a, b), conversion=conversion)  # fmt: skip


def test_a_quality_report_shows_its_table_and_the_probes_verdicts():
    fragment = quality_report()._repr_html_()
    shown = fragment[: folded_start(fragment)]
    assert "20.25" in shown and "18.5" in shown and "before&lt;1&gt; → after" in shown
    assert '<td class="better">-1.75</td>' in shown and '<td class="worse">-0.05</td>' in shown
    a_verdicts, b_verdicts = result_a().verdicts(), result_b().verdicts()
    assert all(
        html.escape(v["text"], quote=True) in shown for v in [*a_verdicts.values(), *b_verdicts.values()]
    )
    with pytest.raises(UsageError, match="no fine-tuning trajectory"):
        quality_report().plot("trajectory")
    with pytest.raises(UsageError, match="no CONTROL in this report"):
        quality_report().plot("compare-control")
    records = [{"step": 0, "loss": 3.0, "heldout_loss": 3.2}, {"step": 10, "loss": 2.5, "heldout_loss": 2.9}]
    (ax,) = [ax for ax in quality_report(records).plot("trajectory").axes if ax.get_title() == "loss"]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"train (that step)": [3.0, 2.5], "held-out": [3.2, 2.9]}
    (mean,) = [line for line in quality_report().plot("compare", probe=EMBED).axes[0].get_lines()[:1]]
    assert mean.get_label().startswith("A: tiny<gpt>&co")


def test_a_check_report_says_pass_or_fail_then_each_requirement():
    result = result_a()
    requirements = [parse_requirement(f"collapse_rate@{EMBED}:4 max <= 0.5"),
                    parse_requirement(f"collapse_rate@{EMBED}:1 mean <= 0.5")]  # fmt: skip
    outcomes = [r.evaluate(result, None, None) for r in requirements]
    fragment = CheckReport("m", requirements, outcomes, result)._repr_html_()
    shown = fragment[: folded_start(fragment)]
    assert '<tr class="failed"><th>FAIL</th><td>1 of 2 failed</td></tr>' in shown
    # measured: the largest head of A_EMBED_COLLAPSE at level 4 (0.8), the mean at level 1 (0.1)
    assert "<td>0.8</td>" in shown and "<td>0.1</td>" in shown
    assert shown.count('<td class="failed">FAIL</td>') == 1 and shown.count('<td class="held">PASS</td>') == 1
    drawn = CheckReport("m", requirements, outcomes, result).plot("heatmap", probe=EMBED)
    assert figure_bytes(drawn, "png") == figure_bytes(result.plot("heatmap", probe=EMBED), "png")


def test_render_png_and_svg_write_the_figures_and_replace_only_their_own(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text(result_a().to_json())
    code, out, err = run_main(["render", "r.json", "-q", "--png", "png", "--svg", "svg"], monkeypatch, capsys)
    assert code == 0, err
    expected = ssacli.render_figures(ssacli.DiagnoseResult.load("r.json"))  # the API's figures
    names = ["overview", f"lines-{EMBED}", f"heatmap-{EMBED}", "lines-outlier", "heatmap-outlier"]
    assert [name for name, _ in expected] == names  # the skipped probe has no figure
    for name, figure in expected:
        assert (tmp_path / "png" / f"{name}.png").read_bytes() == figure_bytes(figure, "png")
        assert figure_written_by_ssacli(tmp_path / "svg" / f"{name}.svg")
    assert f"wrote png/ (5 PNG files: {', '.join(names)})" in out
    # a second run replaces ssacli's own files; a file it did not write stops it before any work
    (tmp_path / "png" / "notes.txt").write_text("mine")
    assert run_main(["render", "r.json", "-q", "--png", "png"], monkeypatch, capsys)[0] == 0
    foreign = io.BytesIO()
    Figure().savefig(foreign, format="png")  # a PNG matplotlib wrote for someone else
    (tmp_path / "png" / f"heatmap-{EMBED}.png").write_bytes(foreign.getvalue())
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "png").iterdir()}
    code, out, err = run_main(["render", "r.json", "-q", "--png", "png"], monkeypatch, capsys)
    assert code == EXIT_USAGE and out == ""
    assert err.startswith(f"error: --png png holds heatmap-{EMBED}.png, which ssacli did not write")
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "png").iterdir()} == before


def test_a_comparison_and_a_report_name_their_figures_as_the_page_draws_them():
    a, b = result_a(), result_b()
    assert [n for n, _ in ssacli.render_figures(a, b)] == [f"compare-{EMBED}", "compare-outlier"]
    names = [n for n, _ in ssacli.render_figures(quality_report([{"step": 0, "loss": 3.0}]))]
    assert names == [f"compare-{EMBED}", "compare-outlier", "trajectory"]
    assert json.loads(json.dumps(quality_report().to_dict()))  # unchanged: Displayed adds no field
