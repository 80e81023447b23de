"""The `ssacli` command line: a thin Typer layer over the public API in ssacli/__init__.py.

Errors a user can cause (ssacli.errors.SsacliError) print one line and exit with their documented
code; anything else prints one line too, unless --debug asks for the traceback.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from functools import partial
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from .. import __version__
from ..errors import InterruptError, SsacliError, UsageError
from ..files import check_writable, write_json
from ..scorers import describe_scorer, make_scorer, scorer_table


class _Commands(TyperGroup):
    """ssacli's command group: Ctrl-C inside a command ends like every other error, in one line and
    a documented exit code (130), rather than click's silent exit."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as err:
            raise InterruptError(
                "interrupted; no file was left half-written (ssacli writes whole files or none), "
                "rerun the command to finish"
            ) from err


_TRUST_HELP = "Run the Python code the checkpoint ships (auto_map); only for code you have read."

app = typer.Typer(
    cls=_Commands,
    name="ssacli",
    help="Attention-saturation diagnostics: swap softmax for SSA and other scorers, measure collapse.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ssacli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    _state["debug"] = debug


@app.command("scorers")
def scorers_command(
    spec: str = typer.Argument(None, help="A scorer spec to resolve, e.g. 'ssa:init=faithful'."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
) -> None:
    """List the attention scorers and their properties, or show what one SPEC resolves to."""
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
    info = describe_scorer(spec)
    if as_json:
        typer.echo(json.dumps(info, indent=2, ensure_ascii=False))
        return
    console = Console()
    console.print(f"[bold]{info['spec']}[/]: {info['summary']}", highlight=False)
    for key, value in info["options"].items():
        console.print(f"  {key} = {'(preset)' if value is None else value}", highlight=False)
    for key, value in info["initial_values"].items():
        state = "learned" if key in info["learned"] else "frozen"
        console.print(f"  initial {key} = {value:g} ({state})", highlight=False)


@app.command("diagnose")
def diagnose_command(
    model_ref: str = typer.Argument(
        "builtin:every-softmax", metavar="[MODEL]", help="HF folder, builtin:NAME, or cached Hub id."
    ),
    probe: list[str] = typer.Option(
        None, help="NAME or NAME:L1,L2,… (repeatable; default: all that apply), e.g. outlier:10,100."
    ),
    scorer: str = typer.Option(None, help="Re-score attention with this spec first, e.g. ssa:init=faithful."),
    text: Path = typer.Option(None, help="UTF-8 text file to probe with (default: built-in texts)."),
    random_ids: bool = typer.Option(False, "--random", help="Probe with random token ids."),
    samples: int = typer.Option(8, min=1, help="Sequences per probe level."),
    length: int = typer.Option(None, min=2, help="Base length in tokens (ICL: points); default 64 (40)."),
    batch_size: int = typer.Option(8, min=1, help="Sequences per forward pass."),
    seed: int = typer.Option(0, help="Seed of inputs, targets and numbers."),
    tau: float = typer.Option(0.9, help="A row has collapsed when its largest weight is >= tau."),
    top_k: int = typer.Option(5, min=1, help="k of the top-k mass metric."),
    block_size: int = typer.Option(256, min=1, help="Query rows scored at a time (memory O(block × keys))."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    dtype: str = typer.Option("auto", help="auto (float32 on CPU), float32, bfloat16 or float16."),
    allow_download: bool = typer.Option(False, "--allow-download", help="Fetch a Hub id not in the cache."),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Load .bin weights (weights_only=True)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=_TRUST_HELP),
    compare: str = typer.Option(None, help="Another MODEL (same settings) or a --json result to compare."),
    json_out: Path = typer.Option(None, "--json", help="Write the result (versioned schema) to this file."),
    html_out: Path = typer.Option(None, "--html", help="Write a self-contained HTML report to this file."),
    heatmap: str = typer.Option("max_weight", help="Heatmap METRIC[@PROBE], e.g. collapse_rate@outlier."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but errors and written files."),
) -> None:
    """Probe MODEL with magnitude shifts and report per-layer, per-head attention saturation.

    Examples:

      ssacli diagnose                                  # the bundled ICL model

      ssacli diagnose ./my-model --probe outlier:10,100,1000 --json out.json --html out.html

      ssacli diagnose builtin:every-softmax --compare builtin:every-ssa
    """
    from ..diagnosis.probes import parse_probe
    from ..diagnosis.result import METRICS
    from ..diagnosis.run import diagnose
    from ..quality.inputs import read_text_file

    probes = [parse_probe(p) for p in probe] if probe else None  # bad specs fail before loading
    if scorer is not None:
        make_scorer(scorer)
    metric, _, heat_probe = heatmap.partition("@")
    if metric not in METRICS:
        raise UsageError(f"unknown metric '{metric}' for --heatmap; choose from: {', '.join(METRICS)}")
    if heat_probe and probes and heat_probe not in {p.name for p in probes}:
        raise UsageError(f"--heatmap names probe '{heat_probe}', which is not among the --probe options")
    for option, path in (("--json", json_out), ("--html", html_out)):
        if path is not None:
            check_writable(path, option)
    settings = dict(
        probes=probes, scorer=scorer, text=read_text_file(text) if text else None, random_ids=random_ids,
        samples=samples, length=length, batch_size=batch_size, seed=seed, tau=tau, top_k=top_k,
        block_size=block_size, device=device, dtype=dtype, allow_download=allow_download,
        allow_pickle=allow_pickle,
    )  # fmt: skip
    if trust_remote_code:  # the API loads without remote code; load here, with it
        settings["load"] = partial(
            load_trusted, device=device, dtype=dtype, allow_download=allow_download, allow_pickle=allow_pickle
        )
    console = Console()
    result = _diagnose_with_progress(diagnose, model_ref, settings, quiet)
    other = None
    if compare is not None:
        other = _compare_target(diagnose, compare, settings, quiet)
    if not quiet:
        from ..report.terminal import render_comparison, render_diagnose

        if other is None:
            render_diagnose(result, console, heatmap_metric=metric, heatmap_probe=heat_probe or None)
        else:
            render_comparison(result, other, console)
    if json_out is not None:
        from ..diagnosis.result import compare_results

        data = result.to_dict() if other is None else compare_results(result, other)
        write_json(data, json_out)
        console.print(f"wrote {json_out}", highlight=False)
    if html_out is not None:
        from ..files import write_text
        from ..report.html import comparison_html, diagnose_html

        write_text(diagnose_html(result) if other is None else comparison_html(result, other), html_out)
        console.print(f"wrote {html_out}", highlight=False)


def _compare_target(diagnose, ref: str, settings: dict, quiet: bool):
    """--compare: a --json result file, or another model diagnosed with the same settings."""
    from ..diagnosis.result import DiagnoseResult

    if ref.endswith(".json") and Path(ref).is_file():
        return DiagnoseResult.load(ref)
    return _diagnose_with_progress(diagnose, ref, settings, quiet)


def load_trusted(ref: str, **load):
    """MODEL loaded with --trust-remote-code, for the API functions that take a loaded model."""
    from ..models.loading import load_model

    return load_model(ref, trust_remote_code=True, **load)


def _diagnose_with_progress(diagnose, model_ref: str, settings: dict, quiet: bool):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    settings = dict(settings)
    load = settings.pop("load", None)
    model = load(model_ref) if load is not None else model_ref
    stderr = Console(stderr=True)
    if quiet or not stderr.is_terminal:
        return diagnose(model, **settings)
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")]
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True) as progress:
        bar = progress.add_task(f"diagnosing {model_ref}", total=None)

        def on_progress(what: str, done: int, total: int) -> None:
            progress.update(bar, description=f"{model_ref}: {what}", completed=done, total=total)

        return diagnose(model, progress=on_progress, **settings)


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--{what} takes comma-separated numbers, e.g. 1,2,4; got {text!r}") from None


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a command like Ctrl-C: cleanups run, one line, exit 130


def main() -> None:
    """Console-script entry point: map errors to one line and a documented exit code."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    try:
        app()
    except SsacliError as err:
        if _state["debug"]:
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
    except Exception as err:  # a bug: say so in one line, keep the traceback for --debug
        if _state["debug"]:
            raise
        Console(stderr=True).print(
            f"[bold red]internal error:[/] {type(err).__name__}: {escape(str(err))} "
            "(rerun with --debug for the traceback)",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


# Commands defined in their own modules register themselves on `app` when imported.
from . import check, convert, icl, report, train  # noqa: E402, F401
