"""`ssacli convert` and `ssacli finetune`: swap a model's scorer, optionally fine-tune, save a folder.

Registered on the main Typer app when ssacli/cli.py imports this module. Fine-tuning options are
optional (None) on purpose: ``convert`` refuses them without ``--finetune``, and ``finetune``
takes whatever is not given from the run recorded in the folder it resumes, so
``ssacli finetune DIR --steps 2000`` extends a run without repeating its settings.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..errors import UsageError
from . import _TRUST_HELP, app, load_trusted

_DATA_HELP = "Training data: a .txt file, a .jsonl file (field 'text'), a folder of them, or icl:TASK."


def _finetune_options(**given: Any) -> dict[str, Any]:
    return {k: v for k, v in given.items() if v is not None}


@app.command("convert")
def convert_command(
    model_ref: str = typer.Argument(..., metavar="MODEL", help="HF folder, builtin:NAME, or cached Hub id."),
    scorer: str = typer.Option(..., help="Scorer spec, e.g. ssa:init=faithful or ssa:init=faithful,m=256."),
    out: Path = typer.Option(..., help="Folder to write (plain transformers can load it too)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it exists."),
    do_finetune: bool = typer.Option(False, "--finetune", help="Fine-tune after converting (needs --data)."),
    data: str = typer.Option(None, help=_DATA_HELP),
    steps: int = typer.Option(None, min=1, help="Optimizer steps (default 1000)."),
    lr: float = typer.Option(None, help="Peak AdamW learning rate (default 1e-4)."),
    batch_size: int = typer.Option(None, min=1, help="Sequences per micro-batch, ICL: prompts (default 8)."),
    seq_len: int = typer.Option(
        None, min=2, help="Tokens per training window, text data only (default 128)."
    ),
    grad_accum: int = typer.Option(None, min=1, help="Micro-batches per step (default 1)."),
    warmup: int = typer.Option(None, min=0, help="Linear warmup steps (default 5% of --steps, at most 100)."),
    schedule: str = typer.Option(
        None, help="After warmup: cosine (to 10% of --lr) or constant (default cosine)."
    ),
    weight_decay: float = typer.Option(None, min=0, help="AdamW weight decay, on matrices only (default 0)."),
    seed: int = typer.Option(None, help="Seed of the batches and dropout (default 0)."),
    train: str = typer.Option(None, help="all, or scorer: only the scorer's parameters (default all)."),
    anneal_n: float = typer.Option(None, help="SSA: move n linearly to this value over the run (b = 1/n)."),
    checkpoint_every: int = typer.Option(None, min=1, help="Write a checkpoint every K steps (default 500)."),
    log_every: int = typer.Option(None, min=1, help="Record the loss every K steps (default 10)."),
    attention: str = typer.Option(
        None, help="Attention kernels: auto (fused where no weights are needed), eager, fused (default auto)."
    ),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    dtype: str = typer.Option("auto", help="auto (float32 on CPU and when fine-tuning), float32, bfloat16."),
    allow_download: bool = typer.Option(False, "--allow-download", help="Fetch a Hub id not in the cache."),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Load .bin weights (weights_only=True)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=_TRUST_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or step log."),
) -> None:
    """Swap MODEL's attention scorer, report how close it stays, and save it to --out.

    Fidelity compares outputs before and after the swap on the same inputs: KL per token and
    top-1 agreement for language models (and ICL sign models), relative error otherwise.

    Examples:

      ssacli convert ./my-model --scorer ssa:init=faithful --out ./my-model-ssa

      ssacli convert builtin:every-softmax --scorer ssa:init=faithful --out ./every-ssa

      ssacli convert ./gpt2 --scorer ssa:init=faithful --out ./gpt2-ssa --finetune --data corpus/

      ssacli convert ./gpt2 --scorer ssa:init=faithful --out ./g --finetune --data c.txt --anneal-n 8
    """
    from ..conversion import check_out, convert
    from ..models.loading import local_model_path
    from ..scorers import make_scorer

    options = _finetune_options(
        data=data, steps=steps, lr=lr, batch_size=batch_size, seq_len=seq_len, grad_accum=grad_accum,
        warmup=warmup, schedule=schedule, weight_decay=weight_decay, seed=seed, train=train,
        anneal_n=anneal_n, checkpoint_every=checkpoint_every, log_every=log_every, attention=attention,
    )  # fmt: skip
    if options and not do_finetune:
        raise UsageError(f"--{next(iter(options)).replace('_', '-')} only applies with --finetune")
    make_scorer(scorer)  # a bad spec fails before loading
    config = _config(options, {}) if do_finetune else None  # bad values fail before loading
    check_out(out.expanduser(), local_model_path(model_ref), overwrite)  # never over the input
    if do_finetune and dtype == "auto":
        dtype = "float32"  # AdamW on bf16/fp16 weights loses small updates; autocast covers speed
    save_to = None if do_finetune else out
    load = dict(device=device, dtype=dtype, allow_download=allow_download, allow_pickle=allow_pickle)
    model = load_trusted(model_ref, **load) if trust_remote_code else model_ref
    loaded, report = convert(model, scorer, save_to, overwrite=overwrite, **load)
    console = Console(quiet=not _is_rank0())  # under torchrun, one copy of every line
    console.print(_fidelity_line(report), highlight=False, soft_wrap=True)
    if config is None:
        console.print(f"wrote {out}", highlight=False, soft_wrap=True)
        return
    meta = {"source": str(loaded.path or loaded.name), "fidelity": report}
    _run(loaded, config, out, resume=False, overwrite=overwrite, device=device, meta=meta, quiet=quiet)


@app.command("finetune")
def finetune_command(
    model_dir: str = typer.Argument(..., metavar="DIR", help="A folder written by convert (or any MODEL)."),
    data: str = typer.Option(None, help=_DATA_HELP + " Default: the data of the run recorded in --out."),
    out: Path = typer.Option(
        None, help="Folder to write (default DIR itself, continuing the run recorded there)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the run recorded in --out."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it exists."),
    steps: int = typer.Option(None, min=1, help="Total optimizer steps of the run (default 1000)."),
    lr: float = typer.Option(None, help="Peak AdamW learning rate (default 1e-4)."),
    batch_size: int = typer.Option(None, min=1, help="Sequences per micro-batch, ICL: prompts (default 8)."),
    seq_len: int = typer.Option(
        None, min=2, help="Tokens per training window, text data only (default 128)."
    ),
    grad_accum: int = typer.Option(None, min=1, help="Micro-batches per step (default 1)."),
    warmup: int = typer.Option(None, min=0, help="Linear warmup steps (default 5% of --steps, at most 100)."),
    schedule: str = typer.Option(
        None, help="After warmup: cosine (to 10% of --lr) or constant (default cosine)."
    ),
    weight_decay: float = typer.Option(None, min=0, help="AdamW weight decay, on matrices only (default 0)."),
    seed: int = typer.Option(None, help="Seed of the batches and dropout (default 0)."),
    train: str = typer.Option(None, help="all, or scorer: only the scorer's parameters (default all)."),
    anneal_n: float = typer.Option(None, help="SSA: move n linearly to this value over the run (b = 1/n)."),
    checkpoint_every: int = typer.Option(None, min=1, help="Write a checkpoint every K steps (default 500)."),
    log_every: int = typer.Option(None, min=1, help="Record the loss every K steps (default 10)."),
    attention: str = typer.Option(
        None, help="Attention kernels: auto (fused where no weights are needed), eager, fused (default auto)."
    ),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or step log."),
) -> None:
    """Fine-tune a converted folder, or continue a fine-tuning run.

    Without --out, DIR itself is trained in place: the run recorded in DIR continues (options not
    given are taken from it; a larger --steps extends it), or, if DIR holds no run, one starts and
    replaces DIR's weights. With --out, DIR is left alone; --resume continues the run in --out.

    Examples:

      ssacli finetune runs/every-ssa --data icl:every --steps 500

      ssacli finetune runs/every-ssa --steps 1000          # extend the recorded run

      ssacli finetune ./gpt2-ssa --data corpus.jsonl --out ./gpt2-ssa-ft --train scorer
    """
    from ..train.finetune import training_record

    if out is None:
        if model_dir.startswith("builtin:") or not Path(model_dir).expanduser().is_dir():
            raise UsageError(f"{model_dir} is not a folder to train in place; give --out DIR")
        out, resume = Path(model_dir), True
    out = out.expanduser()
    recorded = (training_record(out) or {}).get("config", {}) if resume else {}
    options = _finetune_options(
        data=data, steps=steps, lr=lr, batch_size=batch_size, seq_len=seq_len, grad_accum=grad_accum,
        warmup=warmup, schedule=schedule, weight_decay=weight_decay, seed=seed, train=train,
        anneal_n=anneal_n, checkpoint_every=checkpoint_every, log_every=log_every, attention=attention,
    )  # fmt: skip
    config = _config(options, recorded)
    _run(model_dir, config, out, resume=resume, overwrite=overwrite, device=device, meta=None, quiet=quiet)


def _config(options: dict[str, Any], recorded: dict[str, Any]):
    from ..train.finetune import FinetuneConfig

    names = {f.name for f in fields(FinetuneConfig)}
    values = {k: v for k, v in recorded.items() if k in names} | options
    if "data" not in values:
        raise UsageError("--data is required: " + _DATA_HELP)
    config = FinetuneConfig(**values)
    config.validate()
    return config


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


def _is_rank0() -> bool:
    """False on the other processes of a torchrun / accelerate launch (they print nothing)."""
    return int(os.environ.get("RANK", "0")) == 0


def _run(loaded, config, out: Path, *, resume, overwrite, device, meta, quiet) -> None:
    """finetune() with a rich progress bar on terminals, a step log line elsewhere, then a summary."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from ..train.finetune import finetune, training_record

    stderr = Console(stderr=True)
    kwargs = {"resume": resume, "overwrite": overwrite, "device": device, "meta": meta}
    if quiet or not stderr.is_terminal:

        def log(step: int, loss: float, lr: float, tokens_per_s: float) -> None:
            if not quiet and (step % config.log_every == 0 or step == config.steps):
                stderr.print(
                    f"step {step}/{config.steps} loss {loss:.4g} lr {lr:.3g} {tokens_per_s:,.0f} tok/s",
                    highlight=False,
                )

        result = finetune(loaded, config, out, on_step=log, **kwargs)
    else:
        columns = [
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn(
                "loss {task.fields[loss]:.4g} · lr {task.fields[lr]:.2e} · {task.fields[tps]:,.0f} tok/s"
            ),
            TimeRemainingColumn(),
        ]
        with Progress(*columns, console=stderr) as progress:
            bar = progress.add_task("fine-tuning", total=config.steps, loss=float("nan"), lr=0.0, tps=0.0)

            def on_step(step: int, loss: float, lr: float, tokens_per_s: float) -> None:
                progress.update(bar, completed=step, loss=loss, lr=lr, tps=tokens_per_s)

            result = finetune(loaded, config, out, on_step=on_step, **kwargs)
    if not _is_rank0():
        return
    record = training_record(result.path) or {}
    history, heldout = record.get("history") or [], record.get("heldout") or []
    parts = [f"wrote {out} (step {record.get('step')}"]
    if history:
        parts.append(f"loss {history[0][1]:.4g} → {history[-1][1]:.4g}")
    if len(heldout) > 1:
        parts.append(f"held-out loss {heldout[0][1]:.4g} → {heldout[-1][1]:.4g}")
    parts.append(f"{record.get('seconds')} s, {record.get('tokens_per_s', 0):,.0f} tokens/s)")
    typer.echo(", ".join(parts))
