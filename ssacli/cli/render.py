"""`ssacli render RESULT.json`: a saved diagnose result shown again (terminal, HTML) or exported
as a long-format table (CSV, Parquet), with the renderers `ssacli diagnose` uses.

Every output is checked first (writable, and, where it exists, a file ssacli wrote), then the
inputs are read, then every output is rendered in full before any is written: a failure leaves no
file behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..defaults import HEATMAP
from ..errors import UsageError
from ..setting import setting
from .declared import Given, command
from .options import (
    HEATMAP_HELP,
    check_outputs,
    figure_folder,
    findings_budget,
    findings_shown,
    output_file,
    overwrite_files,
    quiet_output,
)
from .outputs import check_figure_outputs, figure_outputs, is_stdout, write_figure_outputs, write_output


@dataclass(frozen=True)
class RenderOptions:
    """render's options: a second result, the files written, and what the terminal shows."""

    compare: Path | None = setting(
        None, "A second `diagnose --json` file: RESULT is A, this is B.", type=Path
    )
    html_out: Path | None = output_file("--html", "Write the self-contained HTML page to this file.")
    csv_out: Path | None = output_file("--csv", "Write the per-head metrics, long format, as CSV.")
    parquet_out: Path | None = output_file(
        "--parquet", r'The same table as Parquet (pip install "ssacli\[frame]").'
    )
    overwrite: bool = overwrite_files()
    png: Path | None = figure_folder("PNG")
    svg: Path | None = figure_folder("SVG")
    heatmap: str = setting(HEATMAP, HEATMAP_HELP)
    findings: str | None = findings_shown()
    quiet: bool = quiet_output()


RESULT_HELP = "A `diagnose --json` file (one result, or a --compare of two)."
ResultFile = Annotated[Path, typer.Argument(metavar="RESULT", help=RESULT_HELP)]


@command(RenderOptions)
def render_command(result_file: ResultFile, *, given: Given) -> None:
    r"""Render a saved `ssacli diagnose --json` RESULT as diagnose did, or export it as a table.

    The table has one row per probe, metric, level, layer and head: columns model, probe, level,
    layer, head, metric, value (empty where undefined).

    Examples:

      ssacli render out.json                       # the terminal report again

      ssacli render out.json --html out.html --csv heads.csv

      ssacli render softmax.json --compare ssa.json --html compare.html
    """
    out = given.of(RenderOptions)
    outputs = (("--html", out.html_out), ("--csv", out.csv_out), ("--parquet", out.parquet_out))
    check_outputs(*outputs, overwrite=out.overwrite)  # before anything heavy is imported
    check_figure_outputs(out.png, out.svg)
    shown = findings_budget(out.findings)
    _check_distinct(outputs)
    results = _results(result_file, out)
    console = Console()
    files, figures = _rendered(results, out)
    if not out.quiet:
        from .. import render

        metric, _, heat_probe = out.heatmap.partition("@")
        render(
            *results, console=console, heatmap_metric=metric, heatmap_probe=heat_probe or None, findings=shown
        )
    for path, content in files:
        write_output(content, path, console)
    write_figure_outputs(figures, console)


def _check_distinct(outputs: tuple[tuple[str, Path | None], ...]) -> None:
    """No two outputs name the same file, and Parquet can be written here."""
    given = [
        Path(path).expanduser().absolute() for _, path in outputs if path is not None and not is_stdout(path)
    ]
    if len(set(given)) < len(given):
        raise UsageError("--html, --csv and --parquet name the same file; give each its own")
    from ..preflight import require_frame_format

    if outputs[2][1] is not None:  # --parquet
        require_frame_format("parquet")


def _results(result_file: Path, out: RenderOptions) -> list:
    """RESULT (one result, or a comparison of two) and --compare's, as the outputs and --heatmap
    can take them."""
    from ..preflight import read_saved_result

    for saved in (result_file, out.compare):  # torch-free: a file that is no result fails at once
        if saved is not None:
            read_saved_result(saved)
    from .. import load_saved

    results = load_saved(result_file)
    if out.compare is not None:
        if len(results) == 2:
            raise UsageError(f"'{result_file}' is already a comparison of two results; drop --compare")
        others = load_saved(out.compare)
        if len(others) == 2:
            raise UsageError(f"--compare '{out.compare}' is a comparison of two results; give one result")
        results += others
    if len(results) == 2 and (out.csv_out is not None or out.parquet_out is not None):
        raise UsageError(
            "--csv and --parquet export one result; render A and B each from its own `diagnose --json`"
        )
    metric, _, heat_probe = out.heatmap.partition("@")
    if len(results) == 1:  # a heatmap that names nothing in the result fails before any work
        from ..preflight import pick_heatmap

        pick_heatmap(results[0], metric, heat_probe or None)
    return results


def _rendered(results: list, out: RenderOptions) -> tuple[list[tuple[Path, str | bytes]], list]:
    """The output files and the figure files, rendered in full before any is written."""
    from .. import render_html

    files: list[tuple[Path, str | bytes]] = []
    if out.html_out is not None:
        files.append((out.html_out, render_html(*results)))
    if out.csv_out is not None:
        files.append((out.csv_out, results[0].to_csv()))
    if out.parquet_out is not None:
        files.append((out.parquet_out, results[0].to_parquet()))
    if out.png is not None or out.svg is not None:
        from .. import render_figures

        return files, figure_outputs(lambda: render_figures(*results), out.png, out.svg)
    return files, []
