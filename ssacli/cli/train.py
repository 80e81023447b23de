"""`ssacli train`: a language model trained from scratch with any scorer.

The model and its tokenizer come from :func:`ssacli.train.scratch.new_model` (the BPE
tokenizer is trained on the training part of --data); the loop is the fine-tuning one
(:func:`ssacli.train.finetune.finetune` with ``train="all"``), so softmax and SSA runs of the same command
see the same batches, steps and tokens, and the saved ``training`` record says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..errors import UsageError
from .convert import run_finetune
from .options import Device

SCRATCH_RECORD = "scratch"  # key in ssacli.json: how the model was built


def train_command(
    data: str = typer.Option(..., help="Training text: a .txt or .jsonl file, or a folder of them."),
    out: Path = typer.Option(..., help="Folder to write the model, tokenizer and checkpoints to."),
    arch: str = typer.Option(
        None, help="gpt2 or llama (causal LM), roberta (masked LM); needed unless --size is a config."
    ),
    size: str = typer.Option(
        None, help="tiny (default), small, or a config.json (its model_type: the arch)."
    ),
    scorer: str = typer.Option("softmax", help="Scorer spec, e.g. ssa or ssa:init=paper,learn=n."),
    steps: int = typer.Option(1000, min=1, help="Optimizer steps."),
    lr: float = typer.Option(1e-3, help="Peak AdamW learning rate (from scratch: higher than fine-tuning)."),
    batch_size: int = typer.Option(16, min=1, help="Sequences per micro-batch."),
    seq_len: int = typer.Option(None, min=2, help="Tokens per sequence = model positions (default: size's)."),
    grad_accum: int = typer.Option(1, min=1, help="Micro-batches per optimizer step."),
    warmup: int = typer.Option(None, min=0, help="Linear warm-up steps (default: 5 % of steps, <= 100)."),
    weight_decay: float = typer.Option(0.1, min=0, help="AdamW weight decay of the weight matrices."),
    vocab_size: int = typer.Option(
        None, min=261, help="Most BPE tokens [1024 tiny, 4096 small, 8192 roberta small]."
    ),
    seed: int = typer.Option(0, help="Seed of the weights and of the batches."),
    device: Device = "auto",
    checkpoint_every: int = typer.Option(500, min=1, help="Write a checkpoint every K steps."),
    attention: str = typer.Option(
        "auto", help="Attention kernels: auto (fused where no weights are needed), eager or fused."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out (same options, --steps may grow)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a model already in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Train a language model from scratch with any attention scorer.

    The held-out loss (last 10 % of --data) is measured before the first step and at every
    checkpoint; ssacli.json in --out records it with the tokens seen and tokens/s.

    Examples:

      ssacli train --arch gpt2 --scorer ssa --data corpus.txt --out runs/gpt2-ssa --steps 300

      ssacli train --arch roberta --size small --scorer ssa:n=2,learn=none --data childes/ --out runs/bb
    """
    from .. import make_scorer
    from ..train.finetune import FinetuneConfig

    spec = make_scorer(scorer).spec  # a bad spec fails before the tokenizer is trained
    if resume and overwrite:
        raise UsageError("--resume continues the run in --out and --overwrite replaces it; give one of them")
    recorded = _recorded(out) if resume else None
    if recorded is None and out.exists() and not overwrite:
        hint = "it holds no run to resume" if resume else "pass --resume to continue it"
        raise UsageError(f"--out {out} already exists ({hint}); pass --overwrite to replace it")
    if recorded is not None:
        _check_same_build(out, recorded, arch=arch, size=size, scorer=spec, vocab_size=vocab_size, seed=seed)
        seq_len = seq_len or recorded["seq_len"]
    config = FinetuneConfig(
        # seq_len: the model's positions, known once it is built (2 passes validation until then)
        data=data, steps=steps, lr=lr, batch_size=batch_size, seq_len=seq_len or 2, grad_accum=grad_accum,
        warmup=warmup, seed=seed, train="all", checkpoint_every=checkpoint_every,
        weight_decay=weight_decay, attention=attention,
    )  # fmt: skip
    config.validate()  # before the tokenizer is trained
    if recorded is not None:
        model: Any = str(out)  # finetune reloads the model, tokenizer and optimizer saved there
        meta = None
    else:
        model, meta = _build(arch, size or "tiny", spec, data, vocab_size, seq_len, seed, quiet)
        config.seq_len = model.max_positions
    # The loop, progress display and summary line of `ssacli finetune`: one format for all training.
    run_finetune(
        model, config, out, resume=resume, overwrite=overwrite, device=device, meta=meta, quiet=quiet
    )


def _recorded(out: Path) -> dict[str, Any] | None:
    """The build record of a from-scratch run saved in ``out`` (None when there is none)."""
    from ..models.checkpoint import read_meta
    from ..train.finetune import training_record

    meta = read_meta(out) if out.is_dir() else None
    if meta is None or training_record(out) is None:
        return None
    if SCRATCH_RECORD not in meta:
        raise UsageError(
            f"{out} holds a fine-tuning run, not one of `ssacli train`; continue it with ssacli finetune"
        )
    return {**meta[SCRATCH_RECORD], "scorer": meta.get("scorer")}


def _check_same_build(out: Path, recorded: dict[str, Any], **given: Any) -> None:
    """--resume with build options that differ from the saved run's would silently be ignored;
    refuse instead (options left out are taken from the run)."""
    changed = [
        f"--{k.replace('_', '-')} {recorded.get(k)} -> {v}"
        for k, v in given.items()
        if v is not None and recorded.get(k) != v and not (k == "size" and recorded.get("size_path") == v)
    ]
    if changed:
        raise UsageError(
            f"{out} holds a run built with other settings ({', '.join(changed)}); resume it with "
            "the same ones or pick a new --out"
        )


def _build(arch, size, spec, data, vocab_size, seq_len, seed, quiet):
    from ..train.scratch import SIZES, describe, new_model, training_texts

    texts = training_texts(data)
    loaded = new_model(arch, size, spec, texts=texts, vocab_size=vocab_size, seq_len=seq_len, seed=seed)
    if not quiet:
        Console(stderr=True).print(describe(loaded), highlight=False, soft_wrap=True)
    record = {
        "arch": loaded.family,
        "size": size if size in SIZES else "config",
        "size_path": None if size in SIZES else size,
        "vocab_size": vocab_size,
        "tokenizer_vocab": len(loaded.tokenizer),
        "seq_len": loaded.max_positions,
        "seed": seed,
    }
    return loaded, {"source": loaded.name, SCRATCH_RECORD: record}
