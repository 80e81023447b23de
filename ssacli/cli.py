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

from . import __version__
from .errors import InterruptError, SsacliError, UsageError
from .report.files import check_writable, write_json
from .scorers import describe_scorer, make_scorer, scorer_table


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
    from .diagnosis import diagnose
    from .inputs import read_text_file
    from .probes import parse_probe
    from .results import METRICS

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
        from .report.console import render_comparison, render_diagnose

        if other is None:
            render_diagnose(result, console, heatmap_metric=metric, heatmap_probe=heat_probe or None)
        else:
            render_comparison(result, other, console)
    if json_out is not None:
        from .results import compare_results

        data = result.to_dict() if other is None else compare_results(result, other)
        write_json(data, json_out)
        console.print(f"wrote {json_out}", highlight=False)
    if html_out is not None:
        from .report.files import write_text
        from .report.html import comparison_html, diagnose_html

        write_text(diagnose_html(result) if other is None else comparison_html(result, other), html_out)
        console.print(f"wrote {html_out}", highlight=False)


def _compare_target(diagnose, ref: str, settings: dict, quiet: bool):
    """--compare: a --json result file, or another model diagnosed with the same settings."""
    from .results import DiagnoseResult

    if ref.endswith(".json") and Path(ref).is_file():
        return DiagnoseResult.load(ref)
    return _diagnose_with_progress(diagnose, ref, settings, quiet)


def load_trusted(ref: str, **load):
    """MODEL loaded with --trust-remote-code, for the API functions that take a loaded model."""
    from .loading import load_model

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


icl_app = typer.Typer(
    help="In-context-learning experiments: train small models on the paper's tasks, evaluate them "
    "under magnitude and length shift.",
    no_args_is_help=True,
)
app.add_typer(icl_app, name="icl")


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--{what} takes comma-separated numbers, e.g. 1,2,4; got {text!r}") from None


@icl_app.command("train")
def icl_train(
    task: str = typer.Option(..., help="every, some or linear."),
    out: Path = typer.Option(..., help="Checkpoint folder to write."),
    scorer: str = typer.Option("softmax", help="Scorer spec, e.g. ssa or ssa:init=paper,learn=none."),
    steps: int = typer.Option(4000, min=1, help="Training steps."),
    batch_size: int = typer.Option(64, min=1, help="Prompts per step."),
    lr: float = typer.Option(1e-4, help="Adam learning rate."),
    seed: int = typer.Option(0, help="Seed for weights and data."),
    preset: str = typer.Option("cpu", help="Model size: cpu (3x4x32), small (4x4x64), paper (12x8x256)."),
    layers: int = typer.Option(None, help="Override the preset's layers."),
    heads: int = typer.Option(None, help="Override the preset's heads."),
    width: int = typer.Option(None, help="Override the preset's width."),
    points_start: int = typer.Option(11, help="Curriculum: points per prompt at the start."),
    points_end: int = typer.Option(41, help="Curriculum: points per prompt at the end."),
    points_every: int = typer.Option(
        None, help="Curriculum: steps between +2 points (default: end at half-way)."
    ),
    checkpoint_every: int = typer.Option(1000, min=1, help="Write a checkpoint every K steps."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run saved in --out."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a checkpoint already in --out."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
) -> None:
    """Train an ICL model from scratch with any scorer."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from .icl import TrainConfig, check_task, train
    from .scorers import make_scorer

    check_task(task)
    make_scorer(scorer)  # fail on a bad spec before any work
    config = TrainConfig(
        task=task,
        scorer=scorer,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        preset=preset,
        layers=layers,
        heads=heads,
        width=width,
        points_start=points_start,
        points_end=points_end,
        points_every=points_every,
        checkpoint_every=checkpoint_every,
    )
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f} · {task.fields[points]} pts"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        bar = progress.add_task(f"{task}/{scorer}", total=steps, loss=float("nan"), points=points_start)

        def on_step(step: int, loss: float, points: int) -> None:
            progress.update(bar, completed=step, loss=loss, points=points)

        model = train(config, out, resume=resume, overwrite=overwrite, device=device, on_step=on_step)
    history = model.spec.training["history"]
    typer.echo(f"wrote {out} (step {model.spec.training['step']}, last logged loss {history[-1][1]:.4g})")


@icl_app.command("eval")
def icl_eval(
    model_ref: str = typer.Argument(..., metavar="MODEL", help="Checkpoint folder or builtin:NAME."),
    sigma: str = typer.Option("1,2,4,8,16,32", help="Comma-separated σ of the inputs."),
    length: str = typer.Option("41,81,161", help="Comma-separated prompt lengths (points)."),
    outlier: str = typer.Option(None, help="Planted outliers VALUE@POSITION, comma-separated, e.g. 1000@3."),
    prompts: int = typer.Option(500, min=1, help="Prompts per cell."),
    coef_sigma: float = typer.Option(1.0, help="linear: σ of the coefficients a, b."),
    seed: int = typer.Option(0, help="Seed of the evaluation prompts."),
    json_out: Path = typer.Option(None, "--json", help="Write the results as JSON to this file."),
    plot: Path = typer.Option(None, help="Write a figure (png, pdf, svg) to this file."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
) -> None:
    """Evaluate an ICL model over σ × length, and with planted outliers."""
    from .icl import cells_to_json, evaluate, load_icl, parse_outlier, resolve_device
    from .loading import resolve_model_path
    from .report.terminal import icl_legend, icl_tables

    lengths = tuple(int(v) for v in _floats(length, "length"))
    try:
        probes = [parse_outlier(v) for v in outlier.split(",")] if outlier else []
    except ValueError as err:
        raise UsageError(str(err)) from None
    sigmas = _floats(sigma, "sigma")
    model = load_icl(resolve_model_path(model_ref), resolve_device(device))  # after the cheap checks
    cells = evaluate(model, sigmas=sigmas, lengths=lengths, prompts=prompts, coef_sigma=coef_sigma, seed=seed)
    if probes:
        cells += evaluate(
            model,
            sigmas=(1.0,),
            lengths=lengths,
            outliers=tuple(probes),
            prompts=prompts,
            coef_sigma=coef_sigma,
            seed=seed,
        )
    console = Console()
    for table in icl_tables(cells, model.spec.task, model.spec.scorer):
        console.print(table)
    console.print(icl_legend(model.spec.task), style="dim")
    result = {"model": model_ref, **cells_to_json(model, cells)}
    if json_out is not None:
        write_json(result, json_out)
        console.print(f"wrote {json_out}")
    if plot is not None:
        from .icl.plots import plot_eval

        metric = "sequence error rate" if model.spec.task != "linear" else "MSE / Var(y)"
        plot_eval(cells, f"{model_ref}: {model.spec.task}, {model.spec.scorer}", metric, plot)
        console.print(f"wrote {plot}")


@icl_app.command("sweep")
def icl_sweep(
    out: Path = typer.Option(..., help="Folder for runs/, results.json and figures/."),
    plan_file: Path = typer.Option(None, "--plan", help="A JSON plan (see docs/results/icl-plan.json)."),
    task: list[str] = typer.Option(["every", "linear"], help="Task (repeat the flag for several)."),
    scorer: list[str] = typer.Option(["softmax", "ssa"], help="Scorer spec (repeat the flag for several)."),
    seeds: int = typer.Option(3, min=1, help="Seeds per scorer."),
    steps: int = typer.Option(3000, min=1, help="Training steps per run."),
    lr: float = typer.Option(1e-4, help="Adam learning rate."),
    prompts: int = typer.Option(500, min=1, help="Evaluation prompts per cell."),
    jobs: int = typer.Option(1, min=1, help="Runs in parallel (one CPU thread each)."),
) -> None:
    """Train and evaluate a grid of scorers × tasks × seeds; write results.json and figures."""
    from .icl.sweep import ScorerEntry, SweepPlan, run_sweep

    if plan_file is not None:
        plan = SweepPlan.from_json(plan_file)
    else:
        entries = [ScorerEntry(label=_label(spec), spec=spec, seeds=seeds) for spec in scorer]
        plan = SweepPlan(tasks=list(task), scorers=entries, steps=steps, lr=lr, prompts=prompts)
    total = len(plan.runs())
    done = []

    def on_result(result: dict) -> None:
        done.append(result)
        typer.echo(
            f"[{len(done)}/{total}] {result['task']}-{result['label']}-s{result['seed']}: "
            f"final loss {result['final_loss']:.4g}, trained in {result['train_seconds']} s"
        )

    summary = run_sweep(plan, out, jobs=jobs, on_result=on_result)
    typer.echo(f"wrote {out / 'results.json'} and {out / 'figures'} ({summary['wall_seconds']} s)")


def _label(spec: str) -> str:
    return spec.replace(":", "-").replace(",", "-").replace("=", "")


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
from . import cli_check, cli_report, cli_scratch, cli_train  # noqa: E402, F401
