"""`ssacli check`: gate a model on attention-saturation requirements (exit 0 pass, 1 fail).

Unlike the other commands, check ends with CI-oriented exit codes (docs/ci.md), which
ssacli.errors.check_exit_code maps errors to: 2 for anything the user can fix in the invocation or
its inputs, 3 for a model or run that cannot be checked, so a pipeline can tell "the model
regressed" (1) from "the gate is misconfigured" (2) and "the tool broke" (3). Every output is
rendered before the first file is written, so a failed run leaves no file behind. The settings
(flags over ssacli.toml) are :func:`ssacli.check_settings`'s, --init is :func:`ssacli.write_check_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import DiagnoseSettings, LoadOptions, defaults
from ..defaults import DEFAULT_MODEL
from ..errors import EXIT_CHECK_FAILED, EXIT_CHECK_PASSED, UsageError, check_exit_code, check_exit_codes_text
from ..preflight import CHECK_CONFIG_FILE
from ..setting import setting
from .declared import Given, command, help_of, options
from .options import (
    check_inputs,
    check_outputs,
    debugging,
    output_file,
    overwrite_files,
    print_error,
    progress,
)
from .options import (
    given as given_only,
)
from .outputs import write_output


@dataclass(frozen=True)
class CheckOptions:
    """check's options that only the command line has: the gate (config, requirements, baseline),
    the files written, what the terminal shows, and --init."""

    config: Path | None = setting(
        None, f"Config file (default: ./{CHECK_CONFIG_FILE} when it exists).", type=Path
    )
    require: list[str] | None = setting(
        None,
        "A requirement (repeatable; replaces the config's), e.g. 'collapse_rate@outlier:100 max <= 0.2'.",
        flags=("--require", "-r"),
        type=list[str],
    )
    baseline: Path | None = setting(None, "An earlier `check --json` or `diagnose --json` file.", type=Path)
    max_regression: float | None = setting(
        None, "Fail when a metric moves this far (absolute) towards saturation vs --baseline.", type=float
    )
    junit: Path | None = output_file("--junit", "Write a JUnit XML report (one testcase per requirement).")
    json_out: Path | None = output_file("--json", "Write the check (and its result) as JSON; - for stdout.")
    overwrite: bool = overwrite_files()
    quiet: bool = setting(False, "Print only failures, errors and written files.", flags=("--quiet", "-q"))
    init: bool = setting(False, f"Write {CHECK_CONFIG_FILE} with defaults for MODEL, exit.")


# the probe settings a check takes: None (not given) leaves the config's, then the defaults
PROBE_SETTINGS = ("samples", "seed", "length", "tau", "scorer", "random_ids")
CHECK_OPTIONS = (
    options(CheckOptions, exclude=("quiet", "init")),
    options(
        DiagnoseSettings,
        *PROBE_SETTINGS,
        samples={"default": None, "help": f"Inputs per probe level (default {defaults.SAMPLES})."},
        seed={"default": None, "help": f"Seed of the probe inputs (default {defaults.SEED})."},
        length={"help": "Base length in tokens (ICL: points)."},
        tau={"default": None, "help": help_of(DiagnoseSettings, "tau", f"{defaults.TAU:g}")},
        scorer={"help": "Re-score attention with this spec first, e.g. ssa."},
    ),  # fmt: skip
    options(LoadOptions, device={"default": None}, dtype={"default": None}),
    options(DiagnoseSettings, "strict"),
    options(CheckOptions, "quiet", "init"),
)
LOADING = (
    "allow_download",
    "allow_pickle",
    "trust_remote_code",
    "device_map",
    "max_memory",
    "offline",
    "revision",
)


@command(*CHECK_OPTIONS)
def check_command(
    model_ref: str = typer.Argument(
        None, metavar="MODEL", help=r"HF folder, builtin:NAME, Hub id org/name\[@REV] (default: config's)."
    ),
    *,
    given: Given,
) -> None:
    r"""Check MODEL against attention-saturation requirements; exit 0 if all pass, 1 if any fails.

    A requirement is METRIC@PROBE:LEVEL\[layer=A-B,head=H] \[mean|max|min] OP VALUE. Only the
    probe levels the requirements name are run. Exit codes: {exit_codes}.
    Grammar and CI recipes: docs/ci.md.

    Examples:

      ssacli check --init        # write ssacli.toml for the bundled model

      ssacli check               # run the requirements in ./ssacli.toml

      ssacli check ./my-model -r 'collapse_rate@outlier:100 max <= 0.2' \
          -r 'entropy@embed-scale:16 >= 0.3'

      ssacli check --baseline main.json --max-regression 0.05 \
          --junit junit.xml --json check.json
    """
    load = {name: getattr(given, name) for name in LOADING} | {"max_memory": given.max_memory or None}
    out = given.of(CheckOptions)
    try:
        code = _init(model_ref, out, given, load) if out.init else _check(model_ref, out, given, load)
    except Exception as err:  # a bad gate, a model that cannot be checked, a bug: one line
        if debugging():
            raise
        code = check_exit_code(err)
        print_error(err)
    raise typer.Exit(code)


# the exit codes come from their one owner (ssacli.errors.CHECK_EXIT_CODES); the braces of the
# requirement grammar are not format fields, so the one field is replaced by name
check_command.__doc__ = check_command.__doc__.replace("{exit_codes}", check_exit_codes_text())


def _check(model_ref: str | None, out: CheckOptions, given: Given, load: dict) -> int:
    """Run the check: its settings (flags over the config), then the model, then the outputs."""
    check_outputs(("--junit", out.junit), ("--json", out.json_out), overwrite=out.overwrite)  # before torch
    from .. import check_settings

    probe = {name: getattr(given, name) for name in PROBE_SETTINGS}
    check = check_settings(
        model_ref, config=out.config, requires=out.require, baseline=out.baseline,
        max_regression=out.max_regression, **probe, device=given.device, dtype=given.dtype,
        strict=given.strict, **load,
    )  # fmt: skip  # torch-free: the requirements parsed, the flags over the config's settings
    merged = check.options  # what the run will use, wherever it was given: checked before torch
    check_inputs(
        scorers=[merged.get("scorer")], models=[check.model], offline=merged.get("offline", False),
        revision=merged.get("revision"), device=merged.get("device"), dtype=merged.get("dtype"),
        allow_pickle=merged.get("allow_pickle", False), device_map=merged.get("device_map"),
        max_memory=merged.get("max_memory"),
    )  # fmt: skip
    with progress(f"ssacli check {check.model}", quiet=out.quiet) as update:

        def on_progress(what: str, done: int, total: int) -> None:
            update(description=f"ssacli check {check.model}: {what} {done}/{total}")

        report = check.run(progress=None if update is None else on_progress)  # no callback, no display
    outputs = []  # rendered in full before the first file is written
    if out.junit is not None:
        outputs.append((report.junit_xml(), out.junit))
    if out.json_out is not None:
        outputs.append((json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n", out.json_out))
    _render(report, out.quiet)
    console = Console()
    for text, path in outputs:
        write_output(text, path, console)
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


def _init(model_ref: str | None, out: CheckOptions, given: Given, load: dict) -> int:
    """--init: write a commented ssacli.toml measured on MODEL; never overwrite one."""
    unused = given_only(
        require=out.require or None, baseline=out.baseline, max_regression=out.max_regression,
        junit=out.junit, json=out.json_out, overwrite=out.overwrite or None, samples=given.samples,
        seed=given.seed, length=given.length, tau=given.tau, scorer=given.scorer, strict=given.strict or None,
    )  # fmt: skip
    if unused:  # --init measures with its own settings and writes no report: these would be dropped
        raise UsageError(
            f"--{next(iter(unused)).replace('_', '-')} applies to running a check; --init only "
            f"measures MODEL and writes {CHECK_CONFIG_FILE}: drop it, or run the check without --init"
        )
    check_inputs(
        models=[model_ref], device=given.device, allow_pickle=given.allow_pickle, dtype=given.dtype,
        device_map=load["device_map"], max_memory=load["max_memory"],
    )  # fmt: skip  # before torch
    from .. import ModelKind, write_check_config

    measured = given_only(device=given.device, dtype=given.dtype, random_ids=given.random_ids) | load
    model, target = model_ref or DEFAULT_MODEL, out.config or Path(CHECK_CONFIG_FILE)
    with progress(f"measuring {model} for {target}", quiet=False):
        kind = write_check_config(model, target, **measured)
    Console().print(
        f"wrote {target} (requirements measured on {ModelKind(kind).with_article} model; see the comments)",
        highlight=False,
    )
    return EXIT_CHECK_PASSED
