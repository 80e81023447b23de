"""Fine-tuning a (converted) model: causal-LM, masked-LM or ICL objective, resumable checkpoints.

This module is the run: :func:`finetune` and its checkpoints; its settings, :class:`FinetuneConfig`
(importable from here too), are :mod:`ssacli.train.finetune_config`'s. The steps
are :class:`ssacli.train.loop.StepLoop`'s (ICL training's too): a non-finite loss or gradient stops
with JobFailedError (exit 5) before the bad update, SIGINT/SIGTERM with a checkpoint and
InterruptedJobError (exit 130). What the run sets up around the loop (the process group, the
signals) is in :mod:`ssacli.train.runtime`.

* AdamW over :func:`ssacli.models.optim.make_optimizer`'s groups: weight decay on matrices only
  (decaying a bias or a norm pulls it to an arbitrary value, not to "simpler"), and the scorer's
  parameters in their own group at ``scorer_lr`` without decay (why: that module's docstring);
  linear warmup then cosine decay to 10 % of each group's rate (or ``schedule="constant"``),
  gradient accumulation, gradient clipping at 1.0, bf16 autocast on CUDA. The record's ``scorer``
  holds the learned values per layer at the end and whether each converged (moved < 1 % over the
  last 10 % of steps).
* ``train="scorer"`` updates only parameters under ``.ssacli_scorer.`` (every other tensor stays
  bit-identical); ``train="all"`` everything trainable.
* ``anneal_n=T`` (SSA only) moves n linearly from its start value to T over the run and, unless b
  is learned, keeps b = 1/n (the ``init=faithful`` relation). n is then set, not learned
  (:class:`~ssacli.train.annealing.NAnnealing`, linear).
* Randomness: every step draws its batch and its dropout masks from seeds derived from
  (seed, rank, step), inside a forked RNG. So a checkpoint needs no generator state to resume
  exactly, ranks of a distributed run draw different data, and the caller's RNG is left alone.
  "Exactly" means bit for bit on the same hardware and thread count (CPU reductions depend on it).
* Checkpoints at step 0, every ``checkpoint_every`` steps and at the end go through
  :func:`ssacli.conversion.save_model` (atomic): the model, ``ssacli.json`` with the ``training``
  record, and ``trainer.safetensors`` (AdamW moments, step, world size, anneal start values; the
  format is :mod:`ssacli.models.checkpoint`'s). ``best/`` keeps the checkpoint with the lowest
  held-out loss (step 0 included); the record's ``worsened`` says the held-out loss ended above
  its start (``heldout_start``, ``heldout_end``, ``best``).
* With ``WORLD_SIZE`` > 1 (torchrun, accelerate launch) the process group is started (gloo on CPU,
  nccl on CUDA; :class:`~ssacli.train.runtime.Distributed`), the model wrapped in
  DistributedDataParallel, the logged loss averaged over ranks; only rank 0 writes. Resuming needs
  the output folder on a filesystem every rank can read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..attention.interface import attention_backend
from ..conversion import save_model
from ..defaults import DEVICE
from ..errors import JobFailedError, UsageError
from ..files import check_writable_folder, writer_lock
from ..models.checkpoint import (
    BEST_DIR,
    SCORER_KEY,
    read_meta,
    restore_trainer_state,
    trainer_state_tensors,
    training_record,
)
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, load_with, resolve_device
from ..models.optim import learned_names, learned_scorer, legacy_order, make_optimizer
from ..models.options import LoadOptions
from .annealing import anneal_n
from .data import make_objective, seeded_rng, step_seeds
from .finetune_config import FinetuneConfig, check_resumable
from .folders import plan_output, training_folder
from .loop import StepLoop
from .monitor import SaturationMonitor
from .runtime import Distributed, StopSignals
from .trajectory import Trajectory, write_trajectory

CLIP_NORM = 1.0
RATE_WINDOW = 20  # steps over which on_step's tokens/s is measured


def finetune(
    loaded: LoadedModel | str,
    config: FinetuneConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    in_place: bool = False,
    overwrite: bool = False,
    device: str = DEVICE,
    on_step: Callable[[int, float, float, float], None] | None = None,
    meta: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Fine-tune ``loaded`` (a LoadedModel or a MODEL reference) and write it to ``out``.

    Where it writes is :func:`training_folder`'s: ``out``; or, for ``out=None``, a new folder
    beside MODEL's (``<folder>-ft``), or MODEL's own folder with ``in_place`` or ``resume`` (the
    input is written over only when asked). ``resume`` continues the run saved there (the model
    then comes from it). An existing folder is otherwise replaced only with ``overwrite`` (or
    ``in_place``), and only if ssacli wrote it or it is empty. The run writes a checkpoint at step
    0, every ``checkpoint_every`` steps and at the end, and keeps the one with the lowest held-out
    loss in ``best/``; the record says whether the held-out loss ended worse than it started
    (``worsened``). ``on_step(step, loss, lr, tokens_per_s)`` is called after every step (rank 0).
    ``meta`` adds records to ssacli.json. ``trust_remote_code`` is for loading a MODEL reference
    (:class:`~ssacli.models.options.LoadOptions`).
    """
    config.validate()
    out, resume, in_place = training_folder(loaded, out, resume, in_place)
    check_writable_folder(out, "--out")  # before the first step, not at the first checkpoint
    with writer_lock(out):  # one writer of out (rank 0's; the other ranks never write)
        return _finetune(loaded, config, out, resume, in_place, overwrite, device, on_step, meta,
                         trust_remote_code)  # fmt: skip


def _finetune(loaded, config, out, resume, in_place, overwrite, device, on_step, meta, trust_remote_code):
    ddp = Distributed.start()
    try:
        dev = torch.device("cuda", ddp.local_rank) if ddp.world > 1 and torch.cuda.is_available() else None
        dev = dev or resolve_device(device)
        path = loaded.path if isinstance(loaded, LoadedModel) else Path(loaded).expanduser()
        plan = ddp.decide(lambda: plan_output(out, path, resume, overwrite, in_place))
        load = LoadOptions(device=str(dev), trust_remote_code=trust_remote_code)
        if plan == "resume":
            loaded = load_with(str(out), load)
        elif isinstance(loaded, str):
            loaded = load_with(loaded, replace(load, dtype="float32"))
        return _Run(loaded, config, out, dev, ddp, on_step, meta).run(plan == "resume")
    finally:
        ddp.close()


class _Run:
    def __init__(self, loaded, config, out, dev, ddp, on_step, meta) -> None:
        self.loaded, self.config, self.out, self.dev, self.ddp = loaded, config, out, dev, ddp
        self.on_step = on_step if ddp.rank == 0 else None
        self.model = loaded.model.to(dev)
        self.objective = make_objective(loaded, config.data, config.objective, config.seq_len)
        # Records already in the folder's ssacli.json (source, fidelity) stay; ICL folders keep theirs
        # in the model's spec, which save_model merges into.
        existing = (
            read_meta(loaded.path) if loaded.path is not None and loaded.kind != ModelKind.ICL else None
        )
        drop = ("format", "format_version", "scorer", "training")
        self.carry = {k: v for k, v in (existing or {}).items() if k not in drop} | (meta or {})
        target = config.anneal_n
        self.anneal = anneal_n(loaded.attention_root, target) if target is not None else None
        self.flags = {p: p.requires_grad for p in self.model.parameters()}  # restored at the end
        self.trajectory: list[dict[str, Any]] = []  # one record per held-out evaluation
        self.tracker: Trajectory | None = None
        self.monitor = SaturationMonitor(config.monitor_every) if config.monitor_every else None

    def _trainable(self) -> list[nn.Parameter]:
        if self.anneal is not None:
            self.anneal.freeze()
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if self.config.train == "scorer":
            named = [(n, p) for n, p in named if SCORER_KEY in f".{n}"]
        if not named:
            what = "its scorer has" if self.config.train == "scorer" else "the model has"
            raise UsageError(
                f"nothing to train: {what} no trainable parameters (--train all, or a scorer "
                "with learned parameters such as ssa)"
            )
        chosen = {id(p) for _, p in named}
        for p in self.model.parameters():
            p.requires_grad_(id(p) in chosen)
        if any(p.dtype in (torch.float16, torch.bfloat16) for _, p in named):
            raise UsageError(
                "fine-tuning needs float32 weights (load with --dtype float32); bf16 autocast "
                "is used on CUDA by itself"
            )
        return [p for _, p in named]

    def run(self, resumed: bool) -> LoadedModel:
        try:
            self.params = self._trainable()
            with attention_backend(self.model, self.config.attention):  # held-out evaluations included
                return self._run(resumed)
        finally:
            for p, flag in self.flags.items():
                p.requires_grad_(flag)

    def _run(self, resumed: bool) -> LoadedModel:
        legacy = resumed and (training_record(self.out) or {}).get("config", {}).get("scorer_lr") is None
        if legacy:  # a run from before the scorer group continues with the rates it was trained at
            self.config = replace(self.config, scorer_lr=None)
        config, ddp = self.config, self.ddp
        optimizer = make_optimizer(
            self.model,
            self.params,
            lr=config.lr,
            scorer_lr=config.scorer_lr,
            weight_decay=config.weight_decay,
        )
        fresh = {
            "step": 0,
            "history": [],
            "heldout": [],
            "tokens": 0,
            "seconds": 0.0,
            "scorer_at_window": None,
            "monitor": [],
        }
        state = self._restore(optimizer) if resumed else fresh
        if self.monitor is not None:
            self.monitor.history = state["monitor"]  # the same list: checkpoints write it
        if state["step"] > config.steps:
            raise UsageError(f"the run in {self.out} is at step {state['step']}, past --steps {config.steps}")
        if state["step"] == config.steps:
            return self._finish()
        if self.ddp.rank == 0:
            self.tracker = Trajectory.start(self.loaded, self.objective, self.carry.get("source"), self.dev)
        if not resumed:
            if self.anneal is not None:
                self.anneal.apply(0.0)
            state["heldout"] = self._heldout(0, None, 0.0)
        net = self.model
        if ddp.world > 1:
            ids = [self.dev.index] if self.dev.type == "cuda" else None
            # find_unused_parameters: some models hold trainable weights their forward never uses
            # (an ICL model's token embedding); DDP would otherwise wait for their gradients forever.
            net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=ids, find_unused_parameters=True
            )
        self.model.train()
        with StopSignals() as signals:
            if not resumed:
                # The start is a checkpoint too: it may stay the best one (best/), and a run
                # stopped before its first checkpoint resumes from it. A Ctrl-C while it is written
                # stops after the first step, like any other.
                if self.monitor is not None:
                    self.monitor.log(0, self.model, self.loaded.tokenizer)  # every rank
                self._checkpoint(optimizer, state, 0.0)
            self._loop(net, optimizer, state, signals)
        return self._finish()

    def _loop(self, net, optimizer, state, signals) -> None:
        """The steps (:class:`~ssacli.train.loop.StepLoop`'s) with what is fine-tuning's own: batches
        from (seed, rank, step), DDP, the lr schedule, n annealing, tokens counted, the monitor and a
        held-out evaluation at each checkpoint."""
        config, ddp, objective = self.config, self.ddp, self.objective
        per_step = config.batch_size * config.grad_accum * objective.tokens_per_sample() * ddp.world
        session = {"tokens": 0}  # this session's: the record's tokens/s is their average
        recent = deque([time.perf_counter()], maxlen=RATE_WINDOW + 1)  # step ends: the bar's current rate

        def batches(step: int):  # the loop runs each batch's forward and backward inside these contexts
            data_seed, torch_seed = step_seeds(config.seed, ddp.rank, step)
            generator = torch.Generator().manual_seed(data_seed)
            with seeded_rng(self.dev, torch_seed):
                for micro in range(config.grad_accum):
                    batch = objective.sample(config.batch_size, generator)
                    last = micro == config.grad_accum - 1
                    with nullcontext() if last or ddp.world == 1 else net.no_sync():
                        yield batch

        def after(done: int, value: float) -> None:
            if self.anneal is not None:
                self.anneal.apply(done / config.steps)
            session["tokens"] += per_step
            state["tokens"] += per_step
            if self.monitor is not None:  # every rank, at the same steps (all or none run the probe)
                self.monitor.log(done, self.model, self.loaded.tokenizer)
            recent.append(time.perf_counter())
            if self.on_step is not None:
                rate = per_step * (len(recent) - 1) / max(recent[-1] - recent[0], 1e-9)
                self.on_step(done, value, config.lr_at(done - 1), rate)

        def checkpoint(done: int, value: float) -> None:
            seconds = state["seconds"] + loop.elapsed()
            state["heldout"] += self._heldout(done, value, seconds)
            state["scorer_at_window"] = loop.window
            average = session["tokens"] / max(loop.elapsed(), 1e-9)
            self._checkpoint(optimizer, {**state, "step": done, "seconds": seconds}, average)

        loop = StepLoop(
            optimizer=optimizer,
            steps=config.steps,
            batches=batches,
            loss=lambda batch: objective.loss(net, batch, self.dev),
            checkpoint=checkpoint,
            tag=config.lr_at,
            scorer_root=self.loaded.attention_root,
            folder=self.out,
            advice=f"stopped before updating, {self.out} keeps the last good checkpoint; lower --lr or "
            "check the data",
            resume=f"`ssacli finetune {self.out} --resume`",
            checkpoint_every=config.checkpoint_every,
            log_every=config.log_every,
            history=state["history"],
            window=state["scorer_at_window"],
            accum=config.grad_accum,
            schedule=lambda step: config.lr_at(step) / config.lr,
            params=self.params,
            clip_norm=CLIP_NORM,
            reduce=ddp.sum,
            world=ddp.world,
            on_step=after,
        )
        loop.run(state["step"], signals=signals)

    def _heldout(self, step: int, train_loss: float | None, seconds: float) -> list:
        loss = self.objective.heldout_loss(self.model, self.dev) if self.ddp.rank == 0 else None
        if self.tracker is not None:
            self.trajectory.append(self.tracker.record(self.model, step, train_loss, loss, seconds))
        return [] if loss is None else [[step, round(loss, 6)]]

    def _checkpoint(self, optimizer, state, tokens_per_s) -> None:
        if self.ddp.rank == 0:
            root = self.loaded.attention_root
            if not all(bool(torch.isfinite(p).all()) for p in self.params):
                raise JobFailedError(
                    f"parameters became non-finite by step {state['step']}; {self.out} keeps "
                    "the last good checkpoint; lower --lr"
                )
            record = {
                "config": asdict(self.config),
                "objective": self.objective.name,
                "step": state["step"],
                "steps": self.config.steps,
                "history": state["history"],
                "heldout": state["heldout"],
                "trajectory": self.trajectory,
                "tokens": state["tokens"],
                "seconds": round(state["seconds"], 1),
                "tokens_per_s": round(tokens_per_s, 1),
                "world_size": self.ddp.world,
                "monitor": state.get("monitor", []),
                "scorer_at_window": state.get("scorer_at_window"),
                "scorer": learned_scorer(root, state.get("scorer_at_window"), learned_names(root)),
            }
            best = self._best(record, state["heldout"])
            extra = {"world_size": torch.tensor(self.ddp.world)}
            if self.anneal is not None:
                extra.update({f"anneal.n0.{i}": n0 for i, n0 in enumerate(self.anneal.n0)})
            tensors = trainer_state_tensors(optimizer, state["step"], extra=extra)
            meta = {**self.carry, "training": record}
            save_model(
                replace(self.loaded, path=None), self.out, meta=meta, extra_tensors=tensors, overwrite=True,
                best=best,
            )  # fmt: skip
            write_trajectory(self.out, self.trajectory)  # after the folder is replaced
        self.ddp.barrier()

    def _best(self, record: dict[str, Any], heldout: list) -> str | None:
        """Add to ``record`` the held-out loss at the start and now, whether it ``worsened``, and
        the ``best`` evaluated checkpoint (lowest held-out loss, the earliest on ties), kept in
        best/; returns how the checkpoint writer fills best/ ("this" or "keep")."""
        if not heldout:
            return None
        start, (step, now) = heldout[0][1], heldout[-1]
        best_step, lowest = min(heldout, key=lambda h: (h[1], h[0]))
        record.update(heldout_start=start, heldout_end=now, worsened=bool(now > start))
        if best_step == step:
            fill = "this"
        elif (self.out / BEST_DIR).is_dir():
            fill = "keep"
        else:
            return None  # a run of an older ssacli: its best checkpoint was never kept
        record["best"] = {"step": best_step, "heldout_loss": lowest, "folder": BEST_DIR}
        return fill

    def _restore(self, optimizer) -> dict:
        record = training_record(self.out) or {}
        check_resumable(self.config, record.get("config", {}), self.out)
        legacy = self.config.scorer_lr is None
        order = legacy_order(self.model, self.params, grouped=True) if legacy else None
        step, tensors = restore_trainer_state(self.out, optimizer, saved_order=order)
        if int(tensors.get("world_size", torch.tensor(1))) != self.ddp.world:
            raise UsageError(
                f"{self.out} was trained on {int(tensors['world_size'])} processes; resume with "
                "as many, so every rank draws the data it would have drawn"
            )
        if self.anneal is not None:
            self.anneal.n0 = [tensors[f"anneal.n0.{i}"].double() for i in range(len(self.anneal.n0))]
        state = {k: record.get(k, []) for k in ("history", "heldout")}
        self.trajectory = list(record.get("trajectory") or [])
        return {
            **state,
            "step": step,
            "tokens": record.get("tokens", 0),
            "seconds": record.get("seconds", 0.0),
            "scorer_at_window": record.get("scorer_at_window"),
            "monitor": list(record.get("monitor") or []),
        }

    def _finish(self) -> LoadedModel:
        self.model.eval()
        return replace(self.loaded, path=self.out, name=str(self.out))


__all__ = ["finetune"]  # FinetuneConfig imports from here too; finetune_config.py owns it
