"""The one training step loop, under ICL training from scratch (:func:`ssacli.icl.train.train`) and
fine-tuning (:func:`ssacli.train.finetune.finetune`). Each caller hands it what is its own (the
batches, the loss, the schedule, what a checkpoint writes); the loop owns the step itself and when
things happen, so both runs stop, log and checkpoint alike.

Each step, in order:

1. at the first step of the convergence window (:func:`~ssacli.models.optim.window_start`) the
   scorer's values are kept in ``window`` (a run's record says from them whether it converged);
2. the learning rate is set from ``schedule`` (a factor of each group's peak; None: left alone);
3. for each of the step's micro-batches (``batches(step)``, ``accum`` of them) the forward
   (``loss``) and the backward of loss / ``accum``; the loop runs a batch's forward and backward
   before it asks for the next, so a generator can hold its contexts around them (fine-tuning: the
   step's forked RNG and DDP's ``no_sync``);
4. the gradient norm is clipped at ``clip_norm`` (None: no clipping and no gradient check);
5. the mean loss over the step's micro-batches and over ranks (``reduce``: a sum over the process
   group) is checked: a non-finite loss or gradient raises JobFailedError before the update, so
   nothing bad reaches the weights or a checkpoint;
6. the optimizer steps and the gradients are dropped;
7. every ``log_every`` steps (and the first and last) a history row ``[step, loss, tag(step)]``;
   then ``on_step(step, loss)``;
8. a checkpoint (``checkpoint(step, loss)``) every ``checkpoint_every`` steps, at the last step of
   the schedule (``steps``), at ``stop`` and after SIGINT/SIGTERM, which then raises
   InterruptedJobError (exit 130): a second Ctrl-C stops at once
   (:class:`~ssacli.train.runtime.StopSignals`).

Steps are 0-based inside the loop and 1-based (steps done) in everything it hands out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InterruptedJobError, JobFailedError
from ..models.optim import scorer_values, set_lr, window_start
from .runtime import StopSignals


def _alone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor  # one process: the sum over ranks is the tensor


@dataclass
class StepLoop:
    optimizer: torch.optim.Optimizer
    steps: int  # the schedule's length: its last step and the convergence window are measured on it
    batches: Callable[[int], Generator[Any, None, None]]  # step -> its micro-batches (a generator)
    loss: Callable[[Any], torch.Tensor]  # a micro-batch -> its loss (the forward)
    checkpoint: Callable[[int, float], None]  # (steps done, loss): write a checkpoint
    tag: Callable[[int], Any]  # step -> the third value of its history row (ICL: points; else lr)
    scorer_root: nn.Module  # where the scorers are (the convergence window's values)
    folder: Path  # where the checkpoints go (named by the interrupt's message)
    advice: str  # the end of the non-finite message: what to do about it
    resume: str  # the end of the interrupt's message: how to continue the run
    checkpoint_every: int
    log_every: int
    history: list = field(default_factory=list)  # rows so far (a resumed run's), appended to
    window: Any = None  # the scorer's values when the convergence window opened (None: not yet)
    accum: int = 1
    schedule: Callable[[int], float] | None = None
    params: list[nn.Parameter] | None = None  # what clip_norm clips
    clip_norm: float | None = None
    reduce: Callable[[torch.Tensor], torch.Tensor] = _alone
    world: int = 1  # processes whose losses reduce() sums
    on_step: Callable[[int, float], None] | None = None
    began: float = 0.0  # perf_counter() when run() started: elapsed() is this session's seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def run(self, start: int, *, stop: int | None = None, signals: StopSignals | None = None) -> None:
        """Steps ``start`` … min(``stop``, ``steps``) - 1 (0-based). ``signals``: the caller's own
        (when it writes something before the first step that a Ctrl-C should not cut short)."""
        if signals is None:
            with StopSignals() as own:
                return self.run(start, stop=stop, signals=own)
        self.began = time.perf_counter()
        end = self.steps if stop is None else min(self.steps, stop)
        for step in range(start, end):
            value = self._step(step)
            done = step + 1
            if done == 1 or done % self.log_every == 0 or done == self.steps:
                self.history.append([done, round(value, 6), self.tag(step)])
            if self.on_step is not None:
                self.on_step(done, value)
            interrupted = self.reduce(torch.tensor([float(signals.received is not None)]))[0] > 0
            if done in (self.steps, end) or interrupted or done % self.checkpoint_every == 0:
                self.checkpoint(done, value)
            if interrupted:
                raise InterruptedJobError(
                    f"interrupted at step {done}; {self.folder} holds a checkpoint of it: continue with "
                    f"{self.resume}"
                )

    def _step(self, step: int) -> float:
        """One update; returns its loss (the mean over micro-batches and ranks)."""
        if step == window_start(self.steps):
            self.window = scorer_values(self.scorer_root)
        if self.schedule is not None:
            set_lr(self.optimizer, self.schedule(step))
        total = 0.0
        with closing(self.batches(step)) as micro:  # closed (its contexts left) on an error too
            for batch in micro:
                loss = self.loss(batch)
                (loss / self.accum).backward()
                total += float(loss.detach())
        bad_grad = 0.0
        if self.clip_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm)
            bad_grad = float(not torch.isfinite(norm))
        stats = self.reduce(torch.tensor([total / self.accum, bad_grad]))
        value = float(stats[0]) / self.world
        if not math.isfinite(value) or stats[1] > 0:
            what = f"loss became {value}" if not math.isfinite(value) else "the gradient became non-finite"
            raise JobFailedError(f"{what} at step {step + 1}; {self.advice}")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return value


__all__ = ["StepLoop"]
