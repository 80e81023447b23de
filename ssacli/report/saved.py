"""Saved diagnose results rendered again (``ssacli render``): read back, shown with the renderers
``ssacli diagnose`` uses (:mod:`ssacli.report.terminal`, :mod:`ssacli.report.html`), exported as
tables (:mod:`ssacli.diagnosis.frames`).

A saved file is one result (``diagnose --json``) or a comparison of two (``diagnose --compare …
--json``): :func:`load_saved` returns one or two results, and :func:`render` / :func:`render_html`
draw one result, or A against B, exactly as ``diagnose`` did. Outputs are ssacli's to replace only
when ssacli wrote them, as every command's (:mod:`ssacli.report.replaceable`).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..defaults import FINDINGS, HEATMAP
from ..diagnosis.result import DiagnoseResult
from ..documents import COMPARISON_SCHEMA, read_saved
from ..errors import UsageError
from .html import comparison_html, diagnose_html
from .summary import pick_heatmap
from .terminal import render_comparison, render_diagnose


def load_saved(path: str | Path) -> list[DiagnoseResult]:
    """The results in a saved file: ``[result]`` for a ``diagnose --json`` file, ``[a, b]`` for a
    comparison written by ``diagnose --compare … --json``. Anything else (a missing or non-JSON
    file, a report or check JSON, a newer schema) is an InputError naming the file and the fix."""
    data = read_saved(path)  # the file and its schema: torch-free, what `ssacli render` checks first
    if data["schema"] == COMPARISON_SCHEMA:
        return [DiagnoseResult.from_saved(data[side], path) for side in ("a", "b")]
    return [DiagnoseResult.from_saved(data, path)]


def render(
    result: DiagnoseResult,
    other: DiagnoseResult | None = None,
    *,
    console: Console | None = None,
    heatmap_metric: str = HEATMAP,
    heatmap_probe: str | None = None,
    findings: int | None = FINDINGS,
) -> None:
    """Print ``result``'s terminal report as ``ssacli diagnose`` does (verdict, facts, the first
    ``findings`` findings (None: all) and a count of the rest, tables, heatmap of ``heatmap_metric``
    [at ``heatmap_probe``]), or with ``other`` the comparison of the two (A = ``result``, B =
    ``other``), as ``diagnose --compare`` does."""
    if findings is not None and (isinstance(findings, bool) or not isinstance(findings, int) or findings < 0):
        raise UsageError(f"findings={findings!r}: give a count of 0 or more, or None for all")
    console = console or Console()
    if other is not None:
        render_comparison(result, other, console, findings)
        return
    pick_heatmap(result, heatmap_metric, heatmap_probe)  # a bad metric or probe fails before printing
    render_diagnose(
        result, console, heatmap_metric=heatmap_metric, heatmap_probe=heatmap_probe, findings=findings
    )


def render_html(result: DiagnoseResult, other: DiagnoseResult | None = None) -> str:
    """``result``'s self-contained HTML page as ``diagnose --html`` writes it, or with ``other`` the
    comparison page (``diagnose --compare … --html``)."""
    return diagnose_html(result) if other is None else comparison_html(result, other)
