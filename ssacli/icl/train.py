"""Training an ICL model from scratch: Adam (the scorer in its own group: ssacli.models.optim), a
curriculum on the number of points, checkpoints that resume exactly (weights, optimizer moments
and the data generator's state, all safetensors). The steps themselves (and when a checkpoint is
written, a Ctrl-C included) are :class:`ssacli.train.loop.StepLoop`'s, fine-tuning's loop too."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..attention.backend import check_backend
from ..attention.interface import attention_backend
from ..defaults import (
    ATTENTION,
    ICL_ARCH,
    ICL_BATCH_SIZE,
    ICL_CHECKPOINT_EVERY,
    ICL_LR,
    ICL_POINTS,
    ICL_POINTS_START,
    ICL_PRESET,
    ICL_STEPS,
    SCORER,
    SCORER_LR,
    SEED,
)
from ..errors import UsageError
from ..files import check_writable_folder, writer_lock
from ..models.checkpoint import META_FILE, check_replaceable, restore_trainer_state, trainer_state_tensors
from ..models.icl import ICLModel, ICLSpec, check_arch, load_icl, save_icl
from ..models.icl_settings import check_preset
from ..models.icl_task import check_task, sample_batch, task_loss
from ..models.loading import resolve_device
from ..models.optim import (
    check_rates,
    learned_names,
    learned_scorer,
    legacy_order,
    make_optimizer,
)
from ..scorers import make_scorer
from ..train.folders import check_new_run
from ..train.loop import StepLoop


@dataclass
class TrainConfig:
    task: str
    scorer: str = SCORER
    steps: int = ICL_STEPS
    batch_size: int = ICL_BATCH_SIZE
    lr: float = ICL_LR
    scorer_lr: float | None = SCORER_LR  # own Adam group (ssacli.models.optim); None: at lr (older runs)
    seed: int = SEED
    preset: str = ICL_PRESET
    layers: int | None = None
    heads: int | None = None
    width: int | None = None
    points_start: int = ICL_POINTS_START
    points_end: int = ICL_POINTS
    points_every: int | None = None  # steps between +2 points; None: reach the end at half-way
    checkpoint_every: int = ICL_CHECKPOINT_EVERY
    log_every: int = 50
    attention: str = ATTENTION  # attention backend: auto (fused kernels), eager or fused
    arch: str = ICL_ARCH  # backbone: gpt2 (pre-LN, MLP) or attn-only (no MLP, no LayerNorm)

    def validate(self) -> None:
        """Fail on a bad task, backbone, attention backend or scorer spec before any work."""
        check_task(self.task)
        check_arch(self.arch)
        check_backend(self.attention)
        make_scorer(self.scorer)
        check_rates(lr=self.lr, scorer_lr=self.scorer_lr)

    def curriculum_every(self) -> int:
        if self.points_every is not None:
            return max(1, self.points_every)
        increments = max(1, math.ceil((self.points_end - self.points_start) / 2))
        return max(1, self.steps // (2 * increments))

    def points_at(self, step: int) -> int:
        return min(self.points_end, self.points_start + 2 * (step // self.curriculum_every()))




def spec_from_preset(task: str, scorer: str, preset: str = "cpu", arch: str = "gpt2", **overrides) -> ICLSpec:
    """The spec of a new ICL model: a size preset, with explicit sizes (not None) taking precedence."""
    layers, heads, width = check_preset(preset)
    sizes = {"layers": layers, "heads": heads, "width": width}
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    return ICLSpec(task=check_task(task), scorer=scorer, arch=check_arch(arch), **sizes)


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    device: str = "auto",
    on_step: Callable[[int, float, int], None] | None = None,
    stop_at: int | None = None,
    resume_advice: str = "the same command with --resume",
) -> ICLModel:
    """Train and write checkpoints to ``out`` (every ``checkpoint_every`` steps and at the end).

    ``resume_advice``: how the interrupted-run message says to continue (a sweep resumes by running
    again, with no --resume flag).

    ``stop_at``: stop (with a checkpoint) after that step of the run's ``config.steps`` schedule,
    so a resumed run continues it; learning curves measure one run this way (studies/icl-v3/curve.py).

    ``resume`` continues the run saved in ``out`` (a fresh start if there is none); without it an
    existing checkpoint in ``out`` is only replaced when ``overwrite`` is set. SIGINT/SIGTERM
    finish the step, write a checkpoint and raise InterruptedJobError; the steps run in
    :class:`ssacli.train.loop.StepLoop`.
    """
    out = Path(out)
    config.validate()
    check_writable_folder(out, "--out")  # before the first step, not at the first checkpoint
    with writer_lock(out):  # one writer of out: a second job is refused at once
        return _train_into(config, out, resume, overwrite, device, on_step, stop_at, resume_advice)


def _train_into(
    config: TrainConfig,
    out: Path,
    resume: bool,
    overwrite: bool,
    device: str,
    on_step,
    stop_at,
    resume_advice: str,
) -> ICLModel:
    check_replaceable(out)  # a folder ssacli did not write is never replaced, --overwrite or not
    exists = (out / META_FILE).is_file()
    check_new_run(out, resume, overwrite, icl=True)
    dev = resolve_device(device)
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed + 1)
    if resume and exists:
        model = load_icl(out, dev).train()
        history = list(model.spec.training.get("history", []))
        recorded = model.spec.training.get("config", {})
        found = (recorded.get("task"), recorded.get("scorer"), model.spec.arch)
        if found != (config.task, config.scorer, config.arch):
            raise UsageError(
                f"{out} holds a run of {'/'.join(found)}; resume it with the same --task, "
                "--scorer and --arch, or pick a new --out"
            )
        if recorded.get("scorer_lr") is None:  # a run from before the scorer group: its rates
            config = replace(config, scorer_lr=None)
        elif recorded["scorer_lr"] != config.scorer_lr:
            raise UsageError(
                f"{out} holds a run with --scorer-lr {recorded['scorer_lr']}; resume it with "
                "the same --scorer-lr, or pick a new --out"
            )
        window = model.spec.training.get("scorer_at_window")
    else:
        spec = spec_from_preset(
            config.task,
            config.scorer,
            config.preset,
            config.arch,
            layers=config.layers,
            heads=config.heads,
            width=config.width,
            max_points=max(200, config.points_end),
        )
        model = ICLModel(spec).to(dev).train()
        start, history, window = 0, [], None
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(model, trainable, lr=config.lr, scorer_lr=config.scorer_lr)
    if resume and exists:
        order = legacy_order(model, trainable, grouped=False) if config.scorer_lr is None else None
        start, _ = restore_trainer_state(out, optimizer, generator=generator, saved_order=order)
    previous_seconds = model.spec.training.get("seconds", 0.0) if start else 0.0

    def batches(step: int):  # one batch a step, from the run's generator (saved with each checkpoint)
        points = config.points_at(step)
        yield sample_batch(config.task, config.batch_size, points, generator=generator, device=dev)

    def report(step: int, loss: float) -> None:
        on_step(step, loss, config.points_at(step - 1))

    def checkpoint(step: int, loss: float) -> None:
        model.spec.training = {
            "config": asdict(config),
            "step": step,
            "seconds": round(previous_seconds + loop.elapsed(), 1),
            "history": loop.history,
            "scorer_at_window": loop.window,
            "scorer": learned_scorer(model.backbone, loop.window, learned_names(model.backbone)),
        }
        save_icl(model, out, trainer_state_tensors(optimizer, step, generator=generator))

    loop = StepLoop(
        optimizer=optimizer,
        steps=config.steps,
        batches=batches,
        loss=lambda batch: task_loss(config.task, model(batch.tokens), batch.ys),
        checkpoint=checkpoint,
        tag=config.points_at,
        scorer_root=model.backbone,
        folder=out,
        advice="lower --lr or check the scorer spec",
        resume=resume_advice,
        checkpoint_every=config.checkpoint_every,
        log_every=config.log_every,
        history=history,
        window=window,
        on_step=None if on_step is None else report,
    )
    with attention_backend(model, config.attention):  # fused kernels unless asked otherwise
        loop.run(start, stop=stop_at)
    return model.eval()
