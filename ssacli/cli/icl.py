"""`ssacli icl train|eval|sweep`: the in-context-learning experiments (the `icl` command group), over
:func:`ssacli.train_icl`, :func:`ssacli.evaluate_icl` and :func:`ssacli.run_icl_sweep`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from .. import defaults as D
from ..errors import UsageError
from ..files import check_writable_folder, json_text
from .options import (
    ATTENTION_HELP,
    ICL_SIGMAS_TEXT,
    SCORER_LR_HELP,
    OverwriteFiles,
    RunJson,
    bar_columns,
    check_inputs,
    check_outputs,
    floats,
    progress,
)
from .outputs import is_stdout, write_output
from .training import write_run_json


def icl_train(
    task: str = typer.Option(..., help="every, some or linear."),
    out: Path = typer.Option(..., help="Checkpoint folder to write."),
    scorer: str = typer.Option(D.SCORER, help="Scorer spec, e.g. ssa or ssa:init=paper,learn=none."),
    steps: int = typer.Option(D.ICL_STEPS, min=1, help="Training steps."),
    batch_size: int = typer.Option(D.ICL_BATCH_SIZE, min=1, help="Prompts per step."),
    lr: float = typer.Option(D.ICL_LR, help="Adam learning rate."),
    scorer_lr: float = typer.Option(D.SCORER_LR, help=SCORER_LR_HELP),
    seed: int = typer.Option(D.SEED, help="Seed for weights and data."),
    preset: str = typer.Option(
        D.ICL_PRESET, help="Model size: cpu (3x4x32), small (4x4x64), paper (12x8x256)."
    ),
    arch: str = typer.Option(
        D.ICL_ARCH, help="Backbone: gpt2 (pre-LayerNorm blocks with MLP) or attn-only (no MLP, no LayerNorm)."
    ),
    layers: int = typer.Option(None, help="Override the preset's layers."),
    heads: int = typer.Option(None, help="Override the preset's heads."),
    width: int = typer.Option(None, help="Override the preset's width."),
    points_start: int = typer.Option(D.ICL_POINTS_START, help="Curriculum: points per prompt at the start."),
    points_end: int = typer.Option(D.ICL_POINTS, help="Curriculum: points per prompt at the end."),
    points_every: int = typer.Option(
        None, help="Curriculum: steps between +2 points (default: end at half-way)."
    ),
    checkpoint_every: int = typer.Option(
        D.ICL_CHECKPOINT_EVERY, min=1, help="Write a checkpoint every K steps."
    ),
    attention: str = typer.Option(D.ATTENTION, help=f"{ATTENTION_HELP}."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run saved in --out."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace a checkpoint already in --out, and a --json file."
    ),
    device: str = typer.Option(D.DEVICE, help="auto, cpu or cuda."),
    json_out: RunJson = None,
) -> None:
    """Train an ICL model from scratch with any scorer."""
    check_writable_folder(out, "--out")  # before anything heavy is imported
    check_outputs(("--json", json_out), overwrite=overwrite)
    check_inputs(scorers=[scorer])
    from rich.progress import TextColumn, TimeRemainingColumn

    from .. import ICLTrainConfig, train_icl

    config = ICLTrainConfig(
        task=task,
        scorer=scorer,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        scorer_lr=scorer_lr,
        seed=seed,
        preset=preset,
        layers=layers,
        heads=heads,
        width=width,
        points_start=points_start,
        points_end=points_end,
        points_every=points_every,
        checkpoint_every=checkpoint_every,
        attention=attention,
        arch=arch,
    )
    config.validate()  # before the progress bar (drawn even off a terminal) starts
    stats = TextColumn("loss {task.fields[loss]:.4f} · {task.fields[points]} pts")
    columns = bar_columns(stats, TimeRemainingColumn())
    fields = {"total": steps, "loss": float("nan"), "points": points_start}
    with progress(f"{task}/{scorer}", columns, always=True, transient=False, **fields) as update:

        def on_step(step: int, loss: float, points: int) -> None:
            update(completed=step, loss=loss, points=points)

        model = train_icl(config, out, resume=resume, overwrite=overwrite, device=device, on_step=on_step)
    history = model.spec.training["history"]
    typer.echo(f"wrote {out} (step {model.spec.training['step']}, last logged loss {history[-1][1]:.4g})")
    write_run_json("icl train", json_out, out)


def icl_eval(
    model_ref: str = typer.Argument(..., metavar="MODEL", help="Checkpoint folder or builtin:NAME."),
    sigma: str = typer.Option(ICL_SIGMAS_TEXT, help="Comma-separated σ of the inputs."),
    length: str = typer.Option(
        ",".join(map(str, D.ICL_LENGTHS)), help="Comma-separated prompt lengths (points)."
    ),
    outlier: str = typer.Option(None, help="Planted outliers VALUE@POSITION, comma-separated, e.g. 1000@3."),
    prompts: int = typer.Option(D.ICL_PROMPTS, min=1, help="Prompts per cell."),
    coef_sigma: float = typer.Option(D.ICL_COEF_SIGMA, help="linear: σ of the coefficients a, b."),
    seed: int = typer.Option(D.SEED, help="Seed of the evaluation prompts."),
    json_out: Path = typer.Option(
        None, "--json", help="Write the results as JSON to this file; - for stdout."
    ),
    plot: Path = typer.Option(None, help="Write a figure (png, pdf, svg) to this file."),
    overwrite: OverwriteFiles = False,
    device: str = typer.Option(D.DEVICE, help="auto, cpu or cuda."),
) -> None:
    """Evaluate an ICL model over σ × length, and with planted outliers."""
    if is_stdout(plot):
        raise UsageError("--plot needs a file name: its suffix (png, pdf, svg) picks the format")
    check_outputs(("--json", json_out), ("--plot", plot), overwrite=overwrite)  # before any heavy import
    check_inputs(models=[model_ref])
    from .. import evaluate_icl, icl_evaluation_legend, icl_evaluation_tables
    from ..preflight import parse_outlier

    lengths = tuple(int(v) for v in floats(length, "length"))
    try:
        probes = [parse_outlier(v) for v in outlier.split(",")] if outlier else []
    except ValueError as err:
        raise UsageError(str(err)) from None
    sigmas = floats(sigma, "sigma")
    result = evaluate_icl(
        model_ref, sigmas=sigmas, lengths=lengths, outliers=tuple(probes), prompts=prompts,
        coef_sigma=coef_sigma, seed=seed, device=device,
    )  # fmt: skip
    model, cells = result.model, result.cells
    console = Console()
    for table in icl_evaluation_tables(cells, model.spec.task, model.spec.scorer):
        console.print(table)
    console.print(icl_evaluation_legend(model.spec.task), style="dim")
    if json_out is not None:
        write_output(json_text(result.to_dict()), json_out, console)
    if plot is not None:
        from .. import plot_icl_evaluation

        metric = "sequence error rate" if model.spec.task != "linear" else "MSE / Var(y)"
        plot_icl_evaluation(cells, f"{model_ref}: {model.spec.task}, {model.spec.scorer}", metric, plot)
        console.print(f"wrote {plot}")


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


def icl_sweep(
    out: Path = typer.Option(..., help="Folder for runs/, results.json and figures/."),
    plan_file: Path = typer.Option(None, "--plan", help="A JSON plan (see docs/results/icl-plan.json)."),
    task: list[str] = typer.Option(list(D.ICL_SWEEP_TASKS), help="Task (repeat the flag for several)."),
    scorer: list[str] = typer.Option(
        list(D.ICL_SWEEP_SCORERS), help="Scorer spec (repeat the flag for several)."
    ),
    seeds: int = typer.Option(D.ICL_SWEEP_SEEDS, min=1, help="Seeds per scorer."),
    steps: int = typer.Option(D.ICL_SWEEP_STEPS, min=1, help="Training steps per run."),
    lr: float = typer.Option(D.ICL_LR, help="Adam learning rate."),
    prompts: int = typer.Option(D.ICL_PROMPTS, min=1, help="Evaluation prompts per cell."),
    jobs: int = typer.Option(D.SWEEP_JOBS, min=1, help="Runs in parallel (one CPU thread each)."),
    device: str = typer.Option(
        D.ICL_SWEEP_DEVICE, help="cpu, cuda or auto: where every run trains and is evaluated."
    ),
) -> None:
    """Train and evaluate a grid of scorers × tasks × seeds; write results.json and figures."""
    check_writable_folder(out, "--out")  # before anything heavy is imported
    check_inputs(scorers=[] if plan_file is not None else scorer)  # a --plan's: checked as it is read
    from .. import ICLSweepPlan, plot_icl_sweep, run_icl_sweep

    if plan_file is not None:
        plan = ICLSweepPlan.from_json(plan_file)
    else:
        plan = ICLSweepPlan.from_specs(task, scorer, seeds=seeds, steps=steps, lr=lr, prompts=prompts)
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

    summary = run_icl_sweep(plan, out, jobs=jobs, device=device, on_result=on_result)
    plot_icl_sweep(summary, out / "figures")
    typer.echo(f"wrote {out / 'results.json'} and {out / 'figures'} ({summary['wall_seconds']} s)")
