"""The `ssacli` command line: a thin Typer layer over the public API in ssacli/__init__.py.

Errors a user can cause (ssacli.errors.SsacliError) print one line and exit with their documented
code; anything else prints one line too, unless --debug asks for the traceback.
"""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import SsacliError
from .scorers import describe_scorer, scorer_table

app = typer.Typer(
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


def main() -> None:
    """Console-script entry point: map errors to one line and a documented exit code."""
    try:
        app()
    except SsacliError as err:
        if _state["debug"]:
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
    except Exception as err:  # a bug: say so in one line, keep the traceback for --debug
        if _state["debug"]:
            raise
        Console(stderr=True).print(
            f"[bold red]internal error:[/] {type(err).__name__}: {err} "
            "(rerun with --debug for the traceback)",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
