"""`ssacli check`: gate a model on attention-saturation requirements (exit 0 pass, 1 fail).

Unlike the other commands, check ends with CI-oriented exit codes (docs/ci.md), which
ssacli.errors.check_exit_code maps errors to: 2 for anything the user can fix in the invocation or
its inputs, 3 for a model or run that cannot be checked, so a pipeline can tell "the model
regressed" (1) from "the gate is misconfigured" (2) and "the tool broke" (3). Every output is
rendered before the first file is written, so a failed run leaves no file behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..defaults import DEFAULT_MODEL
from ..errors import EXIT_CHECK_FAILED, EXIT_CHECK_PASSED, UsageError, check_exit_code
from ..files import check_writable, write_text
from .options import AllowDownload, AllowPickle, Device, Dtype, debugging, print_error, progress

CONFIG_FILE = "ssacli.toml"


def check_command(
    model_ref: str = typer.Argument(
        None, metavar="[MODEL]", help="HF folder, builtin:NAME or cached Hub id (default: the config's)."
    ),
    config: Path = typer.Option(None, help=f"Config file (default: ./{CONFIG_FILE} when it exists)."),
    require: list[str] = typer.Option(
        None,
        "--require",
        "-r",
        help="A requirement (repeatable; replaces the config's), e.g. "
        "'collapse_rate@outlier:100 max <= 0.2'.",
    ),  # fmt: skip
    baseline: Path = typer.Option(None, help="An earlier `check --json` or `diagnose --json` file."),
    max_regression: float = typer.Option(
        None, help="Fail when a metric moves this far (absolute) towards saturation vs --baseline."
    ),
    junit: Path = typer.Option(None, help="Write a JUnit XML report (one testcase per requirement)."),
    json_out: Path = typer.Option(None, "--json", help="Write the check (and its result) as JSON."),
    samples: int = typer.Option(None, min=1, help="Inputs per probe level (default 8)."),
    seed: int = typer.Option(None, help="Seed of the probe inputs (default 0)."),
    length: int = typer.Option(None, min=2, help="Base length in tokens (ICL: points)."),
    tau: float = typer.Option(None, help="A row has collapsed when its largest weight is >= tau (0.9)."),
    scorer: str = typer.Option(None, help="Re-score attention with this spec first, e.g. ssa."),
    device: Device = None,
    dtype: Dtype = None,
    allow_download: AllowDownload = False,
    allow_pickle: AllowPickle = False,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only failures, errors and written files."),
    init: bool = typer.Option(False, "--init", help=f"Write {CONFIG_FILE} with defaults for MODEL, exit."),
) -> None:
    r"""Check MODEL against attention-saturation requirements; exit 0 if all pass, 1 if any fails.

    A requirement is METRIC@PROBE:LEVEL\[layer=A-B,head=H] \[mean|max|min] OP VALUE. Only the
    probe levels the requirements name are run. Exit codes: 0 pass, 1 a requirement failed,
    2 usage or input error, 3 the model cannot be checked. Grammar and CI recipes: docs/ci.md.

    Examples:

      ssacli check --init                                 # write ssacli.toml for the bundled model

      ssacli check                                        # run the requirements in ./ssacli.toml

      ssacli check ./my-model -r 'collapse_rate@outlier:100 max <= 0.2' -r 'entropy@embed-scale:16 >= 0.3'

      ssacli check --baseline main.json --max-regression 0.05 --junit junit.xml --json check.json
    """
    options = dict(
        config=config, require=require, baseline=baseline, max_regression=max_regression, junit=junit,
        json_out=json_out, quiet=quiet, diagnose={
            "samples": samples, "seed": seed, "length": length, "tau": tau, "scorer": scorer,
            "device": device, "dtype": dtype, "allow_download": allow_download, "allow_pickle": allow_pickle,
        },
    )  # fmt: skip
    try:
        code = _init(model_ref, config) if init else _check(model_ref, **options)
    except Exception as err:  # a bad gate, a model that cannot be checked, a bug: one line
        if debugging():
            raise
        code = check_exit_code(err)
        print_error(err)
    raise typer.Exit(code)


def _check(model_ref, *, config, require, baseline, max_regression, junit, json_out, quiet, diagnose) -> int:
    from .. import parse_requirement, run_check
    from ..check.config import load_config

    if config is None and Path(CONFIG_FILE).is_file():
        config = Path(CONFIG_FILE)
    settings: dict[str, Any] = load_config(config) if config is not None else {}
    flags = {"requires": require or None, "baseline": baseline, "max_regression": max_regression}
    settings.update({k: v for k, v in {**flags, **diagnose}.items() if v is not None and v is not False})
    model = model_ref or settings.pop("model", DEFAULT_MODEL)
    settings.pop("model", None)
    requires = [parse_requirement(r) for r in settings.pop("requires", [])]  # fail before loading
    if not requires:
        where = f"'{config}' lists none under [check] requires" if config else f"no {CONFIG_FILE} here"
        raise UsageError(
            f"no requirements ({where}); pass --require EXPR or write one with `ssacli check --init`"
        )
    for option, path in (("--junit", junit), ("--json", json_out)):
        if path is not None:
            check_writable(path, option)  # a folder, or nowhere writable: fail before any work
    for key in ("tau", "max_regression"):
        if key in settings:
            settings[key] = float(settings[key])
    with progress(f"ssacli check {model}", quiet=quiet) as update:

        def on_progress(what: str, done: int, total: int) -> None:
            update(description=f"ssacli check {model}: {what} {done}/{total}")

        shown = {} if update is None else {"progress": on_progress}  # no callback without a display
        report = run_check(model, requires, **shown, **settings)
    outputs = []  # rendered in full before the first file is written
    if junit is not None:
        outputs.append((report.junit_xml(), junit))
    if json_out is not None:
        outputs.append((json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n", json_out))
    _render(report, quiet)
    console = Console()
    for text, path in outputs:
        write_text(text, path)
        console.print(f"wrote {path}", highlight=False)
    return EXIT_CHECK_PASSED if report.passed else EXIT_CHECK_FAILED


def _render(report, quiet: bool) -> None:
    """A table for humans; with --quiet only the failures, one line each, on stderr."""
    stderr = Console(stderr=True)
    for warning in report.warnings:
        stderr.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    if quiet:
        for req, out in zip(report.requirements, report.outcomes):
            if not out.passed:
                stderr.print(
                    f"FAIL {escape(req.text)}: {escape(out.message)}", highlight=False, soft_wrap=True
                )
        return
    with_base = report.baseline_file is not None
    table = Table(title=f"ssacli check · {escape(report.model)}", title_justify="left")
    table.add_column("requirement", overflow="fold")
    for name in ("measured", *(("baseline", "Δ") if with_base else ()), "result"):
        table.add_column(name, justify="left" if name == "result" else "right", no_wrap=True, min_width=6)
    for req, out in zip(report.requirements, report.outcomes):
        row = [escape(req.text), _num(out.measured)]
        if with_base:
            delta = None if out.baseline is None else out.measured - out.baseline
            row += [_num(out.baseline), "–" if delta is None else f"{delta:+.4g}"]
        row.append("[green]PASS[/]" if out.passed else "[bold red]FAIL[/]")
        table.add_row(*row)
    console = Console()
    console.print(table)
    for req, out in zip(report.requirements, report.outcomes):
        if not out.passed:
            console.print(
                f"[bold red]FAIL[/] {escape(req.text)}: {escape(out.message)}",
                highlight=False,
                soft_wrap=True,
            )
    total = len(report.outcomes)
    verdict = (
        f"[green]all {total} requirements passed[/]"
        if report.passed
        else f"[bold red]{report.failures} of {total} requirements failed[/]"
    )
    console.print(verdict, highlight=False)


def _num(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:.4g}"


def _init(model_ref: str | None, config: Path | None) -> int:
    """--init: write a commented ssacli.toml for MODEL's kind; never overwrite one."""
    from ..check.config import init_config

    target = config or Path(CONFIG_FILE)
    if target.exists():
        raise UsageError(f"'{target}' already exists; edit it, or remove it to write fresh defaults")
    model = model_ref or DEFAULT_MODEL
    check_writable(target, "--config")
    kind = model_kind(model)
    from .. import diagnose
    from ..check.config import INIT_PROBES, measured_requires
    from ..defaults import SAMPLES, SEED

    with progress(f"measuring {model} for {target}", quiet=False):
        result = diagnose(model, list(INIT_PROBES), samples=SAMPLES, seed=SEED)
    requires = measured_requires(result)
    local = Path(model).expanduser()
    if not model.startswith("builtin:") and local.exists():  # config paths are relative to the file
        model = Path(os.path.relpath(local.resolve(), target.resolve().parent)).as_posix()
    write_text(init_config(kind, model, requires), target)
    article = "an" if kind == "icl" else "a"
    Console().print(
        f"wrote {target} (requirements measured on {article} {kind} model; see the comments)", highlight=False
    )
    return EXIT_CHECK_PASSED


def model_kind(ref: str) -> str:
    """icl, causal, masked, encoder or seq2seq, read from the checkpoint's config alone (no weights
    are loaded, so --init is instant even for large models)."""
    from ..models.kinds import is_local_reference, kind_from_config
    from ..models.loading import resolve_model_path

    return kind_from_config(resolve_model_path(ref) if is_local_reference(ref) else ref, name=ref)
