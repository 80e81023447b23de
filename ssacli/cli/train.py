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

from ..defaults import SCORER_LR
from ..files import check_writable_folder
from .convert import print_trained, training_display
from .options import SCORER_LR_HELP, Device


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
    scorer_lr: float = typer.Option(SCORER_LR, help=SCORER_LR_HELP),
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
    from .. import FinetuneConfig, train_from_scratch
    from ..train.scratch import describe

    def show_built(model) -> None:
        if not quiet:
            Console(stderr=True).print(describe(model), highlight=False, soft_wrap=True)

    loop = dict(
        steps=steps, lr=lr, scorer_lr=scorer_lr, batch_size=batch_size, grad_accum=grad_accum, warmup=warmup,
        weight_decay=weight_decay, checkpoint_every=checkpoint_every, attention=attention,
    )  # fmt: skip
    with training_display(steps, FinetuneConfig.log_every, quiet) as on_step:
        trained = train_from_scratch(
            data, out, arch=arch, size=size, scorer=scorer, vocab_size=vocab_size, seq_len=seq_len,
            seed=seed, resume=resume, overwrite=overwrite, device=device, on_built=show_built,
            on_step=on_step, **loop,
        )  # fmt: skip
    print_trained(out, trained.path)
