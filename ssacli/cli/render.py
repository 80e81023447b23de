"""`ssacli render RESULT.json`: a saved diagnose result shown again (terminal, HTML) or exported
as a long-format table (CSV, Parquet), with the renderers `ssacli diagnose` uses.

Every output is checked first (writable, and, where it exists, a file ssacli wrote), then the
inputs are read, then every output is rendered in full before any is written: a failure leaves no
file behind.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from ..defaults import HEATMAP
from ..errors import UsageError
from .options import (
    HEATMAP_HELP,
    FindingsShown,
    OverwriteFiles,
    PngDir,
    QuietOutput,
    SvgDir,
    check_outputs,
    findings_budget,
)
from .outputs import check_figure_outputs, figure_outputs, is_stdout, write_figure_outputs, write_output


def render_command(
    result_file: Path = typer.Argument(
        ..., metavar="RESULT", help="A `diagnose --json` file (one result, or a --compare of two)."
    ),
    compare: Path = typer.Option(None, help="A second `diagnose --json` file: RESULT is A, this is B."),
    html_out: Path = typer.Option(None, "--html", help="Write the self-contained HTML page to this file."),
    csv_out: Path = typer.Option(None, "--csv", help="Write the per-head metrics, long format, as CSV."),
    parquet_out: Path = typer.Option(
        None, "--parquet", help=r'The same table as Parquet (pip install "ssacli\[frame]").'
    ),
    overwrite: OverwriteFiles = False,
    png: PngDir = None,
    svg: SvgDir = None,
    heatmap: str = typer.Option(HEATMAP, help=HEATMAP_HELP),
    findings: FindingsShown = None,
    quiet: QuietOutput = False,
) -> None:
    r"""Render a saved `ssacli diagnose --json` RESULT as diagnose did, or export it as a table.

    The table has one row per probe, metric, level, layer and head: columns model, probe, level,
    layer, head, metric, value (empty where undefined).

    Examples:

      ssacli render out.json                       # the terminal report again

      ssacli render out.json --html out.html --csv heads.csv

      ssacli render softmax.json --compare ssa.json --html compare.html
    """
    outputs = (("--html", html_out), ("--csv", csv_out), ("--parquet", parquet_out))
    check_outputs(*outputs, overwrite=overwrite)  # before anything heavy is imported
    check_figure_outputs(png, svg)
    shown = findings_budget(findings)
    given = [
        Path(path).expanduser().absolute() for _, path in outputs if path is not None and not is_stdout(path)
    ]
    if len(set(given)) < len(given):
        raise UsageError("--html, --csv and --parquet name the same file; give each its own")
    from ..preflight import require_frame_format

    if parquet_out is not None:
        require_frame_format("parquet")

    from .. import load_saved, render, render_html

    results = load_saved(result_file)
    if compare is not None:
        if len(results) == 2:
            raise UsageError(f"'{result_file}' is already a comparison of two results; drop --compare")
        others = load_saved(compare)
        if len(others) == 2:
            raise UsageError(f"--compare '{compare}' is a comparison of two results; give one result")
        results += others
    if len(results) == 2 and (csv_out is not None or parquet_out is not None):
        raise UsageError(
            "--csv and --parquet export one result; render A and B each from its own `diagnose --json`"
        )
    metric, _, heat_probe = heatmap.partition("@")
    if len(results) == 1:  # a heatmap that names nothing in the result fails before any work
        from ..preflight import pick_heatmap

        pick_heatmap(results[0], metric, heat_probe or None)
    console = Console()
    files: list[tuple[Path, str | bytes]] = []  # rendered in full before any is written
    if html_out is not None:
        files.append((html_out, render_html(*results)))
    if csv_out is not None:
        files.append((csv_out, results[0].to_csv()))
    if parquet_out is not None:
        files.append((parquet_out, results[0].to_parquet()))
    if png is not None or svg is not None:
        from .. import render_figures

        figures = figure_outputs(lambda: render_figures(*results), png, svg)
    else:
        figures = []
    if not quiet:
        render(
            *results, console=console, heatmap_metric=metric, heatmap_probe=heat_probe or None, findings=shown
        )
    for path, content in files:
        write_output(content, path, console)
    write_figure_outputs(figures, console)
