"""The lm-evaluation-harness part of an ``ssacli report``: per task and metric BEFORE and AFTER
± lm-eval's standard error, and Δ ± the per-item paired standard error with the paired t-test's p
(``report["lm_eval"]``, :func:`ssacli.quality.harness.paired_rows`). Δ is coloured only where
p <= 0.05: a difference inside the noise reads neither better nor worse. With a CONTROL a second
table holds AFTER against it (``report["lm_eval"]["control_rows"]``, whose ``before`` is CONTROL's).
"""

from __future__ import annotations

import math
from html import escape as escape_html
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..quality.harness import row_verdict
from .html import Section, html_table

HEADER = ("task", "metric", "BEFORE ± SE", "AFTER ± SE", "Δ ± paired SE", "p", "n")
TITLE = "benchmarks (lm-evaluation-harness)"
ROWS = {"before": "rows", "control": "control_rows"}  # the rows of AFTER against BEFORE, CONTROL


def header(against: str = "before") -> list[str]:
    return [f"{against.upper()} ± SE" if name == "BEFORE ± SE" else name for name in HEADER]


def title(against: str = "before") -> str:
    return TITLE if against == "before" else f"{TITLE}: AFTER against CONTROL"


def _rows(report: dict[str, Any], against: str) -> list[dict[str, Any]] | None:
    return (report.get("lm_eval") or {}).get(ROWS[against])


def _with_error(value: float | None, error: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    text = f"{value:+.4f}" if signed else f"{value:.4f}"
    return text if error is None else f"{text} ± {error:.4f}"


def benchmark_rows(report: dict[str, Any], against: str = "before") -> list[list[str]]:
    """The table's cells, one row per task and metric (empty without ``--lm-eval``); ``against``
    "control": AFTER against CONTROL."""
    rows = []
    for row in _rows(report, against) or []:
        rows.append([
            row["task"], row["metric"], _with_error(row["before"], row["before_stderr"]),
            _with_error(row["after"], row["after_stderr"]),
            _with_error(row["delta"], row["paired_stderr"], signed=True),
            "–" if row["p"] is None else f"{row['p']:.3g}", str(row["n"]),
        ])  # fmt: skip
    return rows


def benchmark_notes(report: dict[str, Any], against: str = "before") -> list[str]:
    """What the table cannot show: rows without a paired error, and how the runs were set up."""
    block = report.get("lm_eval") or {}
    notes = [f"{r['task']} {r['metric']}: {r['note']}" for r in _rows(report, against) or [] if r.get("note")]
    settings = block.get("settings") or {}
    shots = settings.get("num_fewshot")
    notes.append(
        f"few-shot: {'each task its default' if shots is None else shots}; items per task: "
        f"{settings.get('limit') or 'all'}; Δ = AFTER − {against.upper()} on the same items; SE from lm-eval"
    )
    for side in ("before", "after") if against == "before" else ("control", "after"):
        run = ((report.get("measurements") or {}).get(side) or {}).get("lm_eval") or {}
        if run:
            notes.append(f"{side.upper()} scored by lm-eval {run.get('lm_eval_version')} with "
                         f"{run.get('scorer')} (attention: {run.get('attn_implementation')})")  # fmt: skip
    return notes


def benchmark_table(report: dict[str, Any], against: str = "before") -> Table | None:
    """The rich table, or None when the report ran no lm-eval task (``against`` "control": none
    without a CONTROL)."""
    cells = benchmark_rows(report, against)
    if _rows(report, against) is None:
        return None
    table = Table(title=title(against), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="\n".join(benchmark_notes(report, against)), caption_justify="left")  # fmt: skip
    for name in header(against):
        table.add_column(name, justify="left" if name in ("task", "metric") else "right")
    for row, text in zip(_rows(report, against), cells):
        style = {"better": "green", "worse": "red"}.get(row_verdict(row), "")
        table.add_row(*text[:4], Text(text[4], style=style), *text[5:])
    return table


def benchmark_section(report: dict[str, Any], against: str = "before") -> Section | None:
    """The HTML section, or None when the report ran no lm-eval task (or has no CONTROL)."""
    rows = _rows(report, against)
    if rows is None:
        return None
    classes = [["", "", "", "", row_verdict(r), "", ""] for r in rows]
    notes = [f'<p class="note">{escape_html(note)}</p>' for note in benchmark_notes(report, against)]
    table = html_table(header(against), benchmark_rows(report, against), classes)
    return Section(title(against), [table, *notes])


__all__ = ["benchmark_notes", "benchmark_rows", "benchmark_section", "benchmark_table"]
