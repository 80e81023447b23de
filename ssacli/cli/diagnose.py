"""`ssacli diagnose` and `ssacli scorers`: probe a model's attention, list and resolve scorers."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .. import DiagnoseSettings, LoadOptions, defaults, parse_probe
from ..errors import UsageError
from ..files import json_text
from ..preflight import check_prompt_source, read_saved_result
from ..setting import setting
from .declared import Given, command, options
from .options import (
    HEATMAP_HELP,
    OptionalModel,
    bar_columns,
    check_inputs,
    findings_budget,
    findings_shown,
    progress,
    quiet_output,
)
from .page_files import PageFiles


def scorers_command(
    spec: str = typer.Argument(None, help="A scorer spec to resolve, e.g. 'ssa:init=faithful'."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
) -> None:
    """List the attention scorers and their properties, or show what one SPEC resolves to."""
    from .. import scorer_table

    if spec is not None:
        _describe(spec, as_json)
        return
    rows = scorer_table()
    if as_json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    table = Table(title=f"ssacli scorers ({len(rows)})", title_justify="left")
    for column in ("name", "trainable", "sums to 1", "shift-inv", "as x → c·x, c → ∞", "fusable"):
        table.add_column(column, no_wrap=column == "name")
    for row in rows:
        table.add_row(
            f"[bold]{row['name']}[/]",
            ", ".join(row["trainable"]) or "–",
            row["rows_sum_to_one"],
            row["shift_invariant"],
            row["limit"],
            row["fusable"],
        )
    console = Console()
    console.print(table)
    console.print(
        "Build one with a spec, NAME or NAME:key=value,… e.g. ssa:init=faithful,m=256. "
        "Options and formulas: `ssacli scorers --json`, docs/scorers.md."
    )


def _describe(spec: str, as_json: bool) -> None:
    from .. import describe_scorer

    info = describe_scorer(spec)
    if as_json:
        typer.echo(json.dumps(info, indent=2, ensure_ascii=False))
        return
    console = Console()
    console.print(f"[bold]{info['spec']}[/]: {info['summary']}", highlight=False)
    for key, value in info["applied"].items():
        console.print(f"  {key} = {'(preset)' if value is None else value}", highlight=False)
    for key, value in info["initial_values"].items():
        state = "learned" if key in info["learned"] else "frozen"
        console.print(f"  initial {key} = {value:g} ({state})", highlight=False)


@dataclass(frozen=True)
class DiagnoseOutputs:
    """diagnose's options that only the command line has, its files aside (:class:`PageFiles`): a
    second model or result to compare with, and what the terminal shows."""

    compare: str | None = setting(
        None, "Another MODEL (same settings) or a --json result to compare.", type=str
    )
    heatmap: str = setting(defaults.HEATMAP, HEATMAP_HELP)
    findings: str | None = findings_shown()
    quiet: bool = quiet_output()


DIAGNOSE_OPTIONS = (
    options(DiagnoseSettings, exclude=("strict", "generate")),
    LoadOptions,
    options(DiagnoseSettings, "strict", "generate"),
    options(DiagnoseOutputs, "compare"),
    options(
        PageFiles,
        json_out={"help": "Write the result (versioned schema) to this file; - for stdout."},
        html_out={"help": "Write a self-contained HTML report to this file."},
    ),
    options(DiagnoseOutputs, "heatmap", "findings", "quiet"),
)


@command(*DIAGNOSE_OPTIONS)
def diagnose_command(model_ref: OptionalModel = defaults.DEFAULT_MODEL, *, given: Given) -> None:
    r"""Probe MODEL with magnitude shifts and report per-layer, per-head attention saturation.

    Examples:

      ssacli diagnose                     # the bundled ICL model

      ssacli diagnose ./my-model --probe outlier:10,100,1000 \
          --json out.json --html out.html

      ssacli diagnose builtin:every-softmax --compare builtin:every-ssa

      ssacli diagnose ./my-lm --text mine.txt --shift code.txt --probe shift
    """
    out, files = given.of(DiagnoseOutputs), given.of(PageFiles)
    files.check()  # first: before any heavy import
    probes = [parse_probe(p) for p in given.probes] if given.probes else None  # torch-free, like check_inputs
    shown = findings_budget(out.findings)
    other_model = None if out.compare is None or _is_result_file(out.compare) else out.compare
    if out.compare is not None and other_model is None:
        read_saved_result(out.compare)  # there, and a result: before any model loads
    scorers, models = [given.scorer], [model_ref, other_model]
    check_inputs(scorers=scorers, models=models, offline=given.offline, revision=given.revision,
                 device=given.device, allow_pickle=given.allow_pickle, dtype=given.dtype,
                 device_map=given.device_map, max_memory=given.max_memory)  # fmt: skip
    for ref in models:  # an ICL model takes no --text
        check_prompt_source(ref, text=given.text is not None)
    heatmap = _heatmap(out.heatmap, probes)
    settings, load = _settings(given, probes), given.of(LoadOptions)
    result = _diagnose(model_ref, settings, load, out.quiet)
    other = None if out.compare is None else _compare_target(out.compare, settings, load, out.quiet)
    _report(result, other, out, files, heatmap, shown)


def _heatmap(text: str, probes: list | None) -> tuple[str, str | None]:
    """--heatmap METRIC[@PROBE] as (metric, probe or None), refused before any model loads when it
    names no metric, or a probe that is not among the --probe options."""
    from .. import METRICS

    metric, _, heat_probe = text.partition("@")
    if metric not in METRICS:
        raise UsageError(f"unknown metric '{metric}' for --heatmap; choose from: {', '.join(METRICS)}")
    if heat_probe and probes and heat_probe not in {p.name for p in probes}:
        raise UsageError(f"--heatmap names probe '{heat_probe}', which is not among the --probe options")
    return metric, heat_probe or None


def _settings(given: Given, probes: list | None):
    """The DiagnoseSettings of the options: --text and --shift are files, read into the settings."""
    from ..preflight import read_text_file

    text, shift = given.text, given.shift
    return given.of(
        DiagnoseSettings, probes=probes, text=read_text_file(text) if text else None,
        shift=read_text_file(shift, "--shift") if shift else None,
        shift_name=shift.name if shift else "shift",
    )  # fmt: skip


def _report(result, other, out: DiagnoseOutputs, files: PageFiles, heatmap: tuple, shown: int | None) -> None:
    """The terminal report (unless --quiet), then the files: every output is rendered before the
    first is written, so one that cannot be rendered leaves none."""
    console = Console()
    if not out.quiet:
        from .. import render

        metric, heat_probe = heatmap
        render(
            result, other, console=console, heatmap_metric=metric, heatmap_probe=heat_probe, findings=shown
        )

    def document() -> str:
        from .. import compare_results

        return json_text(result.to_dict() if other is None else compare_results(result, other))

    def page() -> str:
        from .. import render_html

        return render_html(result, other)

    files.write(console, document, page, lambda: _figures(result, other))


def _figures(*results) -> list:
    """The report's named figures (--png, --svg): one result's, or a comparison's."""
    from .. import render_figures

    return render_figures(*results)


def _compare_target(ref: str, settings, load, quiet: bool):
    """--compare: a --json result file, or another model diagnosed with the same settings."""
    from .. import DiagnoseResult

    if _is_result_file(ref):
        return DiagnoseResult.load(ref)
    return _diagnose(ref, settings, replace(load, revision=None), quiet)  # --revision is MODEL's


def _is_result_file(ref: str) -> bool:
    """Whether --compare names a --json result (else it names a MODEL): a name ending in .json that
    is no folder, there or not (a Hub id ending in .json would be odd; a missing file is said so)."""
    return ref.endswith(".json") and not Path(ref).is_dir()


def diagnose_columns() -> list:
    """The diagnose bar: done/total of the forward passes (blank while the model loads and their
    count is unknown), time so far, and time left once the first pass has given a rate."""
    from rich.progress import TimeElapsedColumn, TimeRemainingColumn

    return bar_columns(TimeElapsedColumn(), TimeRemainingColumn())


def _diagnose(model_ref: str, settings, load, quiet: bool):
    """diagnose_with() with a progress bar on stderr (only on a terminal, and not --quiet)."""
    from .. import diagnose_with

    columns = diagnose_columns()
    with progress(f"loading {model_ref}", columns, quiet=quiet, total=None) as update:

        def on_progress(what: str, done: int, total: int) -> None:
            update(description=f"{model_ref}: {what}", completed=done, total=total)

        return diagnose_with(model_ref, settings, load, progress=None if update is None else on_progress)
