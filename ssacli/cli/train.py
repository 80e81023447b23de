"""`ssacli train`: a language model trained from scratch with any scorer (:func:`ssacli.train_from_scratch`).

The model and its tokenizer come from :func:`ssacli.train.scratch.new_model` (the BPE
tokenizer is trained on the training part of --data); the loop is the fine-tuning one, so softmax
and SSA runs of the same command see the same batches, steps and tokens, and the saved ``training``
record says so. The display is every training command's (cli/convert.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import LoadOptions, ScratchSettings
from .. import defaults as D
from ..files import check_writable_folder
from ..preflight import check_new_run, check_scratch_arch, read_scratch_size, require_text_data
from ..setting import setting
from .declared import Given, command, options
from .options import ATTENTION_HELP, SCORER_LR_HELP, WARMUP_RULE, check_inputs, check_outputs, run_json
from .training import print_trained, training_display, write_run_json


@dataclass(frozen=True)
class TrainRun:
    """train's loop options, each a :class:`ssacli.FinetuneConfig` field of the same name with the
    defaults of a run from scratch (tests/cli/test_declared.py checks), and what the command writes."""

    data: str = setting(help="Training text: a .txt or .jsonl file, or a folder of them.", type=str)
    out: Path = setting(help="Folder to write the model, tokenizer and checkpoints to.", type=Path)
    steps: int = setting(D.FINETUNE_STEPS, "Optimizer steps.", min=1)
    lr: float = setting(D.SCRATCH_LR, "Peak AdamW learning rate (from scratch: higher than fine-tuning).")
    scorer_lr: float = setting(D.SCORER_LR, SCORER_LR_HELP)
    batch_size: int = setting(D.SCRATCH_BATCH_SIZE, "Sequences per micro-batch.", min=1)
    grad_accum: int = setting(D.GRAD_ACCUM, "Micro-batches per optimizer step.", min=1)
    warmup: int | None = setting(None, f"Linear warm-up steps (default {WARMUP_RULE}).", type=int, min=0)
    weight_decay: float = setting(D.SCRATCH_WEIGHT_DECAY, "AdamW weight decay of the weight matrices.", min=0)
    seed: int = setting(D.SEED, "Seed of the weights and of the batches.")
    checkpoint_every: int = setting(D.CHECKPOINT_EVERY, "Write a checkpoint every K steps.", min=1)
    attention: str = setting(D.ATTENTION, f"{ATTENTION_HELP}.")
    resume: bool = setting(False, "Continue the run in --out (same options, --steps may grow).")
    overwrite: bool = setting(False, "Replace a model already in --out, and a --json file.")
    json_out: Path | None = run_json()
    quiet: bool = setting(False, "No progress bar.", flags=("--quiet", "-q"))

    def loop(self) -> dict[str, Any]:
        """The FinetuneConfig settings of the run (its training data among them)."""
        cli_only = ("out", "resume", "overwrite", "json_out", "quiet")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in cli_only}


TRAIN_OPTIONS = (
    options(TrainRun, "data", "out"),
    options(ScratchSettings, "arch", "size", "scorer"),
    options(TrainRun, "steps", "lr", "scorer_lr", "batch_size"),
    options(ScratchSettings, "seq_len"),
    options(TrainRun, "grad_accum", "warmup", "weight_decay"),
    options(ScratchSettings, "vocab_size"),
    options(TrainRun, "seed"),
    options(LoadOptions, "device"),
    options(TrainRun, "checkpoint_every", "attention", "resume", "overwrite", "json_out", "quiet"),
)


@command(*TRAIN_OPTIONS)
def train_command(*, given: Given) -> None:
    r"""Train a language model from scratch with any attention scorer.

    The held-out loss (last 10 % of --data) is measured before the first step and at every
    checkpoint; ssacli.json in --out records it with the tokens seen and tokens/s.

    Examples:

      ssacli train --arch gpt2 --scorer ssa --data corpus.txt \
          --out runs/gpt2-ssa --steps 300

      ssacli train --arch roberta --size small --scorer ssa:n=2,learn=none \
          --data childes/ --out runs/bb
    """
    run = given.of(TrainRun)
    check_writable_folder(run.out, "--out")  # before anything heavy is imported
    check_outputs(("--json", run.json_out), overwrite=run.overwrite)
    check_inputs(scorers=[given.scorer], device=given.device)
    require_text_data(run.data)  # an ICL task, or a path that names nothing: before the model stack
    build = given.of(ScratchSettings)
    check_scratch_arch(build.arch, build.size)
    read_scratch_size(build.arch, build.size or D.SCRATCH_SIZE)  # no --arch for tiny, a size that is none
    check_new_run(run.out, run.resume, run.overwrite)  # an --out that holds a run already
    from .. import FinetuneConfig, train_from_scratch_with

    config = FinetuneConfig(**run.loop(), train="all")
    with training_display(run.steps, config.log_every, run.quiet) as on_step:
        trained = train_from_scratch_with(
            build, config, run.out, resume=run.resume, overwrite=run.overwrite, device=given.device,
            on_built=_show_built(run.quiet), on_step=on_step,
        )  # fmt: skip
    print_trained(run.out, trained.path)
    write_run_json("train", run.json_out, run.out)


def _show_built(quiet: bool):
    """The ``on_built`` of a run: the model's one line on stderr, unless --quiet."""
    from .. import describe_model

    def show_built(model) -> None:
        if not quiet:
            Console(stderr=True).print(describe_model(model), highlight=False, soft_wrap=True)

    return show_built
