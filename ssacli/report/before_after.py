"""Rendering an ``ssacli report`` (BEFORE vs AFTER) for the terminal and as one HTML page.

Both read only the JSON-ready report of :func:`ssacli.quality.compare.compare_models`, so a report
written with ``--json`` renders the same later. The probe half reuses the diagnose comparison
(:func:`render_comparison`, :func:`comparison_sections`) so both commands show probes identically.
"""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..diagnosis.result import DiagnoseResult
from .html import Section, comparison_sections, facts_table, html_table, page
from .terminal import facts_panel, render_comparison


def report_results(report: dict[str, Any]) -> tuple[DiagnoseResult, DiagnoseResult]:
    """The two diagnose results inside a report (BEFORE, AFTER)."""
    diagnose = report["diagnose"]
    return DiagnoseResult.from_dict(diagnose["a"]), DiagnoseResult.from_dict(diagnose["b"])


def fmt_value(value: float | None) -> str:
    """Four significant digits: perplexities and accuracies differ in the third after a change."""
    return "–" if value is None or not math.isfinite(value) else f"{value:.4g}"


def fmt_change(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return "0" if value == 0 else f"{value:+.3g}"


def verdict(row: dict[str, Any]) -> str:
    """ "better", "worse" or "" for AFTER relative to BEFORE, by the measure's direction."""
    delta = row.get("delta")
    if delta is None or not math.isfinite(delta) or abs(delta) < 1e-12:
        return ""
    improved = delta < 0 if row["better"] == "lower" else delta > 0
    return "better" if improved else "worse"


def header_facts(report: dict[str, Any]) -> list[tuple[str, str]]:
    facts = []
    for side in ("before", "after"):
        info = report[side]
        facts.append(
            (side.upper(), f"{info['model']} · {info['kind']} · {info['family']} · {info['scorer']}")
        )
    settings = report.get("settings", {})
    facts.append(("seed", str(settings.get("seed", "–"))))
    facts.append(("Δ", "AFTER − BEFORE; green = AFTER better, red = worse"))
    facts += [("note", note) for note in report.get("notes", [])]
    return facts


def quality_table(report: dict[str, Any]) -> Table | None:
    rows = report.get("quality", [])
    if not rows:
        return None
    table = Table(title="quality", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("measure")
    for name in ("BEFORE", "AFTER", "Δ"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("better if", justify="left", style="dim")
    for row in rows:
        style = {"better": "green", "worse": "red"}.get(verdict(row), "")
        delta = Text(fmt_change(row["delta"]), style=style)
        table.add_row(row["label"], fmt_value(row["before"]), fmt_value(row["after"]), delta, row["better"])
    return table


def render_report(report: dict[str, Any], console: Console) -> None:
    """Header, the quality table (BEFORE, AFTER, Δ per measure), then the probe comparison."""
    console.print(facts_panel(header_facts(report), "ssacli report: before → after"))
    table = quality_table(report)
    if table is None:
        console.print(
            Text(
                "no quality measures: give --text-id / --text-ood / --pairs for a language model", style="dim"
            )
        )
    else:
        console.print(table)
    render_comparison(*report_results(report), console)


def report_html(report: dict[str, Any]) -> str:
    """One page: the report's head, the quality table, then the diagnose comparison's sections."""
    sections = [Section("ssacli report: before → after", [facts_table(header_facts(report))], level=1)]
    rows = report.get("quality", [])
    if rows:
        cells = [
            [r["label"], fmt_value(r["before"]), fmt_value(r["after"]), fmt_change(r["delta"]), r["better"]]
            for r in rows
        ]
        classes = [["", "", "", verdict(r), ""] for r in rows]
        header = ["measure", "BEFORE", "AFTER", "Δ", "better if"]
        sections.append(Section("quality", [html_table(header, cells, classes)]))
    else:
        note = '<p class="note">no quality measures (no text, pairs or ICL model)</p>'
        sections.append(Section(None, [note]))
    sections.append(Section("attention probes (A = BEFORE, B = AFTER)"))
    sections += comparison_sections(*report_results(report), head_level=3)
    return page(f"ssacli report: {report['before']['model']} → {report['after']['model']}", sections)
