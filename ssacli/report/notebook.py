"""Results in a notebook (docs/notebooks.md): the compact HTML Jupyter shows for a DiagnoseResult, a
QualityReport and a CheckReport (their ``_repr_html_``), and their figures by kind (``result.plot``,
and the files of ``--png`` / ``--svg``: :func:`figure_set`). ssacli/__init__.py binds these
functions to the result types through :mod:`ssacli.display` (why: that module's docstring).

Everything is the pages' own pieces (the verdict, facts, findings and data tables of html.py and
before_after.py; the figures of figures.py, generation.py, before_after.py and monitor.py), so a
notebook shows what the HTML page shows, shorter: the verdict first, the rest folded in <details>.
The page's CSS comes along scoped to the output's own <div> (:func:`scoped_css`): a notebook puts
output HTML into its own page, where the page's ``body`` and ``table`` rules would restyle every cell.
"""

from __future__ import annotations

import io
import re
from functools import partial
from typing import Any

from ..diagnosis.comparison import comparison_findings, generation_comparison
from ..diagnosis.verdicts import probe_verdicts
from ..errors import UsageError
from .before_after import (
    CONTROL_PROBES,
    header_facts,
    no_quality_note,
    quality_columns,
    report_results,
    report_title,
    trajectory_figure,
    trajectory_of,
)
from .figures import DPI, compare_figure, heatmap_figure, line_figure, overview_figure, png_img
from .html import CSS, escape, facts_table, findings_list, html_table, paired_verdict_table, verdict_table
from .monitor import monitor_figure, monitor_of
from .summary import summary_facts, summary_findings

SCOPE = "ssacli-output"  # the class of the <div> every output is in; its CSS applies inside only
DIAGNOSE_KINDS = ("overview", "lines", "heatmap", "compare", "generation")
REPORT_KINDS = ("compare", "compare-control", "trajectory", "monitor")


def scoped_css(css: str = CSS, scope: str = SCOPE) -> str:
    """``css`` with every selector put inside ``div.scope`` (``body`` becomes the div itself)."""

    def rule(match: re.Match) -> str:
        selectors = (s.strip() for s in match.group(1).split(","))
        inside = ", ".join(f"div.{scope}" if s == "body" else f"div.{scope} {s}" for s in selectors)
        return f"{inside} {{{match.group(2)}}}"

    return re.sub(r"([^{}]+)\{([^{}]*)\}", rule, re.sub(r"/\*.*?\*/", "", css, flags=re.S)).strip()


def output(title: str, shown: list[str], folded: list[tuple[str, list[str]]], hint: str) -> str:
    """One notebook output: the title, what is always shown, each folded part that has something
    (under its summary line), and a line on where the rest is."""
    parts = [f'<div class="{SCOPE}"><style>{scoped_css()}</style>', f"<p><b>{escape(title)}</b></p>", *shown]
    parts += [
        f"<details><summary>{escape(summary)}</summary>{''.join(body)}</details>"
        for summary, body in folded
        if body
    ]
    parts += [f'<p class="note">{escape(hint)}</p>', "</div>"]
    return "\n".join(parts)


# ---- the HTML of each result type ---------------------------------------------------------------------


def diagnose_output(result) -> str:
    """A DiagnoseResult: its verdict (one line per probe, most severe first), then folded the
    findings, the run's facts and the collapse point per probe and layer."""
    verdicts = probe_verdicts(result)
    shown = [verdict_table(verdicts)] if verdicts else ['<p class="note">no probe was measured</p>']
    findings = summary_findings(result)
    overview = overview_figure(result)
    folded = [
        (f"findings ({len(findings)})", [findings_list(findings)] if findings else []),
        ("run", [facts_table(summary_facts(result))]),
        ("collapse point per probe and layer", [] if overview is None else [png_img(overview, "overview")]),
    ]
    hint = (
        "result.plot(kind, probe=…) draws "
        + ", ".join(DIAGNOSE_KINDS)
        + "; ssacli.render_html(result): the page"
    )
    return output(f"ssacli diagnose: {result.model} · {result.scorer}", shown, folded, hint)


def report_output(report) -> str:
    """A QualityReport: the quality table (BEFORE, AFTER, Δ; with a CONTROL its columns too) and the
    probes' verdicts side by side; folded the models, settings and what changed in the probes."""
    data = _document(report)
    a, b = report_results(data)
    if data.get("quality"):
        header, cells, classes = quality_columns(data)
        shown = [html_table([h.strip().replace("\n", " ") for h in header], cells, classes)]
    else:
        shown = [f'<p class="note">{escape(no_quality_note(data))}</p>']
    shown += ["<p>attention probes (A = BEFORE, B = AFTER)</p>", paired_verdict_table(a, b)]
    if data.get("diagnose_control") is not None:
        shown += [
            f"<p>{escape(CONTROL_PROBES)}</p>",
            paired_verdict_table(*report_results(data, "diagnose_control")),
        ]
    changes = [f["text"] for f in comparison_findings(a, b)]
    folded = [
        ("models and settings", [facts_table(header_facts(data))]),
        (f"what changed in the probes ({len(changes)})", [findings_list(changes)] if changes else []),
    ]
    title = f"{report_title(data)}: {data['before']['model']} → {data['after']['model']}"
    return output(title, shown, folded, "report.plot(kind) draws " + ", ".join(REPORT_KINDS))


def check_output(report) -> str:
    """A CheckReport: pass or fail, every requirement (measured, baseline and Δ when there is one),
    the warnings; folded the verdict of the diagnose it measured."""
    total = len(report.outcomes)
    tone, word = ("held", "PASS") if report.passed else ("failed", "FAIL")
    line = f"all {total} requirements passed" if report.passed else f"{report.failures} of {total} failed"
    shown = [f'<table class="verdict"><tr class="{tone}"><th>{word}</th><td>{escape(line)}</td></tr></table>']
    with_base = report.baseline_file is not None
    header = ["requirement", "measured", *(("baseline", "Δ") if with_base else ()), "result"]
    rows, classes = [], []
    for req, out in zip(report.requirements, report.outcomes):
        row = [req.text, _number(out.measured)]
        if with_base:
            delta = None if out.baseline is None else out.measured - out.baseline
            row += [_number(out.baseline), "–" if delta is None else f"{delta:+.4g}"]
        rows.append([*row, "PASS" if out.passed else "FAIL"])
        classes.append([""] * len(row) + ["held" if out.passed else "failed"])
    shown.append(html_table(header, rows, classes))
    notes = [
        f"FAIL {r.text}: {o.message}" for r, o in zip(report.requirements, report.outcomes) if not o.passed
    ]
    shown += [f'<p class="note">{escape(text)}</p>' for text in [*notes, *report.warnings]]
    verdicts = probe_verdicts(report.result)
    folded = [("the diagnose it measured", [verdict_table(verdicts)] if verdicts else [])]
    return output(
        f"ssacli check: {report.model}", shown, folded, "report.plot(kind) draws its diagnose's figures"
    )


def _number(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:.4g}"


def _document(report) -> dict[str, Any]:
    """A QualityReport as the JSON document every report renderer reads (or that document itself)."""
    return report if isinstance(report, dict) else report.to_dict()


# ---- figures by kind ------------------------------------------------------------------------------------


def diagnose_plot(result, kind: str | None = None, **options):
    """``DiagnoseResult.plot``: :func:`diagnose_figure`, drawn under the notebook cell (:func:`shown`)."""
    return shown(diagnose_figure(result, kind, **options))


def report_plot(report, kind: str | None = None, **options):
    """``QualityReport.plot``: :func:`report_figure`, drawn under the notebook cell."""
    return shown(report_figure(report, kind, **options))


def check_plot(report, kind: str | None = None, **options):
    """``CheckReport.plot``: the figures of the diagnose it measured, drawn under the notebook cell."""
    return shown(diagnose_figure(report.result, kind, **options))


def shown(figure):
    """``figure``, able to draw itself under a notebook cell. IPython asks an object for
    ``_repr_png_``; matplotlib's inline backend registers a drawer for every Figure only once pyplot
    is imported, and these figures are made without pyplot (no backend chosen, no global state), so
    a cell ending in ``result.plot()`` showed "<Figure size …>". Each carries its own, on the
    instance: nothing global changes, and with pyplot's inline backend active IPython uses that."""
    figure._repr_png_ = partial(figure_png, figure)
    return figure


def figure_png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


def diagnose_figure(result, kind: str | None = None, *, probe: str | None = None, other=None):
    """One figure of a DiagnoseResult: ``overview`` (collapse point per probe and layer), ``lines``
    (each metric against the probe's levels, per layer) or ``heatmap`` (layer × head) of ``probe``
    (default: the first probe measured), ``compare`` (against ``other``, a second result, on
    ``probe``) or ``generation`` (diagnose's ``generate``: metrics per decoding step)."""
    kind = _kind(kind, DIAGNOSE_KINDS, "a DiagnoseResult")
    if kind == "overview":
        figure = overview_figure(result)
        if figure is None:
            raise UsageError("no probe was measured: there is no overview to draw")
        return figure
    if kind == "generation":
        if result.generation is None:
            raise UsageError("no generation in this result: diagnose with generate=N (--generate N)")
        from .generation import generation_figure

        return generation_figure(result.generation)
    if kind == "compare":
        if other is None:
            raise UsageError("plot('compare') needs other=, the result to compare with")
        pa = _probe(result, probe, kind)
        return compare_figure(pa, _probe(other, pa.name, kind), _side("A", result), _side("B", other))
    chosen = _probe(result, probe, kind)
    return line_figure(chosen) if kind == "lines" else heatmap_figure(chosen)


def report_figure(report, kind: str | None = None, *, probe: str | None = None):
    """One figure of a QualityReport: ``compare`` (BEFORE solid, AFTER dashed on ``probe``, default
    the first measured), ``compare-control`` (CONTROL and AFTER), ``trajectory`` (AFTER's
    fine-tuning: losses, KL, n and b per layer) or ``monitor`` (saturation during that run)."""
    kind, data = _kind(kind, REPORT_KINDS, "a QualityReport"), _document(report)
    if kind == "trajectory":
        records = trajectory_of(data)
        if not records:
            raise UsageError("no fine-tuning trajectory in this report: AFTER's folder records no ssacli run")
        return trajectory_figure(records)
    if kind == "monitor":
        history = monitor_of(data)
        if not history:
            raise UsageError(
                "no saturation monitor in this report: AFTER was fine-tuned without --monitor-every"
            )
        return monitor_figure(history)
    key = "diagnose_control" if kind == "compare-control" else "diagnose"
    if data.get(key) is None:
        raise UsageError("no CONTROL in this report: ssacli report BEFORE AFTER CONTROL measures one")
    a, b = report_results(data, key)
    return diagnose_figure(a, "compare", probe=probe, other=b)


def figure_set(result, other=None) -> list[tuple[str, Any]]:
    """Every figure a result's page shows, named as ``--png`` / ``--svg`` write them: a
    DiagnoseResult's overview, lines-PROBE, heatmap-PROBE and generation; with ``other``, the
    comparison's compare-PROBE and generation-compare; a report's (a QualityReport or its JSON
    document) compare-PROBE, compare-control-PROBE, trajectory and monitor."""
    if isinstance(result, dict) or type(result).__name__ == "QualityReport":
        data = _document(result)
        named = figure_set(*report_results(data))
        if data.get("diagnose_control") is not None:
            against = figure_set(*report_results(data, "diagnose_control"))
            named += [
                (f"compare-control-{n.removeprefix('compare-')}", f)
                for n, f in against
                if n != "generation-compare"
            ]
        for kind, present in (("trajectory", trajectory_of(data)), ("monitor", monitor_of(data))):
            if present:
                named.append((kind, report_figure(data, kind)))
        return named
    if other is not None:
        names_b = {p.name for p in _drawable(other)}
        shared = [p.name for p in _drawable(result) if p.name in names_b]
        named = [
            (f"compare-{name}", diagnose_figure(result, "compare", probe=name, other=other))
            for name in shared
        ]
        both = generation_comparison(result, other)
        if both is not None and "only" not in both:
            from .generation import comparison_figure

            named.append(("generation-compare", comparison_figure(result.generation, other.generation)))
        return named
    overview = overview_figure(result)
    named = [] if overview is None else [("overview", overview)]
    for p in _drawable(result):
        named += [(f"lines-{p.name}", line_figure(p)), (f"heatmap-{p.name}", heatmap_figure(p))]
    if result.generation is not None:
        named.append(("generation", diagnose_figure(result, "generation")))
    return named


def _kind(kind: str | None, kinds: tuple[str, ...], what: str) -> str:
    if kind is None:
        return kinds[0]
    if kind not in kinds:
        raise UsageError(f"unknown figure kind {kind!r}; {what} draws: {', '.join(kinds)}")
    return kind


def _drawable(result) -> list:
    """The probes with something to plot: measured, and not overflowed at every level."""
    return [p for p in result.probes if not p.skipped and not p.all_overflowed]


def _probe(result, name: str | None, kind: str):
    drawable = _drawable(result)
    if name is None:
        if not drawable:
            raise UsageError(f"no probe of this result has a '{kind}' figure: none was measured")
        return drawable[0]
    if name not in {p.name for p in result.probes}:
        have = ", ".join(p.name for p in result.probes) or "none"
        raise UsageError(f"no probe '{name}' in {result.model} (have: {have})")
    if name not in {p.name for p in drawable}:
        raise UsageError(
            f"probe '{name}' of {result.model} was skipped or overflowed at every level: nothing to draw"
        )
    return result.probe(name)


def _side(side: str, result) -> str:
    return f"{side}: {result.model} · {result.scorer}"


__all__ = ["check_output", "check_plot", "diagnose_figure", "diagnose_output", "diagnose_plot", "figure_set",
           "report_figure", "report_output", "report_plot", "scoped_css", "shown"]  # fmt: skip
