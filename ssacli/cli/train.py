"""`ssacli train`: a language model trained from scratch with any scorer (:func:`ssacli.train_from_scratch`).

The model and its tokenizer come from :func:`ssacli.train.scratch.new_model` (the BPE
tokenizer is trained on the training part of --data); the loop is the fine-tuning one, so softmax
and SSA runs of the same command see the same batches, steps and tokens, and the saved ``training``
record says so. The display is every training command's (cli/convert.py).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from .. import defaults as D
from ..files import check_writable_folder
from ..preflight import MIN_VOCAB
from .options import ATTENTION_HELP, SCORER_LR_HELP, WARMUP_RULE, Device, RunJson, check_inputs, check_outputs
from .training import print_trained, training_display, write_run_json


def train_command(
    data: str = typer.Option(..., help="Training text: a .txt or .jsonl file, or a folder of them."),
    out: Path = typer.Option(..., help="Folder to write the model, tokenizer and checkpoints to."),
    arch: str = typer.Option(
        None, help="gpt2 or llama (causal LM), roberta (masked LM); needed unless --size is a config."
    ),
    size: str = typer.Option(
        None, help=f"{D.SCRATCH_SIZE} (default), small, or a config.json (its model_type: the arch)."
    ),
    scorer: str = typer.Option(D.SCORER, help="Scorer spec, e.g. ssa or ssa:init=paper,learn=n."),
    steps: int = typer.Option(D.FINETUNE_STEPS, min=1, help="Optimizer steps."),
    lr: float = typer.Option(
        D.SCRATCH_LR, help="Peak AdamW learning rate (from scratch: higher than fine-tuning)."
    ),
    scorer_lr: float = typer.Option(D.SCORER_LR, help=SCORER_LR_HELP),
    batch_size: int = typer.Option(D.SCRATCH_BATCH_SIZE, min=1, help="Sequences per micro-batch."),
    seq_len: int = typer.Option(None, min=2, help="Tokens per sequence = model positions (default: size's)."),
    grad_accum: int = typer.Option(D.GRAD_ACCUM, min=1, help="Micro-batches per optimizer step."),
    warmup: int = typer.Option(None, min=0, help=f"Linear warm-up steps (default {WARMUP_RULE})."),
    weight_decay: float = typer.Option(
        D.SCRATCH_WEIGHT_DECAY, min=0, help="AdamW weight decay of the weight matrices."
    ),
    vocab_size: int = typer.Option(
        None,
        min=MIN_VOCAB,
        help="Most BPE tokens (default: the size's vocabulary, printed when the model is built).",
    ),
    seed: int = typer.Option(D.SEED, help="Seed of the weights and of the batches."),
    device: Device = D.DEVICE,
    checkpoint_every: int = typer.Option(D.CHECKPOINT_EVERY, min=1, help="Write a checkpoint every K steps."),
    attention: str = typer.Option(D.ATTENTION, help=f"{ATTENTION_HELP}."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out (same options, --steps may grow)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace a model already in --out, and a --json file."
    ),
    json_out: RunJson = None,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    r"""Train a language model from scratch with any attention scorer.

    The held-out loss (last 10 % of --data) is measured before the first step and at every
    checkpoint; ssacli.json in --out records it with the tokens seen and tokens/s.

    Examples:

      ssacli train --arch gpt2 --scorer ssa --data corpus.txt \
          --out runs/gpt2-ssa --steps 300

      ssacli train --arch roberta --size small --scorer ssa:n=2,learn=none \
          --data childes/ --out runs/bb
    """
    check_writable_folder(out, "--out")  # before anything heavy is imported
    check_outputs(("--json", json_out), overwrite=overwrite)
    check_inputs(scorers=[scorer])
    from .. import FinetuneConfig, ScratchSettings, describe_model, train_from_scratch_with

    def show_built(model) -> None:
        if not quiet:
            Console(stderr=True).print(describe_model(model), highlight=False, soft_wrap=True)

    build = ScratchSettings(arch=arch, size=size, scorer=scorer, vocab_size=vocab_size, seq_len=seq_len)
    config = FinetuneConfig(
        data=data, steps=steps, lr=lr, scorer_lr=scorer_lr, batch_size=batch_size, grad_accum=grad_accum,
        warmup=warmup, weight_decay=weight_decay, seed=seed, checkpoint_every=checkpoint_every,
        attention=attention, train="all",
    )  # fmt: skip
    with training_display(steps, config.log_every, quiet) as on_step:
        trained = train_from_scratch_with(
            build, config, out, resume=resume, overwrite=overwrite, device=device, on_built=show_built,
            on_step=on_step,
        )  # fmt: skip
    print_trained(out, trained.path)
    write_run_json("train", json_out, out)
