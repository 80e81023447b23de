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
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import defaults
from ..defaults import DEFAULT_MODEL
from ..errors import EXIT_CHECK_FAILED, EXIT_CHECK_PASSED, UsageError, check_exit_code, check_exit_codes_text
from ..preflight import CHECK_CONFIG_FILE
from .options import (
    AllowDownload,
    AllowPickle,
    Device,
    DeviceMap,
    Dtype,
    MaxMemory,
    Offline,
    OverwriteFiles,
    Revision,
    Strict,
    TrustRemoteCode,
    check_inputs,
    check_outputs,
    debugging,
    given,
    print_error,
    progress,
)
from .outputs import write_output


def check_command(
    model_ref: str = typer.Argument(
        None, metavar="MODEL", help=r"HF folder, builtin:NAME, Hub id org/name\[@REV] (default: config's)."
    ),
    config: Path = typer.Option(None, help=f"Config file (default: ./{CHECK_CONFIG_FILE} when it exists)."),
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
    json_out: Path = typer.Option(
        None, "--json", help="Write the check (and its result) as JSON; - for stdout."
    ),
    overwrite: OverwriteFiles = False,
    samples: int = typer.Option(None, min=1, help=f"Inputs per probe level (default {defaults.SAMPLES})."),
    seed: int = typer.Option(None, help=f"Seed of the probe inputs (default {defaults.SEED})."),
    length: int = typer.Option(None, min=2, help="Base length in tokens (ICL: points)."),
    tau: float = typer.Option(
        None, help=f"A row has collapsed when its largest weight is >= tau (default {defaults.TAU:g})."
    ),
    scorer: str = typer.Option(None, help="Re-score attention with this spec first, e.g. ssa."),
    random_ids: bool = typer.Option(
        False, "--random", help="Probe with random token ids (needed for a model without a tokenizer)."
    ),
    device: Device = None,
    dtype: Dtype = None,
    offline: Offline = False,
    revision: Revision = None,
    allow_download: AllowDownload = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemoteCode = False,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    strict: Strict = False,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only failures, errors and written files."),
    init: bool = typer.Option(
        False, "--init", help=f"Write {CHECK_CONFIG_FILE} with defaults for MODEL, exit."
    ),
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
    load = dict(
        allow_download=allow_download, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
        device_map=device_map, max_memory=max_memory or None, offline=offline, revision=revision,
    )  # fmt: skip
    try:
        if init:
            unused = given(
                require=require or None, baseline=baseline, max_regression=max_regression, junit=junit,
                json=json_out, overwrite=overwrite or None, samples=samples, seed=seed, length=length,
                tau=tau, scorer=scorer, strict=strict or None,
            )  # fmt: skip
            if unused:  # --init measures with its own settings and writes no report: these would be dropped
                raise UsageError(
                    f"--{next(iter(unused)).replace('_', '-')} applies to running a check; --init only "
                    f"measures MODEL and writes {CHECK_CONFIG_FILE}: drop it, or run the check without --init"
                )
            check_inputs(models=[model_ref])  # before anything heavy is imported
            code = _init(model_ref, config, given(device=device, dtype=dtype, random_ids=random_ids) | load)
        else:
            check_outputs(("--junit", junit), ("--json", json_out), overwrite=overwrite)  # before torch
            check_inputs(scorers=[scorer], models=[model_ref], offline=offline, revision=revision)
            settings = dict(
                config=config, requires=require, baseline=baseline, max_regression=max_regression,
                samples=samples, seed=seed, length=length, tau=tau, scorer=scorer, device=device,
                dtype=dtype, strict=strict, random_ids=random_ids, **load,
            )  # fmt: skip
            code = _check(model_ref, settings, junit=junit, json_out=json_out, quiet=quiet)
    except Exception as err:  # a bad gate, a model that cannot be checked, a bug: one line
        if debugging():
            raise
        code = check_exit_code(err)
        print_error(err)
    raise typer.Exit(code)


# the exit codes come from their one owner (ssacli.errors.CHECK_EXIT_CODES); the braces of the
# requirement grammar are not format fields, so the one field is replaced by name
check_command.__doc__ = check_command.__doc__.replace("{exit_codes}", check_exit_codes_text())


def _check(model_ref, settings, *, junit, json_out, quiet) -> int:
    from .. import check_settings

    check = check_settings(model_ref, **settings)  # requirements parsed: bad ones fail before loading
    with progress(f"ssacli check {check.model}", quiet=quiet) as update:

        def on_progress(what: str, done: int, total: int) -> None:
            update(description=f"ssacli check {check.model}: {what} {done}/{total}")

        report = check.run(progress=None if update is None else on_progress)  # no callback, no display
    outputs = []  # rendered in full before the first file is written
    if junit is not None:
        outputs.append((report.junit_xml(), junit))
    if json_out is not None:
        outputs.append((json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n", json_out))
    _render(report, quiet)
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


def _init(model_ref: str | None, config: Path | None, load: dict) -> int:
    """--init: write a commented ssacli.toml measured on MODEL; never overwrite one."""
    from .. import ModelKind, write_check_config

    model, target = model_ref or DEFAULT_MODEL, config or Path(CHECK_CONFIG_FILE)
    with progress(f"measuring {model} for {target}", quiet=False):
        kind = write_check_config(model, target, **load)
    article = "an" if kind == ModelKind.ICL else "a"
    Console().print(
        f"wrote {target} (requirements measured on {article} {kind} model; see the comments)", highlight=False
    )
    return EXIT_CHECK_PASSED
