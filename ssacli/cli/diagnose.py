"""`ssacli diagnose` and `ssacli scorers`: probe a model's attention, list and resolve scorers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import typer
from rich.console import Console
from rich.table import Table

from .. import defaults, parse_probe
from ..errors import UsageError
from ..files import json_text
from .options import (
    HEATMAP_HELP,
    AllowDownload,
    AllowPickle,
    Device,
    DeviceMap,
    Dtype,
    FindingsShown,
    MaxMemory,
    Offline,
    OptionalModel,
    OverwriteFiles,
    PngDir,
    QuietOutput,
    Revision,
    Strict,
    SvgDir,
    TrustRemoteCode,
    bar_columns,
    check_inputs,
    check_outputs,
    findings_budget,
    load_options,
    progress,
)
from .outputs import check_figure_outputs, figure_outputs, write_figure_outputs, write_output


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


def diagnose_command(
    model_ref: OptionalModel = defaults.DEFAULT_MODEL,
    probe: list[str] = typer.Option(
        None, help="NAME or NAME:L1,L2,… (repeatable; default: all that apply), e.g. outlier:10,100."
    ),
    scorer: str = typer.Option(None, help="Re-score attention with this spec first, e.g. ssa:init=faithful."),
    text: Path = typer.Option(None, help="UTF-8 text file to probe with (default: built-in texts)."),
    shift: Path = typer.Option(
        None,
        metavar="FILE",
        help="A shifted corpus (UTF-8 text: another domain, language, code…): adds the 'shift' probe, "
        "--text's documents against FILE's, matched in length, with per-document loss and collapse.",
    ),
    random_ids: bool = typer.Option(
        False, "--random", help="Probe with random token ids (needed for a model without a tokenizer)."
    ),
    samples: int = typer.Option(defaults.SAMPLES, min=1, help="Sequences per probe level."),
    length: int = typer.Option(
        None,
        min=2,
        help=f"Base length in tokens (ICL: points); default {defaults.PROBE_LENGTH} ({defaults.ICL_POINTS}).",
    ),
    batch_size: int = typer.Option(defaults.BATCH_SIZE, min=1, help="Sequences per forward pass."),
    seed: int = typer.Option(defaults.SEED, help="Seed of inputs, targets and numbers."),
    tau: float = typer.Option(defaults.TAU, help="A row has collapsed when its largest weight is >= tau."),
    top_k: int = typer.Option(defaults.TOP_K, min=1, help="k of the top-k mass metric."),
    sink_k: int = typer.Option(
        defaults.SINK_K, min=1, help="The first k tokens of the sink metrics (sink@k, boost)."
    ),
    block_size: int = typer.Option(
        defaults.BLOCK_ROWS, min=1, help="Query rows scored at a time (memory O(block × keys))."
    ),
    stats: str = typer.Option(
        defaults.STATS,
        metavar="MODE",
        help="eager: metrics from blocks of weights; fused: from running row statistics of one "
        "blocked pass (softmax, temperature, ssa, ssmax, sink, softmax1); auto: fused where it applies.",
    ),
    device: Device = defaults.DEVICE,
    dtype: Dtype = defaults.DTYPE,
    offline: Offline = False,
    revision: Revision = None,
    allow_download: AllowDownload = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemoteCode = False,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    strict: Strict = False,
    generate: int = typer.Option(
        None,
        min=1,
        metavar="N",
        help="Also greedy-generate N tokens after each prompt and measure every decoding step's "
        "attention against the KV cache (checked against a full recomputation).",
    ),
    compare: str = typer.Option(None, help="Another MODEL (same settings) or a --json result to compare."),
    json_out: Path = typer.Option(
        None, "--json", help="Write the result (versioned schema) to this file; - for stdout."
    ),
    html_out: Path = typer.Option(None, "--html", help="Write a self-contained HTML report to this file."),
    overwrite: OverwriteFiles = False,
    png: PngDir = None,
    svg: SvgDir = None,
    heatmap: str = typer.Option(defaults.HEATMAP, help=HEATMAP_HELP),
    findings: FindingsShown = None,
    quiet: QuietOutput = False,
) -> None:
    r"""Probe MODEL with magnitude shifts and report per-layer, per-head attention saturation.

    Examples:

      ssacli diagnose                     # the bundled ICL model

      ssacli diagnose ./my-model --probe outlier:10,100,1000 \
          --json out.json --html out.html

      ssacli diagnose builtin:every-softmax --compare builtin:every-ssa

      ssacli diagnose ./my-lm --text mine.txt --shift code.txt --probe shift
    """
    check_outputs(("--json", json_out), ("--html", html_out), overwrite=overwrite)  # before any heavy import
    check_figure_outputs(png, svg)
    probes = [parse_probe(p) for p in probe] if probe else None  # torch-free, like check_inputs
    shown = findings_budget(findings)
    other_model = None if compare is None or _is_result_file(compare) else compare
    check_inputs(scorers=[scorer], models=[model_ref, other_model], offline=offline, revision=revision)
    from .. import METRICS, DiagnoseSettings
    from ..preflight import read_text_file

    metric, _, heat_probe = heatmap.partition("@")
    if metric not in METRICS:
        raise UsageError(f"unknown metric '{metric}' for --heatmap; choose from: {', '.join(METRICS)}")
    if heat_probe and probes and heat_probe not in {p.name for p in probes}:
        raise UsageError(f"--heatmap names probe '{heat_probe}', which is not among the --probe options")
    run = _Run(
        probes,
        DiagnoseSettings(
            text=read_text_file(text) if text else None, random_ids=random_ids, samples=samples,
            shift=read_text_file(shift, "--shift") if shift else None,
            shift_name=shift.name if shift else "shift",
            length=length, batch_size=batch_size, seed=seed, tau=tau, top_k=top_k, block_size=block_size,
            stats=stats, sink_k=sink_k,
        ),
        load_options(
            device, dtype, allow_download, allow_pickle, trust_remote_code, device_map, max_memory,
            offline=offline, revision=revision,
        ),
        scorer, strict, generate,
    )  # fmt: skip
    console = Console()
    result = _diagnose(model_ref, run, quiet)
    other = None if compare is None else _compare_target(compare, run, quiet)
    if not quiet:
        from .. import render

        render(
            result, other, console=console, heatmap_metric=metric, heatmap_probe=heat_probe or None,
            findings=shown,
        )
    # every output rendered before the first is written: one that cannot be rendered leaves none
    outputs = []
    if json_out is not None:
        from .. import compare_results

        data = result.to_dict() if other is None else compare_results(result, other)
        outputs.append((json_text(data), json_out))
    if html_out is not None:
        from .. import render_html

        outputs.append((render_html(result, other), html_out))
    figures = figure_outputs(lambda: _figures(result, other), png, svg)
    for text, path in outputs:
        write_output(text, path, console)
    write_figure_outputs(figures, console)


def _figures(*results) -> list:
    """The report's named figures (--png, --svg): one result's, or a comparison's."""
    from .. import render_figures

    return render_figures(*results)


class _Run(NamedTuple):
    """One diagnose_with call's arguments but the model (--compare runs the same on another)."""

    probes: list | None
    settings: Any  # DiagnoseSettings
    load: Any  # LoadOptions
    scorer: str | None
    strict: bool
    generate: int | None


def _compare_target(ref: str, run: _Run, quiet: bool):
    """--compare: a --json result file, or another model diagnosed with the same settings."""
    from .. import DiagnoseResult

    if _is_result_file(ref):
        return DiagnoseResult.load(ref)
    return _diagnose(ref, run._replace(load=replace(run.load, revision=None)), quiet)  # --revision is MODEL's


def _is_result_file(ref: str) -> bool:
    """Whether --compare names a --json result (else it names a MODEL)."""
    return ref.endswith(".json") and Path(ref).is_file()


def diagnose_columns() -> list:
    """The diagnose bar: done/total of the forward passes (blank while the model loads and their
    count is unknown), time so far, and time left once the first pass has given a rate."""
    from rich.progress import TimeElapsedColumn, TimeRemainingColumn

    return bar_columns(TimeElapsedColumn(), TimeRemainingColumn())


def _diagnose(model_ref: str, run: _Run, quiet: bool):
    """diagnose_with() with a progress bar on stderr (only on a terminal, and not --quiet)."""
    from .. import diagnose_with

    columns = diagnose_columns()
    with progress(f"loading {model_ref}", columns, quiet=quiet, total=None) as update:

        def on_progress(what: str, done: int, total: int) -> None:
            update(description=f"{model_ref}: {what}", completed=done, total=total)

        return diagnose_with(
            model_ref, run.probes, run.settings, run.load, scorer=run.scorer, strict=run.strict,
            generate=run.generate, progress=None if update is None else on_progress,
        )  # fmt: skip
