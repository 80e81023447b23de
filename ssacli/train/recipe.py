"""Converting a pretrained causal LM to real SSA and keeping its quality: the conversion recipe.

A faithful start (``ssa:init=faithful``: n = m = 128-256, b = 1/m) is exact but is softmax in
disguise; SSA's range is n of a few units. Moving n there in one fine-tune breaks the model
(docs/results/convert-smollm2.md). The recipe follows LoLCATs (Zhang et al., ICLR 2025), which
swaps a pretrained LLM's softmax for another attention in two cheap stages:

1. **transfer** (attention transfer). n moves geometrically from each layer's faithful m to the
   target, step by step, while the scorer's b (one per head) is trained so that every layer's SSA
   output matches softmax's on the same query, key and value (normalized MSE, teacher forcing:
   :func:`ssacli.attention.teacher.transferring`). ``b="tied"`` keeps b = 1/n instead (nothing is
   trained; the stage is then a pure schedule), ``b="learned"`` rescales b with n (b·n kept) and
   lets the gradient correct it.
2. **distill** (distillation). n stays at the target; low-rank adapters (LoRA through ``peft``, on
   ``lora_targets``) and b are trained to minimise KL(original ‖ model) per token on the training
   text, optionally mixed with the LM loss (``lm_weight``). The original is the same model with the
   adapters disabled and scored with softmax (:func:`~ssacli.attention.teacher.scoring_as_softmax`):
   no copy. At the end the adapters are merged, so the result is a plain ssacli folder.

Every ``eval_every`` steps and at each stage's end the run records, on the held-out tenth of the
text: n and b per layer, KL to the original per token and the held-out loss (perplexity = e^loss).
The record (``recipe`` in ssacli.json) says whether the final KL met ``max_kl`` (the budget);
a model whose KL ended above it is reported as missing its target, never as converted. The model
after transfer is saved too (``OUT/stages/transfer``), so ``ssacli report`` and ``diagnose`` can
measure every stage.

Both stages run on :class:`ssacli.train.loop.StepLoop`, so a stopped run keeps its work: OUT is a
checkpoint every ``checkpoint_every`` steps, at each stage's end and after SIGINT/SIGTERM, and
``resume=True`` continues it exactly (:mod:`ssacli.train.recipe_checkpoint`). Randomness: batches
come from (seed, step) as in :mod:`ssacli.train.finetune`. One process only. How n and b move
through the stages is :mod:`ssacli.train.recipe_scorers`'.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..attention.teacher import AttentionTransfer, scoring_as_softmax, transferring
from ..conversion import check_out, convert, save_model
from ..errors import UsageError
from ..files import writer_lock
from ..models.checkpoint import restore_trainer_state, trainer_state_tensors
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, as_loaded, local_model_path
from ..models.optim import make_optimizer, scorer_values
from ..models.options import LoadOptions
from .annealing import NAnnealing
from .data import make_objective, seeded_rng, step_seeds
from .finetune import CLIP_NORM
from .finetune_config import FinetuneConfig
from .loop import StepLoop
from .recipe_checkpoint import (
    check_same_start,
    restore_tensors,
    resumable_tensors,
    trainer_tensors,
    unfinished_run,
)
from .recipe_config import (
    RECIPE_START,
    STAGE_DIR,
    STAGES,
    OnStep,
    RecipeConfig,
    not_causal,
    recipe_trajectory,
)
from .recipe_eval import HeldOut, HeldOutMeasure, final_measures
from .recipe_scorers import ssa_scorers, train_n_and_b
from .runtime import StopSignals


def convert_with_recipe(
    model: str | LoadedModel,
    out: str | Path,
    config: RecipeConfig,
    *,
    overwrite: bool = False,
    resume: bool = False,
    text: str | None = None,
    device: str = "auto",
    on_step: OnStep | None = None,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
    **load: Any,
) -> tuple[LoadedModel, dict[str, Any]]:
    """Convert MODEL (a softmax causal LM) to SSA with n = ``config.target_n`` by the recipe and
    write it to ``out``; return the model and the recipe record (also in ``out``'s ssacli.json).
    ``resume``: continue the unfinished run in ``out`` (from its last checkpoint; a missing ``out``
    starts afresh). ``out`` is locked for the run (:func:`ssacli.files.writer_lock`)."""
    return _run_arm(model, out, config, False, overwrite, resume, text, device, on_step, on_eval, load)


def softmax_control(
    model: str | LoadedModel,
    out: str | Path,
    config: RecipeConfig,
    *,
    overwrite: bool = False,
    resume: bool = False,
    device: str = "auto",
    on_step: OnStep | None = None,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
    **load: Any,
) -> tuple[LoadedModel, dict[str, Any]]:
    """The control a skeptic asks of a recipe conversion: the same budget spent on softmax. MODEL
    keeps its softmax and gets the distillation stage of ``config`` as it is (its LoRA rank and
    targets, data, steps, seed, rate and objective, measured on the same held-out tokens); the
    transfer stage trains SSA's b only, which softmax has not. Written to ``out`` like a recipe
    run (resumable, ``record["control"]`` true); plain transformers loads it. The objective must move
    a model that starts as its own teacher: ``lm_weight`` > 0 (KL alone has no gradient there)."""
    if config.lm_weight <= 0:
        raise UsageError(
            "a softmax control trained on KL to the original alone stays the original (no gradient); "
            "give --lm-weight > 0, the same in both arms"
        )
    config = replace(config, stages=("distill",))
    return _run_arm(model, out, config, True, overwrite, resume, None, device, on_step, on_eval, load)


def _run_arm(model, out, config, control, overwrite, resume, text, device, on_step, on_eval, load):
    config.validate()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError("the conversion recipe runs in one process; launch it without torchrun")
    out = Path(out).expanduser()
    source = model.path if isinstance(model, LoadedModel) else local_model_path(model)
    with writer_lock(out):
        saved = unfinished_run(out, config.recorded()) if resume else None
        if saved is None:
            check_out(out, source, overwrite)
        if control:
            options = {k: v for k, v in load.items() if k != "strict"}
            loaded = as_loaded(model, None, LoadOptions(device=device, dtype="float32", **options))
            meta: dict[str, Any] = {
                "source": str(loaded.path or loaded.name),
                "source_weights": loaded.weights,
            }
        else:
            from .runs import calibration_text

            calibration = text if text is not None else calibration_text(config.data)
            loaded, fidelity = convert(
                model, RECIPE_START, None, text=calibration, device=device, dtype="float32", **load
            )
            meta = {"source": str(loaded.path or loaded.name), "source_weights": loaded.weights}
            meta["fidelity"] = fidelity
        if loaded.kind != ModelKind.CAUSAL:
            raise not_causal(loaded.name, loaded.kind)
        if saved is not None and not control:
            check_same_start(saved, meta["source"], fidelity, out)
        objective = make_objective(loaded, config.data, "causal", config.seq_len)
        run = _Recipe(loaded, objective, config, out, meta, on_step, on_eval)
        record = run.run(saved["recipe"] if saved is not None else None)
    return replace(loaded, path=out, name=str(out)), record


class _Recipe:
    def __init__(self, loaded, objective, config: RecipeConfig, out: Path, meta, on_step, on_eval) -> None:
        self.loaded, self.objective, self.config = loaded, objective, config
        self.out, self.meta = out, meta
        self.on_step, self.on_eval = on_step, on_eval
        self.model: nn.Module = loaded.model
        self.device = next(self.model.parameters()).device
        self.scorers = ssa_scorers(loaded.attention_root)  # a softmax control has none
        # n geometrically from each layer's faithful m; b tied to 1/n, or learned from b·n kept
        b = "tied" if config.b == "tied" else "rescaled"
        self.anneal = NAnnealing(self.scorers, config.target_n, schedule="geometric", b=b).apply
        self.evaluations: list[dict[str, Any]] = []
        self.history: dict[str, list] = {}  # per stage: [step, train loss, lr] rows
        self.stage_seconds: dict[str, float] = {}
        self.seconds = 0.0  # of the sessions before this one (a resumed run's)
        self.began = time.perf_counter()
        self.stages_written = False  # whether OUT/stages/ holds this run's snapshots (carried over)
        self.peft_model = None
        self.heldout = HeldOut.of(objective, config.seq_len, config.heldout_tokens)
        vocab = loaded.model.get_output_embeddings().weight.shape[0]
        self.measure = HeldOutMeasure(self.heldout, vocab) if self.heldout is not None else None

    # ---- the run and its checkpoints ---------------------------------------------------------------

    def run(self, saved: dict[str, Any] | None) -> dict[str, Any]:
        """The stages from the start, or from ``saved`` (the record of the run's last checkpoint)."""
        config = self.config
        at = saved["at"] if saved is not None else {"stage": config.stages[0], "step": 0}
        if saved is None:
            self.evaluate("start", 0)
        else:
            self.evaluations = list(saved["evaluations"])
            self.history = {k: list(v) for k, v in (saved.get("history") or {}).items()}
            seconds = dict(saved.get("seconds") or {})
            self.seconds = float(seconds.pop("total", 0.0))
            self.stage_seconds = seconds
            self.stages_written = (self.out / STAGE_DIR).is_dir()
            restore_tensors(self.model, trainer_tensors(self.out), self.out, adapters=False)  # n and b
        with StopSignals() as signals:
            if "transfer" in config.stages and at["stage"] == "transfer":
                self.transfer(at["step"], signals)
                self._write_stage("transfer")
            elif "transfer" not in config.stages and saved is None and self.scorers:
                if config.target_n is not None:
                    self.anneal(1.0)  # straight to the target n (the "no transfer" arm)
                self.evaluate("transfer-skipped", 0)
            if "distill" in config.stages:
                self.distill(at["step"] if at["stage"] == "distill" else 0, signals)
        record = self.record(finished=True)
        save_model(replace(self.loaded, path=None), self.out, meta={**self.meta, "recipe": record},
                   overwrite=True, carry=self._carry())  # fmt: skip
        return record

    def _carry(self) -> tuple[str, ...]:
        return (STAGE_DIR,) if self.stages_written else ()  # never a replaced folder's old stages

    def _checkpoint(self, stage: str, step: int, optimizer) -> None:
        """OUT as of ``step`` of ``stage``: the model (the adapters merged into a copy), the record
        so far, and trainer.safetensors (:mod:`ssacli.train.recipe_checkpoint`)."""
        extra = resumable_tensors(self.model)
        tensors = trainer_state_tensors(optimizer, step, extra=extra) if optimizer else extra
        model = self.model
        if self.peft_model is not None:
            model = copy.deepcopy(self.peft_model).merge_and_unload()
        record = self.record(finished=False, at={"stage": stage, "step": step})
        meta = {**self.meta, "recipe": record}
        save_model(replace(self.loaded, model=model, path=None), self.out, meta=meta, extra_tensors=tensors,
                   overwrite=True, carry=self._carry())  # fmt: skip

    def _write_stage(self, stage: str) -> None:
        """The model at the end of ``stage``, in OUT/stages/STAGE with the record up to it."""
        record = {**self.record(finished=False, at={"stage": stage, "step": -1}), "snapshot": stage}
        record.pop("at")
        stage_model = copy.deepcopy(self.model).cpu()
        save_model(replace(self.loaded, model=stage_model, path=None), self.out / STAGE_DIR / stage,
                   meta={**self.meta, "recipe": record}, overwrite=True)  # fmt: skip
        self.stages_written = True

    def _scorer_params(self, stage: str) -> list[nn.Parameter]:
        """b (when learned) and, while distilling with ``learn_n``, n; otherwise n is the schedule's."""
        learn_n = stage == "distill" and self.config.learn_n
        return train_n_and_b(self.scorers, learn_n=learn_n, learn_b=self.config.b == "learned")

    # ---- the stages --------------------------------------------------------------------------------

    def transfer(self, start: int, signals: StopSignals) -> None:
        config = self.config
        for p in self.model.parameters():
            p.requires_grad_(False)
        params = self._scorer_params("transfer")
        collector = AttentionTransfer()

        def loss(batch) -> torch.Tensor:
            with transferring(collector):
                self.model(input_ids=batch["input_ids"].to(self.device), use_cache=False)
            return collector.loss()

        if not params:  # tied b: the stage is the schedule alone, nothing is trained
            if start < config.transfer_steps:
                for step in range(config.transfer_steps):
                    self.anneal((step + 1) / config.transfer_steps)
                self.evaluate("transfer", config.transfer_steps)
                self._checkpoint("transfer", config.transfer_steps, None)
            return
        self._train("transfer", params, loss, config.transfer_steps, start, signals, anneal=True)

    def distill(self, start: int, signals: StopSignals) -> None:
        from peft import LoraConfig, get_peft_model

        config = self.config
        for p in self.model.parameters():
            p.requires_grad_(False)
        targets = (
            config.lora_targets if config.lora_targets == "all-linear" else config.lora_targets.split(",")
        )
        lora = LoraConfig(r=config.lora_rank, lora_alpha=2 * config.lora_rank, target_modules=targets,
                          lora_dropout=0.0, bias="none")  # fmt: skip
        with seeded_rng(self.device, config.seed):  # the adapters' random start: the same in every run
            self.peft_model = get_peft_model(self.model, lora)
        if start:  # the adapters and b of the checkpoint
            restore_tensors(self.model, trainer_tensors(self.out), self.out)
        params = [p for p in self.model.parameters() if p.requires_grad]  # the adapters
        params += self._scorer_params("distill")
        if not params:
            raise UsageError("the distill stage has nothing to train")

        def loss(batch) -> torch.Tensor:
            ids = batch["input_ids"].to(self.device)
            with torch.no_grad():
                teacher = self._logits(ids, teacher=True).log_softmax(-1)
            logits = self.model(input_ids=ids, use_cache=False).logits.float()
            student = logits.log_softmax(-1)
            kl = (teacher.exp() * (teacher - student)).sum(-1).mean()
            if not config.lm_weight:
                return kl
            ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            return kl + config.lm_weight * ce

        try:
            self._train("distill", params, loss, config.distill_steps, start, signals, anneal=False)
        finally:
            self.peft_model.merge_and_unload()  # the adapters into the weights: a plain model again
            self.peft_model = None
        self.evaluate("distill-merged", config.distill_steps)

    def _train(self, stage: str, params, loss_fn, steps: int, start: int, signals: StopSignals, *,
               anneal: bool) -> None:  # fmt: skip
        """Steps ``start`` … ``steps`` - 1 of ``stage`` on the StepLoop: the lr schedule, n annealed
        (transfer), batches and dropout from (seed + stage, step), an evaluation every
        ``eval_every`` steps, a checkpoint every ``checkpoint_every``, at the end and on a signal."""
        config = self.config
        schedule = FinetuneConfig(data=config.data, steps=steps, lr=config.lr)
        optimizer = make_optimizer(self.model, params, lr=config.lr, scorer_lr=config.scorer_lr)
        if start:
            restore_trainer_state(self.out, optimizer)
        began, before = time.perf_counter(), self.stage_seconds.get(stage, 0.0)

        def batches(step: int):
            if anneal:
                self.anneal((step + 1) / steps)
            data_seed, torch_seed = step_seeds(config.seed + STAGES.index(stage), 0, step)
            batch = self.objective.sample(config.batch_size, torch.Generator().manual_seed(data_seed))
            with seeded_rng(self.device, torch_seed):
                yield batch

        def after(done: int, value: float) -> None:
            if self.on_step is not None:
                self.on_step(stage, done, steps, value, schedule.lr_at(done - 1))
            if done % config.eval_every == 0 or done == steps:
                self.evaluate(stage, done, train_loss=value)

        def checkpoint(done: int, value: float) -> None:
            self.stage_seconds[stage] = round(before + time.perf_counter() - began, 1)
            self._checkpoint(stage, done, optimizer)

        loop = StepLoop(
            optimizer=optimizer, steps=steps, batches=batches, loss=loss_fn, checkpoint=checkpoint,
            tag=schedule.lr_at, scorer_root=self.loaded.attention_root, folder=self.out,
            advice=f"the {stage} stage stopped before that update ({self.out} keeps its last checkpoint, "
            "if one was written); lower --lr or --scorer-lr, or raise --target-n",
            resume="the same `ssacli convert` command with --resume",
            checkpoint_every=config.checkpoint_every, log_every=1,
            history=self.history.setdefault(stage, []),
            schedule=lambda step: schedule.lr_at(step) / config.lr,
            params=params, clip_norm=CLIP_NORM, on_step=after,
        )  # fmt: skip
        self.model.train()
        try:
            loop.run(start, signals=signals)
        finally:
            self.model.eval()

    # ---- measuring -----------------------------------------------------------------------------------

    def _logits(self, ids: torch.Tensor, *, teacher: bool) -> torch.Tensor:
        if not teacher:
            return self.model(input_ids=ids, use_cache=False).logits.float()
        with scoring_as_softmax():
            if self.peft_model is None:
                return self.model(input_ids=ids, use_cache=False).logits.float()
            with self.peft_model.disable_adapter():
                return self.model(input_ids=ids, use_cache=False).logits.float()

    def _transfer_error(self, ids: torch.Tensor) -> float:
        collector = AttentionTransfer()
        with transferring(collector):
            self.model(input_ids=ids.to(self.device), use_cache=False)
        return float(collector.loss())  # the transfer stage's loss, held out

    @torch.no_grad()
    def evaluate(self, stage: str, step: int, train_loss: float | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {"stage": stage, "step": step, "train_loss": train_loss}
        if self.measure is not None:
            was = self.model.training
            self.model.eval()
            try:
                entry.update(self.measure(
                    lambda ids: self._logits(ids.to(self.device), teacher=False),
                    lambda ids: self._logits(ids.to(self.device), teacher=True),
                    self._transfer_error if self.scorers else None,
                ))  # fmt: skip
            finally:
                self.model.train(was)
        values = scorer_values(self.loaded.attention_root)
        entry["n"], entry["b"] = values.get("n"), values.get("b")
        entry["b_heads"] = values.get("b_heads")
        self.evaluations.append(entry)
        if self.on_eval is not None:
            self.on_eval(entry)
        return entry

    def record(self, *, finished: bool, at: dict[str, Any] | None = None) -> dict[str, Any]:
        """The recipe record: settings, evaluations, loss history, seconds, and the final measures
        (of the last evaluation); ``finished`` false with ``at`` for a checkpoint."""
        seconds = self.seconds + time.perf_counter() - self.began
        config = self.config
        final = final_measures(self.evaluations[-1], max_loss=config.max_loss, target_n=config.target_n,
                               learn_n=config.learn_n)  # fmt: skip
        return {
            "config": config.recorded(),
            "control": not self.scorers,  # a softmax arm: the same budget spent without SSA
            "finished": finished,
            "heldout": self.heldout.describe() if self.heldout is not None else None,
            **({"at": at} if at is not None else {}),
            "evaluations": self.evaluations,
            "history": self.history,
            "seconds": {**self.stage_seconds, "total": round(seconds, 1)},
            "final": final,
        }


__all__ = ["STAGES", "RecipeConfig", "convert_with_recipe", "recipe_trajectory", "softmax_control"]
