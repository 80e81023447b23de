"""`ssacli convert` and `ssacli finetune`: swap a model's scorer, optionally fine-tune, save a folder.

Fine-tuning options (shared, in cli/options.py) are optional (None) on purpose: ``convert`` refuses
them without ``--finetune``, and ``finetune`` takes whatever is not given from the run recorded in
the folder it resumes (:func:`ssacli.finetune_config`), so ``ssacli finetune DIR --steps 2000``
extends a run without repeating its settings. What a run shows while it trains is
:mod:`ssacli.cli.training`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from .. import ConvertSettings, LoadOptions
from ..defaults import FINETUNE_STEPS, MAX_KL_PER_TOKEN
from ..errors import UsageError
from ..files import check_writable_folder
from ..preflight import (
    check_data_fits,
    check_placement,
    check_recipe_model,
    require_training_data,
    training_folder,
)
from ..setting import setting
from .declared import Given, command, options
from .options import DATA_HELP, FinetuneOptions, Model, check_inputs, check_outputs, quiet_training, run_json
from .recipe import RecipeOptions, recipe_config, run_recipe, wants_recipe
from .training import is_rank0, print_trained, training_display, write_run_json


@dataclass(frozen=True)
class ConvertOptions:
    """convert's options that only the command line has: the scorer and the folder (the API takes
    them as arguments), what else runs, and what is written and shown."""

    scorer: str = setting(help="Scorer spec, e.g. ssa:init=faithful or ssa:init=faithful,m=256.", type=str)
    out: Path = setting(
        help="Folder to write (plain transformers loads it only while its scorer is a faithful softmax).",
        type=Path,
    )
    overwrite: bool = setting(False, "Replace --out (ssacli's or empty only) and a --json file.")
    finetune: bool = setting(False, "Fine-tune after converting (needs --data).")
    resume: bool = setting(
        False, "With --finetune: continue the run stopped in --out (give the same options)."
    )
    json_out: Path | None = run_json()
    quiet: bool = quiet_training()


CONVERT_DTYPE_HELP = "auto (float32 on CPU and when fine-tuning), float32, bfloat16."
CONVERT_OPTIONS = (
    options(ConvertOptions, "scorer", "out", "overwrite", "finetune", "resume"),
    RecipeOptions,
    options(ConvertSettings, "text", "max_error"),
    FinetuneOptions,
    options(LoadOptions, dtype={"help": CONVERT_DTYPE_HELP}),
    options(ConvertSettings, "strict"),
    options(ConvertOptions, "json_out", "quiet"),
)


@command(*CONVERT_OPTIONS)
def convert_command(model_ref: Model, *, given: Given) -> None:
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
    run = given.of(ConvertOptions)
    check_writable_folder(run.out, "--out")  # before anything heavy is imported
    check_outputs(("--json", run.json_out), overwrite=run.overwrite)
    check_inputs(scorers=[run.scorer], models=[model_ref], offline=given.offline, revision=given.revision,
                 device=given.device, allow_pickle=given.allow_pickle, dtype=given.dtype)  # fmt: skip
    tuning, recipe = given.of(FinetuneOptions), given.of(RecipeOptions)
    use_recipe = _finetune_options_apply(run, tuning, recipe, model_ref)
    load = _check_placement(given.of(LoadOptions), run.finetune)
    calibration = _read_text(given.text) if given.text is not None else None  # an unreadable file is exit 4
    fidelity = _Fidelity()
    if not run.finetune:
        _convert(model_ref, run, given.of(ConvertSettings, text=calibration), load, fidelity)
    elif use_recipe:
        config = recipe_config(recipe.stages, run.scorer, tuning.given(), recipe.given())  # before loading
        run_recipe(model_ref, run.out, config, overwrite=run.overwrite, resume=run.resume, text=calibration,
                   quiet=run.quiet, show_fidelity=fidelity, load=load, strict=given.strict,
                   control=recipe.control)  # fmt: skip
        write_run_json("convert", run.json_out, run.out, control=recipe.control, **fidelity.measured)
    else:
        _convert_and_finetune(model_ref, run, given, calibration, load, fidelity)


def _finetune_options_apply(
    run: ConvertOptions, tuning: FinetuneOptions, recipe: RecipeOptions, model_ref: str
) -> bool:
    """Refuse fine-tuning options without --finetune, --data of the wrong form for MODEL's kind,
    recipe options where the recipe does not run, and the recipe where MODEL declares another kind
    than a causal LM; return whether it runs."""
    chosen = {"stages": recipe.stages, "resume": run.resume or None, "control": recipe.control}
    flags = {**tuning.given(), **recipe.given(), **{k: v for k, v in chosen.items() if v is not None}}
    if flags and not run.finetune:
        raise UsageError(f"{_flag(next(iter(flags)))} only applies with --finetune")
    if run.finetune and not run.resume:
        require_training_data(tuning.data)  # before the model stack (a resumed run has its own)
        check_data_fits(tuning.data, model_ref)  # a task that is none, text for an ICL model, …
    use_recipe = run.finetune and wants_recipe(recipe.stages, run.scorer, tuning.data)
    if use_recipe:
        check_recipe_model(model_ref)
    if (recipe.given() or recipe.control is not None) and not use_recipe:
        name = next(iter(recipe.given()), "control")
        raise UsageError(
            f"{_flag(name)} applies to the conversion recipe (--stages auto or transfer,distill)"
        )
    if use_recipe and recipe.control is not None and not recipe.control.expanduser().is_dir():
        check_writable_folder(recipe.control, "--control")  # a file, or nowhere to train it: at once
    return use_recipe


def _flag(name: str) -> str:
    """The option of a fine-tuning or recipe setting, as the user typed it."""
    return "--recipe-b" if name == "b" else "--" + name.replace("_", "-")


def _check_placement(load: LoadOptions, finetune: bool) -> LoadOptions:
    """``load``, whose --device-map and --max-memory place a model for inference: refused with
    --finetune, and where they cannot place it (before the model stack)."""
    placed = [name for name in ("device_map", "max_memory") if getattr(load, name) is not None]
    if placed and finetune:
        raise UsageError(
            f"{_flag(placed[0])} applies to convert without --finetune (fine-tuning "
            "trains on one device per process; use torchrun or accelerate launch for several)"
        )
    check_placement(load.device_map, load.max_memory, load.device)
    return load


class _Fidelity:
    """The conversion's ``on_converted``: print its fidelity (once under torchrun) and keep it for
    --json (``measured``)."""

    def __init__(self) -> None:
        self.console = Console(quiet=not is_rank0())  # under torchrun, one copy of every line
        self.measured: dict[str, Any] = {}

    def __call__(self, report: dict[str, Any]) -> None:
        self.measured["fidelity"] = report
        for line in fidelity_lines(report):
            self.console.print(line, highlight=False, soft_wrap=True)


def _convert(model_ref: str, run: ConvertOptions, conversion, load: LoadOptions, fidelity: _Fidelity) -> None:
    """convert without --finetune: the conversion alone, saved to --out."""
    from .. import convert_with
    from ..preflight import check_model_out, local_model_path

    check_model_out(run.out.expanduser(), local_model_path(model_ref), run.overwrite)  # never over the input
    _, report = convert_with(model_ref, run.scorer, conversion, load, run.out, overwrite=run.overwrite)
    fidelity(report)
    fidelity.console.print(f"wrote {run.out}", highlight=False, soft_wrap=True)
    write_run_json("convert", run.json_out, run.out, **fidelity.measured)


def _convert_and_finetune(
    model_ref: str, run: ConvertOptions, given: Given, calibration: str | None, load: LoadOptions,
    fidelity: _Fidelity,
) -> None:  # fmt: skip
    """convert --finetune without the recipe: convert, then one fine-tuning run."""
    from .. import convert_and_finetune_with, finetune_config

    config = finetune_config(**given.of(FinetuneOptions).given())  # bad values fail before loading
    conversion = given.of(ConvertSettings, text=calibration)
    with training_display(config.steps, config.log_every, run.quiet) as on_step:
        trained, _ = convert_and_finetune_with(
            model_ref, run.scorer, run.out, config, conversion, load, overwrite=run.overwrite,
            resume=run.resume, on_converted=fidelity, on_step=on_step,
        )  # fmt: skip
    print_trained(run.out, trained.path)
    write_run_json("convert", run.json_out, run.out, **fidelity.measured)


@dataclass(frozen=True)
class FinetuneRun:
    """finetune's options that only the command line has: where it writes, and what it shows."""

    out: Path | None = setting(
        None, "Folder to write (default: DIR-ft, beside DIR; DIR is left alone).", type=Path
    )
    in_place: bool = setting(False, "Write over DIR itself (continuing the run recorded there, if any).")
    resume: bool = setting(False, "Continue the run recorded in --out (without --out: in DIR).")
    overwrite: bool = setting(False, "Replace --out if it exists (ssacli's only) and a --json file.")
    json_out: Path | None = run_json()
    quiet: bool = quiet_training()


RESUMED_DATA_HELP = DATA_HELP + " Default: the data of the run recorded in --out."
RUN_STEPS_HELP = f"Total optimizer steps of the run (default {FINETUNE_STEPS})."
FINETUNE_OPTIONS = (
    options(FinetuneOptions, "data", data={"help": RESUMED_DATA_HELP}),
    options(FinetuneRun, "out", "in_place", "resume", "overwrite"),
    options(FinetuneOptions, exclude=("data",), steps={"help": RUN_STEPS_HELP}),
    options(LoadOptions, "device", "trust_remote_code"),
    options(FinetuneRun, "json_out", "quiet"),
)


@command(*FINETUNE_OPTIONS)
def finetune_command(
    model_dir: str = typer.Argument(..., metavar="DIR", help="A folder written by convert (or any MODEL)."),
    *,
    given: Given,
) -> None:
    r"""Fine-tune a converted folder, or continue a fine-tuning run.

    DIR is never written over unless asked: by default the run writes DIR-ft beside it (or --out). --resume
    continues the run recorded in --out, or in DIR without --out (options not given are taken from it; a
    larger --steps extends it). --in-place (or --out DIR) trains DIR itself. The checkpoint with the lowest
    held-out loss is kept in OUT/best; the last line says if the held-out loss ended worse than it started.

    Examples:

      ssacli finetune runs/every-ssa --data icl:every --steps 500

      ssacli finetune runs/every-ssa-ft --resume --steps 1000    # extend the run

      ssacli finetune ./gpt2-ssa --data corpus.jsonl --out ./gpt2-ssa-ft \
          --train scorer
    """
    run = given.of(FinetuneRun)
    if run.out is not None:
        check_writable_folder(run.out, "--out")  # before anything heavy is imported
    check_outputs(("--json", run.json_out), overwrite=run.overwrite)
    training_folder(model_dir, run.out, run.resume, run.in_place)  # a DIR that names nothing, at once
    check_inputs(models=[None if run.resume else model_dir], device=given.device)  # resumed: maybe --out's
    tuning = given.of(FinetuneOptions).given()
    check_data_fits(tuning.get("data", ""), model_dir)  # a task that is none, text for an ICL model, …
    from .. import finetune, finetune_config

    config = finetune_config(model_dir, run.out, resume=run.resume, in_place=run.in_place, **tuning)
    with training_display(config.steps, config.log_every, run.quiet) as on_step:
        trained = finetune(
            model_dir, config, run.out, resume=run.resume, in_place=run.in_place, overwrite=run.overwrite,
            device=given.device, on_step=on_step, trust_remote_code=given.trust_remote_code,
        )  # fmt: skip
    print_trained(trained.path, trained.path)  # DIR-ft, --out, or DIR itself when asked
    write_run_json("finetune", run.json_out, trained.path)


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
