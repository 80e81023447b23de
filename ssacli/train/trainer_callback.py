"""``ssacli.SaturationCallback``: the saturation monitor (:mod:`ssacli.train.monitor`) inside a
``transformers.Trainer``, logging through ``Trainer.log`` so that whatever the Trainer reports to
(TensorBoard, W&B, the JSON ``log_history`` in ``trainer_state.json``) gets the values.

Passed as every transformers callback is, built without the trainer::

    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                      callbacks=[SaturationCallback(every=100)])
    trainer.train()

The model and its tokenizer (``processing_class``) arrive in each event's keyword arguments, the
step and whether this is the main process in ``state``. ``Trainer.log`` is the one call that reaches
every reporter with the Trainer's step, and a ``TrainerCallback`` is not handed its trainer: the
callback finds the Trainer that is calling it (:func:`running_trainer`), whose callback list holds
it. The older form, ``trainer.add_callback(SaturationCallback(trainer, every=100))``, names the
trainer and keeps working. Driven by something that is not a Trainer, the values go where
``Trainer.log`` puts its JSON record (``state.log_history``), with one warning that no reporter
got them.

It measures in ``on_step_end``, after the update and before the Trainer saves a checkpoint of that
step, so a logged value is a diagnose of the checkpoint saved at the same step; and, with
``at_start``, once in ``on_train_begin`` (step 0). The probe batch is built from the Trainer's
``processing_class`` (its tokenizer; random token ids without one).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from .. import defaults
from ..diagnosis.probe_kinds import Probe
from ..errors import UsageError
from .monitor import (
    DEFAULT_EVERY,
    DEFAULT_METRICS,
    DEFAULT_PROBES,
    DEFAULT_SAMPLES,
    SaturationMonitor,
)


class SaturationCallback(TrainerCallback):
    """Log per-layer attention saturation every ``every`` optimizer steps through ``Trainer.log``.

    ``SaturationCallback(every=100)`` goes in ``Trainer(callbacks=[…])`` (or ``add_callback``);
    ``trainer``, the first argument, is optional and only names the Trainer to log through. The
    options are :class:`~ssacli.train.monitor.SaturationMonitor`'s (probes, metrics, the probe
    batch); the measurements are also kept in ``callback.monitor.history``. Keys:
    ``ssacli/layer{i}/{metric}@{probe}:{level}``, ``ssacli/model/{metric}@…`` (every head),
    ``ssacli/overflow@{probe}:{level}`` and ``ssacli/monitor_seconds`` (docs/monitor.md).
    """

    def __init__(
        self,
        trainer: Any = None,
        every: int = DEFAULT_EVERY,
        probes: Sequence[str | Probe] = DEFAULT_PROBES,
        *,
        metrics: Sequence[str] = DEFAULT_METRICS,
        inputs: Sequence[Sequence[int]] | None = None,
        samples: int = DEFAULT_SAMPLES,
        length: int = defaults.PROBE_LENGTH,
        seed: int = defaults.SEED,
        batch_size: int = defaults.BATCH_SIZE,
        at_start: bool = True,
    ) -> None:
        if trainer is not None and not callable(getattr(trainer, "log", None)):
            raise UsageError(
                f"SaturationCallback's first argument is the Trainer to log through, not a "
                f"{type(trainer).__name__}; give the interval as every=N, and the trainer or nothing: "
                "Trainer(callbacks=[SaturationCallback(every=N)])"
            )
        self.trainer = trainer  # given: logs through it; None: the Trainer that calls the events
        self.running: Any = None  # that Trainer, once found
        self.warned = False
        self.monitor = SaturationMonitor(
            every, probes, metrics=metrics, inputs=inputs, samples=samples, length=length, seed=seed,
            batch_size=batch_size, at_start=at_start,
        )  # fmt: skip

    def _measure(self, state, model, processing_class) -> None:
        tokenizer = getattr(processing_class, "tokenizer", processing_class)  # a processor holds one
        if tokenizer is not None and not callable(tokenizer):
            tokenizer = None
        # Every rank gets here at the same steps; the monitor's due step and all-reduce make the
        # probe forward all-or-none across ranks (a rank without the model makes every rank skip).
        values = self.monitor.log(state.global_step, model, tokenizer, ready=model is not None)
        if values is None:
            return
        if self.trainer is None and self.running is None:
            self.running = running_trainer(self)
        trainer = self.trainer if self.trainer is not None else self.running
        if trainer is not None:
            trainer.log(dict(values))
            return
        # No Trainer to log through: the JSON record Trainer.log would have written, on every rank
        # as the Trainer keeps it; the warning once, from the main process only.
        state.log_history.append({**values, "step": state.global_step})
        if not self.warned and state.is_world_process_zero:
            warnings.warn(
                "SaturationCallback found no transformers.Trainer calling it: its values are in "
                "state.log_history only, no reporter got them (pass the trainer to log through it)",
                stacklevel=2,
            )
        self.warned = True

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.running = None  # found again: the same callback may serve another Trainer later
        if state.global_step == 0:  # not on a resumed run: its step 0 was logged before
            self._measure(state, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step > 0:
            self._measure(state, model, processing_class)


def running_trainer(callback: TrainerCallback) -> Any:
    """The Trainer whose event is calling ``callback`` now, or None: the nearest caller frame whose
    ``self`` has a ``callback_handler`` listing ``callback`` and a ``log`` method. Transformers
    hands a callback the model, tokenizer, optimizer and dataloaders but not the trainer, and only
    ``Trainer.log`` reaches the reporters (TensorBoard, W&B) with the Trainer's step; the check that
    the handler holds this very callback keeps any other object with a ``log`` from being taken."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            handler = getattr(owner, "callback_handler", None)
            listed = getattr(handler, "callbacks", ())
            if any(c is callback for c in listed) and callable(getattr(owner, "log", None)):
                return owner
            frame = frame.f_back
        return None
    finally:
        del frame  # a frame held in a local keeps every caller's locals alive


__all__ = ["SaturationCallback", "running_trainer"]
