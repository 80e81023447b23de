"""`ssacli icl train|eval|sweep`: the in-context-learning experiments (the `icl` command group), over
:func:`ssacli.train_icl`, :func:`ssacli.evaluate_icl` and :func:`ssacli.run_icl_sweep`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from .. import defaults as D
from ..errors import UsageError
from ..files import check_writable_folder, json_text
from ..preflight import (
    check_icl_arch,
    check_icl_model,
    check_icl_preset,
    check_icl_task,
    check_new_run,
    parse_outlier,
)
from ..setting import setting
from .declared import Given, command
from .options import (
    ATTENTION_HELP,
    ICL_SIGMAS_TEXT,
    SCORER_LR_HELP,
    bar_columns,
    check_inputs,
    check_outputs,
    floats,
    output_file,
    overwrite_files,
    progress,
    run_json,
)
from .outputs import is_stdout, write_output
from .training import write_run_json

ICL_DEVICE_HELP = "auto, cpu or cuda."


@dataclass(frozen=True)
class ICLTrainOptions:
    """icl train's options: each an :class:`ssacli.ICLTrainConfig` field of the same name, with its
    default (tests/cli/test_declared.py checks), but for where the run is written and on what."""

    task: str = setting(help="every, some or linear.", type=str)
    out: Path = setting(help="Checkpoint folder to write.", type=Path)
    scorer: str = setting(D.SCORER, "Scorer spec, e.g. ssa or ssa:init=paper,learn=none.")
    steps: int = setting(D.ICL_STEPS, "Training steps.", min=1)
    batch_size: int = setting(D.ICL_BATCH_SIZE, "Prompts per step.", min=1)
    lr: float = setting(D.ICL_LR, "Adam learning rate.")
    scorer_lr: float = setting(D.SCORER_LR, SCORER_LR_HELP)
    seed: int = setting(D.SEED, "Seed for weights and data.")
    preset: str = setting(D.ICL_PRESET, "Model size: cpu (3x4x32), small (4x4x64), paper (12x8x256).")
    arch: str = setting(
        D.ICL_ARCH, "Backbone: gpt2 (pre-LayerNorm blocks with MLP) or attn-only (no MLP, no LayerNorm)."
    )
    layers: int | None = setting(None, "Override the preset's layers.", type=int)
    heads: int | None = setting(None, "Override the preset's heads.", type=int)
    width: int | None = setting(None, "Override the preset's width.", type=int)
    points_start: int = setting(D.ICL_POINTS_START, "Curriculum: points per prompt at the start.")
    points_end: int = setting(D.ICL_POINTS, "Curriculum: points per prompt at the end.")
    points_every: int | None = setting(
        None, "Curriculum: steps between +2 points (default: end at half-way).", type=int
    )
    checkpoint_every: int = setting(D.ICL_CHECKPOINT_EVERY, "Write a checkpoint every K steps.", min=1)
    attention: str = setting(D.ATTENTION, f"{ATTENTION_HELP}.")
    resume: bool = setting(False, "Continue the run saved in --out.")
    overwrite: bool = setting(False, "Replace a checkpoint already in --out, and a --json file.")
    device: str = setting(D.DEVICE, ICL_DEVICE_HELP)
    json_out: Path | None = run_json()

    def config(self) -> dict[str, Any]:
        """The ICLTrainConfig settings of the run."""
        cli_only = ("out", "resume", "overwrite", "device", "json_out")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in cli_only}


@command(ICLTrainOptions)
def icl_train(*, given: Given) -> None:
    """Train an ICL model from scratch with any scorer."""
    run = given.of(ICLTrainOptions)
    check_writable_folder(run.out, "--out")  # before anything heavy is imported
    check_outputs(("--json", run.json_out), overwrite=run.overwrite)
    check_inputs(scorers=[run.scorer], device=run.device)
    check_icl_task(run.task)
    check_icl_arch(run.arch)
    check_icl_preset(run.preset)
    check_new_run(run.out, run.resume, run.overwrite, icl=True)  # a checkpoint there already
    from rich.progress import TextColumn, TimeRemainingColumn

    from .. import ICLTrainConfig, train_icl

    config = ICLTrainConfig(**run.config())
    config.validate()  # before the progress bar (drawn even off a terminal) starts
    stats = TextColumn("loss {task.fields[loss]:.4f} · {task.fields[points]} pts")
    columns = bar_columns(stats, TimeRemainingColumn())
    fields = {"total": run.steps, "loss": float("nan"), "points": run.points_start}
    with progress(f"{run.task}/{run.scorer}", columns, always=True, transient=False, **fields) as update:

        def on_step(step: int, loss: float, points: int) -> None:
            update(completed=step, loss=loss, points=points)

        model = train_icl(
            config, run.out, resume=run.resume, overwrite=run.overwrite, device=run.device, on_step=on_step
        )
    history = model.spec.training["history"]
    typer.echo(f"wrote {run.out} (step {model.spec.training['step']}, last logged loss {history[-1][1]:.4g})")
    write_run_json("icl train", run.json_out, run.out)


@dataclass(frozen=True)
class ICLEvalOptions:
    """icl eval's options: :func:`ssacli.evaluate_icl`'s keywords as the command line spells them
    (comma-separated lists), and the files written."""

    sigma: str = setting(ICL_SIGMAS_TEXT, "Comma-separated σ of the inputs.")
    length: str = setting(",".join(map(str, D.ICL_LENGTHS)), "Comma-separated prompt lengths (points).")
    outlier: str | None = setting(
        None, "Planted outliers VALUE@POSITION, comma-separated, e.g. 1000@3.", type=str
    )
    prompts: int = setting(D.ICL_PROMPTS, "Prompts per cell.", min=1)
    coef_sigma: float = setting(D.ICL_COEF_SIGMA, "linear: σ of the coefficients a, b.")
    seed: int = setting(D.SEED, "Seed of the evaluation prompts.")
    json_out: Path | None = output_file("--json", "Write the results as JSON to this file; - for stdout.")
    plot: Path | None = setting(None, "Write a figure (png, pdf, svg) to this file.", type=Path)
    overwrite: bool = overwrite_files()
    device: str = setting(D.DEVICE, ICL_DEVICE_HELP)


ICLModel = typer.Argument(..., metavar="MODEL", help="Checkpoint folder or builtin:NAME.")


@command(ICLEvalOptions)
def icl_eval(model_ref: str = ICLModel, *, given: Given) -> None:
    """Evaluate an ICL model over σ × length, and with planted outliers."""
    run = given.of(ICLEvalOptions)
    if is_stdout(run.plot):
        raise UsageError("--plot needs a file name: its suffix (png, pdf, svg) picks the format")
    check_outputs(("--json", run.json_out), ("--plot", run.plot), overwrite=run.overwrite)  # first
    check_inputs(models=[model_ref], device=run.device)
    check_icl_model(model_ref)  # a language model's folder says so: refused before the model stack
    sigmas, lengths = floats(run.sigma, "sigma"), tuple(int(v) for v in floats(run.length, "length"))
    try:
        probes = [parse_outlier(v) for v in run.outlier.split(",")] if run.outlier else []
    except ValueError as err:
        raise UsageError(str(err)) from None
    from .. import evaluate_icl, icl_evaluation_legend, icl_evaluation_tables

    result = evaluate_icl(
        model_ref, sigmas=sigmas, lengths=lengths, outliers=tuple(probes),
        prompts=run.prompts, coef_sigma=run.coef_sigma, seed=run.seed, device=run.device,
    )  # fmt: skip
    model, cells = result.model, result.cells
    console = Console()
    for table in icl_evaluation_tables(cells, model.spec.task, model.spec.scorer):
        console.print(table)
    console.print(icl_evaluation_legend(model.spec.task), style="dim")
    if run.json_out is not None:
        write_output(json_text(result.to_dict()), run.json_out, console)
    if run.plot is not None:
        _plot(model_ref, result, run.plot, console)


def _plot(model_ref: str, result, path: Path, console: Console) -> None:
    """--plot: the evaluation's figure, in the format of the file's suffix."""
    from .. import plot_icl_evaluation

    task, scorer = result.model.spec.task, result.model.spec.scorer
    metric = "sequence error rate" if task != "linear" else "MSE / Var(y)"
    plot_icl_evaluation(result.cells, f"{model_ref}: {task}, {scorer}", metric, path)
    console.print(f"wrote {path}")


def plan_size(plan, total: int) -> str:
    """The first line of a sweep, e.g. "24 runs (2 tasks × 2 arms × 3 seeds)", so a log says at once how
    long it will be (a run takes minutes and prints nothing until it is done)."""
    seeds = {entry.seeds for entry in plan.scorers}
    factors = [(len(plan.tasks), "task"), (len(plan.archs), "backbone"), (len(plan.scorers), "arm")]
    parts = [f"{n} {name}{'s' if n != 1 else ''}" for n, name in factors if n > 1 or name != "backbone"]
    if len(seeds) == 1:
        n = seeds.pop()
        parts.append(f"{n} seed{'s' if n != 1 else ''}")
    else:
        parts[-1] += " with their own seeds"
    return f"{total} run{'s' if total != 1 else ''} ({' × '.join(parts)})"


@dataclass(frozen=True)
class ICLSweepOptions:
    """icl sweep's options: where it writes, a plan file or the grid of
    :meth:`ssacli.ICLSweepPlan.from_specs` (its keywords of these names, with its defaults), and how
    the runs share the machine."""

    out: Path = setting(help="Folder for runs/, results.json and figures/.", type=Path)
    plan_file: Path | None = setting(
        None, "A JSON plan (see docs/results/icl-plan.json).", flags=("--plan",), type=Path
    )
    task: tuple[str, ...] = setting(
        D.ICL_SWEEP_TASKS,
        "Task (repeat the flag for several).",
        type=list[str],
        default_text=list(D.ICL_SWEEP_TASKS),
    )
    scorer: tuple[str, ...] = setting(
        D.ICL_SWEEP_SCORERS, "Scorer spec (repeat the flag for several).", type=list[str],
        default_text=list(D.ICL_SWEEP_SCORERS),
    )  # fmt: skip
    seeds: int = setting(D.ICL_SWEEP_SEEDS, "Seeds per scorer.", min=1)
    steps: int = setting(D.ICL_SWEEP_STEPS, "Training steps per run.", min=1)
    lr: float = setting(D.ICL_LR, "Adam learning rate.")
    prompts: int = setting(D.ICL_PROMPTS, "Evaluation prompts per cell.", min=1)
    jobs: int = setting(D.SWEEP_JOBS, "Runs in parallel (one CPU thread each).", min=1)
    device: str = setting(D.ICL_SWEEP_DEVICE, "cpu, cuda or auto: where every run trains and is evaluated.")


@command(ICLSweepOptions)
def icl_sweep(*, given: Given) -> None:
    """Train and evaluate a grid of scorers × tasks × seeds; write results.json and figures."""
    run = given.of(ICLSweepOptions)
    out, plan_file, jobs = run.out, run.plan_file, run.jobs
    check_writable_folder(out, "--out")  # before anything heavy is imported
    scorers = [] if plan_file is not None else run.scorer
    check_inputs(scorers=scorers, device=run.device)  # a --plan's: checked as it is read
    from .. import ICLSweepPlan, plot_icl_sweep, run_icl_sweep

    if plan_file is not None:
        plan = ICLSweepPlan.from_json(plan_file)
    else:
        plan = ICLSweepPlan.from_specs(
            run.task, run.scorer, seeds=run.seeds, steps=run.steps, lr=run.lr, prompts=run.prompts
        )
    plan.validate()  # a bad plan fails before the plan line below
    total = len(plan.runs())
    typer.echo(f"{plan_size(plan, total)}, {min(jobs, total)} at a time; a line as each run finishes")
    done = []

    def on_result(result: dict) -> None:
        done.append(result)
        arch = "" if result.get("arch", "gpt2") == "gpt2" else f"{result['arch']}-"
        typer.echo(
            f"[{len(done)}/{total}] {result['task']}-{arch}{result['label']}-s{result['seed']}: "
            f"final loss {result['final_loss']:.4g}, trained in {result['train_seconds']} s"
        )

    summary = run_icl_sweep(plan, out, jobs=jobs, device=run.device, on_result=on_result)
    plot_icl_sweep(summary, out / "figures")
    typer.echo(f"wrote {out / 'results.json'} and {out / 'figures'} ({summary['wall_seconds']} s)")
