"""`ssacli convert` and `ssacli finetune`: swap a model's scorer, optionally fine-tune, save a folder.

Fine-tuning options (shared, in cli/options.py) are optional (None) on purpose: ``convert`` refuses
them without ``--finetune``, and ``finetune`` takes whatever is not given from the run recorded in
the folder it resumes (:func:`ssacli.finetune_config`), so ``ssacli finetune DIR --steps 2000``
extends a run without repeating its settings. What a run shows while it trains is
:mod:`ssacli.cli.training`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..defaults import DEVICE, DTYPE, FINETUNE_STEPS, MAX_KL_PER_TOKEN, MAX_RELATIVE_ERROR
from ..errors import UsageError
from ..files import check_writable_folder
from .options import (
    DATA_HELP,
    STEPS_HELP,
    AllowDownload,
    AllowPickle,
    AnnealN,
    Attention,
    BatchSize,
    CheckpointEvery,
    Device,
    DeviceMap,
    GradAccum,
    LogEvery,
    Lr,
    MaxMemory,
    Model,
    MonitorEvery,
    Offline,
    QuietTraining,
    Revision,
    RunJson,
    Schedule,
    ScorerLr,
    SeqLen,
    Strict,
    TrainSeed,
    TrainWhat,
    TrustRemoteCode,
    Warmup,
    WeightDecay,
    check_inputs,
    check_outputs,
    given,
    load_options,
)
from .recipe import (
    Control,
    DistillSteps,
    LmWeight,
    LoraRank,
    MaxLoss,
    RecipeB,
    Stages,
    TargetN,
    TransferSteps,
    recipe_config,
    run_recipe,
    wants_recipe,
)
from .training import is_rank0, print_trained, training_display, write_run_json


def convert_command(
    model_ref: Model,
    scorer: str = typer.Option(..., help="Scorer spec, e.g. ssa:init=faithful or ssa:init=faithful,m=256."),
    out: Path = typer.Option(
        ..., help="Folder to write (plain transformers loads it only while its scorer is a faithful softmax)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace --out (ssacli's or empty only) and a --json file."
    ),
    do_finetune: bool = typer.Option(False, "--finetune", help="Fine-tune after converting (needs --data)."),
    resume: bool = typer.Option(
        False, "--resume", help="With --finetune: continue the run stopped in --out (give the same options)."
    ),
    stages: Stages = None,
    target_n: TargetN = None,
    recipe_b: RecipeB = None,
    transfer_steps: TransferSteps = None,
    distill_steps: DistillSteps = None,
    lora_rank: LoraRank = None,
    lm_weight: LmWeight = None,
    max_loss: MaxLoss = None,
    control: Control = None,
    text: Path = typer.Option(
        None,
        "--text",
        help="Calibration text file: fidelity and m=auto are measured on windows of it (default: the "
        "start of --data when fine-tuning a text, else the built-in probe texts).",
    ),
    max_error: float = typer.Option(
        None,
        "--max-error",
        help=f"Fidelity target: KL nats/token for models with a vocabulary (default "
        f"{MAX_KL_PER_TOKEN:g}), relative error of the output otherwise (default "
        f"{MAX_RELATIVE_ERROR:g}). m=auto meets it or exits 5.",
    ),
    data: str = typer.Option(None, help=DATA_HELP),
    steps: int = typer.Option(None, min=1, help=STEPS_HELP),
    lr: Lr = None,
    scorer_lr: ScorerLr = None,
    monitor_every: MonitorEvery = None,
    batch_size: BatchSize = None,
    seq_len: SeqLen = None,
    grad_accum: GradAccum = None,
    warmup: Warmup = None,
    schedule: Schedule = None,
    weight_decay: WeightDecay = None,
    seed: TrainSeed = None,
    train: TrainWhat = None,
    anneal_n: AnnealN = None,
    checkpoint_every: CheckpointEvery = None,
    log_every: LogEvery = None,
    attention: Attention = None,
    device: Device = DEVICE,
    dtype: str = typer.Option(DTYPE, help="auto (float32 on CPU and when fine-tuning), float32, bfloat16."),
    offline: Offline = False,
    revision: Revision = None,
    allow_download: AllowDownload = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemoteCode = False,
    device_map: DeviceMap = None,
    max_memory: MaxMemory = None,
    strict: Strict = False,
    json_out: RunJson = None,
    quiet: QuietTraining = False,
) -> None:
    r"""Swap MODEL's attention scorer, report how close it stays, and save it to --out.

    Fidelity compares outputs before and after the swap on the same inputs: KL per token and
    top-1 agreement for language models (and ICL sign models), relative error otherwise.

    Examples:

      ssacli convert ./my-model --scorer ssa:init=faithful --out ./my-model-ssa

      ssacli convert builtin:every-softmax --scorer ssa:init=faithful \
          --out ./every-ssa

      ssacli convert ./gpt2 --scorer ssa:init=faithful --out ./gpt2-ssa \
          --finetune --data corpus/

      ssacli convert ./gpt2 --scorer ssa:init=faithful --out ./g \
          --finetune --data c.txt --anneal-n 8
    """
    check_writable_folder(out, "--out")  # before anything heavy is imported
    check_outputs(("--json", json_out), overwrite=overwrite)
    check_inputs(scorers=[scorer], models=[model_ref], offline=offline, revision=revision)
    options = given(
        data=data, steps=steps, lr=lr, scorer_lr=scorer_lr, monitor_every=monitor_every,
        batch_size=batch_size, seq_len=seq_len,
        grad_accum=grad_accum, warmup=warmup, schedule=schedule, weight_decay=weight_decay, seed=seed,
        train=train, anneal_n=anneal_n, checkpoint_every=checkpoint_every, log_every=log_every,
        attention=attention,
    )  # fmt: skip
    recipe = given(
        target_n=target_n, b=recipe_b, transfer_steps=transfer_steps, distill_steps=distill_steps,
        lora_rank=lora_rank, lm_weight=lm_weight, max_loss=max_loss,
    )  # fmt: skip
    flags = {**options, **recipe, **given(stages=stages, resume=resume or None, control=control)}
    if flags and not do_finetune:
        raise UsageError(f"--{next(iter(flags)).replace('_', '-')} only applies with --finetune")
    use_recipe = do_finetune and wants_recipe(stages, scorer, data)
    if (recipe or control is not None) and not use_recipe:
        name = next(iter(recipe), "control")
        name = "recipe-b" if name == "b" else name.replace("_", "-")
        raise UsageError(f"--{name} applies to the conversion recipe (--stages auto or transfer,distill)")
    load = load_options(
        device, dtype, allow_download, allow_pickle, trust_remote_code, device_map, max_memory,
        offline=offline, revision=revision,
    )  # fmt: skip
    placed = given(device_map=load.device_map, max_memory=load.max_memory)
    if placed and do_finetune:
        raise UsageError(
            f"--{next(iter(placed)).replace('_', '-')} applies to convert without --finetune (fine-tuning "
            "trains on one device per process; use torchrun or accelerate launch for several)"
        )
    calibration = _read_text(text) if text is not None else None  # an unreadable file is exit 4
    console = Console(quiet=not is_rank0())  # under torchrun, one copy of every line

    measured: dict[str, Any] = {}  # the conversion's fidelity, for --json

    def show_fidelity(report: dict[str, Any]) -> None:
        measured["fidelity"] = report
        for line in fidelity_lines(report):
            console.print(line, highlight=False, soft_wrap=True)

    if not do_finetune:
        from .. import ConvertSettings, convert_with
        from ..preflight import check_model_out, local_model_path

        check_model_out(out.expanduser(), local_model_path(model_ref), overwrite)  # never over the input
        conversion = ConvertSettings(text=calibration, max_error=max_error, strict=strict)
        _, report = convert_with(model_ref, scorer, conversion, load, out, overwrite=overwrite)
        show_fidelity(report)
        console.print(f"wrote {out}", highlight=False, soft_wrap=True)
        write_run_json("convert", json_out, out, **measured)
        return
    if use_recipe:
        config = recipe_config(stages, scorer, options, recipe)  # bad values fail before loading
        run_recipe(model_ref, out, config, overwrite=overwrite, resume=resume, text=calibration, quiet=quiet,
                   show_fidelity=show_fidelity, load=load, strict=strict, control=control)  # fmt: skip
        write_run_json("convert", json_out, out, control=control, **measured)
        return
    from .. import ConvertSettings, convert_and_finetune_with, finetune_config

    config = finetune_config(**options)  # bad values fail before loading
    conversion = ConvertSettings(text=calibration, max_error=max_error, strict=strict)
    with training_display(config.steps, config.log_every, quiet) as on_step:
        trained, _ = convert_and_finetune_with(
            model_ref, scorer, out, config, conversion, load, overwrite=overwrite, resume=resume,
            on_converted=show_fidelity, on_step=on_step,
        )  # fmt: skip
    print_trained(out, trained.path)
    write_run_json("convert", json_out, out, **measured)


def finetune_command(
    model_dir: str = typer.Argument(..., metavar="DIR", help="A folder written by convert (or any MODEL)."),
    data: str = typer.Option(None, help=DATA_HELP + " Default: the data of the run recorded in --out."),
    out: Path = typer.Option(None, help="Folder to write (default: DIR-ft, beside DIR; DIR is left alone)."),
    in_place: bool = typer.Option(
        False, "--in-place", help="Write over DIR itself (continuing the run recorded there, if any)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run recorded in --out (without --out: in DIR)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace --out if it exists (ssacli's only) and a --json file."
    ),
    steps: int = typer.Option(
        None, min=1, help=f"Total optimizer steps of the run (default {FINETUNE_STEPS})."
    ),
    lr: Lr = None,
    scorer_lr: ScorerLr = None,
    monitor_every: MonitorEvery = None,
    batch_size: BatchSize = None,
    seq_len: SeqLen = None,
    grad_accum: GradAccum = None,
    warmup: Warmup = None,
    schedule: Schedule = None,
    weight_decay: WeightDecay = None,
    seed: TrainSeed = None,
    train: TrainWhat = None,
    anneal_n: AnnealN = None,
    checkpoint_every: CheckpointEvery = None,
    log_every: LogEvery = None,
    attention: Attention = None,
    device: Device = DEVICE,
    trust_remote_code: TrustRemoteCode = False,
    json_out: RunJson = None,
    quiet: QuietTraining = False,
) -> None:
    r"""Fine-tune a converted folder, or continue a fine-tuning run.

    DIR is never written over unless asked: by default the run writes DIR-ft beside it (or --out).
    --resume continues the run recorded in --out, or in DIR without --out (options not given are
    taken from it; a larger --steps extends it). --in-place (or --out DIR) trains DIR itself. The
    checkpoint with the lowest held-out loss is kept in OUT/best; the last line says if the
    held-out loss ended worse than it started.

    Examples:

      ssacli finetune runs/every-ssa --data icl:every --steps 500

      ssacli finetune runs/every-ssa-ft --resume --steps 1000    # extend the run

      ssacli finetune ./gpt2-ssa --data corpus.jsonl --out ./gpt2-ssa-ft \
          --train scorer
    """
    if out is not None:
        check_writable_folder(out, "--out")  # before anything heavy is imported
    check_outputs(("--json", json_out), overwrite=overwrite)
    options = given(
        data=data, steps=steps, lr=lr, scorer_lr=scorer_lr, monitor_every=monitor_every,
        batch_size=batch_size, seq_len=seq_len,
        grad_accum=grad_accum, warmup=warmup, schedule=schedule, weight_decay=weight_decay, seed=seed,
        train=train, anneal_n=anneal_n, checkpoint_every=checkpoint_every, log_every=log_every,
        attention=attention,
    )  # fmt: skip
    from .. import finetune, finetune_config

    config = finetune_config(model_dir, out, resume=resume, in_place=in_place, **options)
    with training_display(config.steps, config.log_every, quiet) as on_step:
        trained = finetune(
            model_dir, config, out, resume=resume, in_place=in_place, overwrite=overwrite, device=device,
            on_step=on_step, trust_remote_code=trust_remote_code,
        )  # fmt: skip
    print_trained(trained.path, trained.path)  # DIR-ft, --out, or DIR itself when asked
    write_run_json("finetune", json_out, trained.path)


def _read_text(path: Path) -> str:
    """--text: the calibration text file, read as ``diagnose --text`` reads it (InputError, exit 4)."""
    from ..preflight import read_text_file

    return read_text_file(path.expanduser(), "--text")


def fidelity_lines(report: dict[str, Any]) -> list[str]:
    """The overall fidelity line, the per-layer table of m=auto, and what to do if a target is missed;
    first, for a family the audit does not cover, that it is unaudited."""
    lines = [f"warning: unaudited: {report['unaudited']}"] if report.get("unaudited") else []
    lines.append(_fidelity_line(report))
    layers = report.get("layers") or []
    if layers:
        lines.append("layer  m        attention-row KL  max |logit|  SSA shift at max")
        for row in layers:
            lines.append(
                f"{row['layer']:>5}  {row['m']:<8g} {row['attention_kl']:<17.3g} "
                f"{row['max_abs_logit']:<12.4g} {row['shift_at_max']:.3g}"
            )
        lines.append(_regime_sentence(report, layers))
    target = report.get("target")
    if target and not target["met"]:
        metric = target["metric"].replace("_", " ")
        lines.append(
            f"warning: {metric} {report[target['metric']]:.3g} misses the target {target['max']:g}: use "
            "ssa:init=faithful with m=auto (it picks m per layer), or a larger m=, convert in float32 "
            "(--dtype float32), or --finetune to adapt the model"
        )
    return lines


def _regime_sentence(report: dict[str, Any], layers: list[dict[str, Any]]) -> str:
    """What m=auto chose, and how close to softmax that leaves the model, as far as the table says:
    "softmax in practice" only when in every layer the largest |logit| stays below m (where SSA's
    polynomial regime starts) and the attention rows stay within KL ``MAX_KL_PER_TOKEN`` of softmax's
    (the default output target: what ssacli calls faithful, whatever --max-error asked); "close"
    when only the rows moved more; else "not softmax in practice", naming the layers at m."""
    target, row_limit = report.get("target") or {}, MAX_KL_PER_TOKEN
    ms = ", ".join(f"{m:g}" for m in sorted({row["m"] for row in layers}))
    chose = f"m=auto chose m = {ms} (the smallest powers of 2 meeting the target)."
    inside = [r for r in layers if r["max_abs_logit"] >= r["m"]]
    ratio = max(r["max_abs_logit"] / r["m"] for r in layers)
    worst = max(layers, key=lambda r: r["attention_kl"])
    if inside:
        where = ", ".join(f"{r['layer']} ({r['max_abs_logit']:.3g} ≥ m = {r['m']:g})" for r in inside)
        met = ", although the outputs meet the fidelity target" if target.get("met") else ""
        return (
            f"{chose} Not softmax in practice: the largest |logit| reaches SSA's polynomial regime "
            f"(|x| ≈ m) in layer {where}, and the attention rows move from softmax's by KL up to "
            f"{worst['attention_kl']:.2g}{met}. A lower --max-error (or a larger m=) starts closer."
        )
    below = (
        f"SSA with b = 1/m, n = m equals softmax up to x²/2m per logit; its polynomial, non-saturating "
        f"regime starts at |x| ≈ m, above the largest logit of every layer (max |logit| / m ≤ {ratio:.2g})"
    )
    if worst["attention_kl"] <= row_limit:
        return (
            f"{chose} {below}, and the attention rows stay within KL {worst['attention_kl']:.2g} of "
            "softmax's: the converted model is softmax in practice until fine-tuning (--anneal-n) lowers n."
        )
    shift = max(r["shift_at_max"] for r in layers)
    return (
        f"{chose} {below}; but the attention rows already move from softmax's by KL up to "
        f"{worst['attention_kl']:.2g} (layer {worst['layer']}, above {row_limit:g}) and the largest logit by "
        f"up to {shift:.3g}: close to softmax in the outputs, not yet in the attention. A lower --max-error "
        "(or a larger m=) starts closer."
    )


def _fidelity_line(report: dict[str, Any]) -> str:
    head = f"fidelity {report['from']} → {report['to']}:"
    if "kl_per_token" in report:
        # ICL sign models report it per prediction (a Bernoulli per x), language models per token
        unit = "prediction" if "relative_error" in report else "token"
        line = (
            f"{head} KL {report['kl_per_token']:.3g} nats per {unit}, top-1 agreement "
            f"{report['top1_agreement']:.2%} over {report['tokens']} {unit}s"
        )
        if "relative_error" in report:
            line += f", relative error {report['relative_error']:.3g}"
        return line
    return f"{head} relative error {report['relative_error']:.3g}"
