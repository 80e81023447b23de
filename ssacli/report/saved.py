"""Saved diagnose results rendered again (``ssacli render``): read back, shown with the renderers
``ssacli diagnose`` uses (:mod:`ssacli.report.terminal`, :mod:`ssacli.report.html`), exported as
tables (:mod:`ssacli.diagnosis.frames`).

A saved file is one result (``diagnose --json``) or a comparison of two (``diagnose --compare …
--json``): :func:`load_saved` returns one or two results, and :func:`render` / :func:`render_html`
draw one result, or A against B, exactly as ``diagnose`` did. Outputs are ssacli's to replace only
when ssacli wrote them (:func:`check_replaceable`): an HTML page of ssacli's, a frame CSV with its
header line, a Parquet file with ssacli's metadata, or an empty file.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..check.requirements import SCHEMA as CHECK_SCHEMA
from ..defaults import HEATMAP
from ..diagnosis.comparison import COMPARISON_SCHEMA
from ..diagnosis.frames import frame_written_by_ssacli
from ..diagnosis.result import SCHEMA, DiagnoseResult, read_json_file
from ..errors import InputError, UsageError
from ..quality.result import REPORT_SCHEMA
from .html import PAGE_HEAD, comparison_html, diagnose_html
from .summary import pick_heatmap
from .terminal import render_comparison, render_diagnose

OTHER_SCHEMAS = {REPORT_SCHEMA: "an `ssacli report` JSON", CHECK_SCHEMA: "an `ssacli check` JSON"}


def load_saved(path: str | Path) -> list[DiagnoseResult]:
    """The results in a saved file: ``[result]`` for a ``diagnose --json`` file, ``[a, b]`` for a
    comparison written by ``diagnose --compare … --json``. Anything else (a missing or non-JSON
    file, a report or check JSON, a newer schema) is an InputError naming the file and the fix."""
    data = read_json_file(path)
    schema = data.get("schema")
    if schema == COMPARISON_SCHEMA:
        sides = [data.get("a"), data.get("b")]
        if not all(isinstance(side, dict) for side in sides):
            raise InputError(f"result file '{path}' is a comparison without both sides (a, b); re-create it")
        return [DiagnoseResult.from_saved(side, path) for side in sides]
    if schema != SCHEMA:
        what = OTHER_SCHEMAS.get(schema, f"not a diagnose result (schema={schema!r})")
        raise InputError(f"'{path}' is {what}; give a file written by `ssacli diagnose --json`")
    return [DiagnoseResult.from_saved(data, path)]


def render(
    result: DiagnoseResult,
    other: DiagnoseResult | None = None,
    *,
    console: Console | None = None,
    heatmap_metric: str = HEATMAP,
    heatmap_probe: str | None = None,
) -> None:
    """Print ``result``'s terminal report as ``ssacli diagnose`` does (verdict, facts, findings,
    tables, heatmap of ``heatmap_metric`` [at ``heatmap_probe``]), or with ``other`` the comparison
    of the two (A = ``result``, B = ``other``), as ``diagnose --compare`` does."""
    console = console or Console()
    if other is not None:
        render_comparison(result, other, console)
        return
    pick_heatmap(result, heatmap_metric, heatmap_probe)  # a bad metric or probe fails before printing
    render_diagnose(result, console, heatmap_metric=heatmap_metric, heatmap_probe=heatmap_probe)


def render_html(result: DiagnoseResult, other: DiagnoseResult | None = None) -> str:
    """``result``'s self-contained HTML page as ``diagnose --html`` writes it, or with ``other`` the
    comparison page (``diagnose --compare … --html``)."""
    return diagnose_html(result) if other is None else comparison_html(result, other)


def written_by_ssacli(path: str | Path, kind: str) -> bool:
    """Whether the existing file ``path`` is an output of ``kind`` ("html", "csv", "parquet") that
    ssacli wrote, or empty: the only files :func:`check_replaceable` lets a command replace."""
    path = Path(path)
    if path.stat().st_size == 0:
        return True
    if kind == "html":
        try:
            with path.open("rb") as handle:
                start = handle.read(len(PAGE_HEAD.encode()) + len("<title>ssacli"))
        except OSError:
            return False
        return start == (PAGE_HEAD + "<title>ssacli").encode()
    return frame_written_by_ssacli(path, kind)


def check_replaceable(path: str | Path | None, option: str) -> None:
    """Refuse (UsageError, exit 2) before any work when the output ``path`` of ``option`` (``--html``,
    ``--csv``, ``--parquet``) exists and ssacli did not write it; None or a new path passes."""
    if path is None or not Path(path).is_file():
        return
    kind = option.lstrip("-")
    if not written_by_ssacli(path, kind):
        what = {"html": "an HTML page", "csv": "a table CSV", "parquet": "a Parquet table"}[kind]
        raise UsageError(
            f"{option} '{path}' exists and is not {what} ssacli wrote; ssacli replaces only its own "
            "outputs: choose another name or remove it"
        )
