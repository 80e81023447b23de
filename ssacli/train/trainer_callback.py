"""``ssacli.SaturationCallback``: the saturation monitor (:mod:`ssacli.train.monitor`) inside a
``transformers.Trainer``, logging through ``Trainer.log`` so that whatever the Trainer reports to
(TensorBoard, W&B, the JSON ``log_history`` in ``trainer_state.json``) gets the values.

A ``TrainerCallback`` is not given its trainer, and ``Trainer.log`` is the one way to reach every
reporter with the Trainer's step; so the callback is built with the trainer::

    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.add_callback(SaturationCallback(trainer, every=100))
    trainer.train()

It measures in ``on_step_end``, after the update and before the Trainer saves a checkpoint of that
step, so a logged value is a diagnose of the checkpoint saved at the same step; and, with
``at_start``, once in ``on_train_begin`` (step 0). The probe batch is built from the Trainer's
``processing_class`` (its tokenizer; random token ids without one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from .. import defaults
from ..diagnosis.probes import Probe
from ..errors import UsageError
from .monitor import (
    DEFAULT_EVERY,
    DEFAULT_METRICS,
    DEFAULT_PROBES,
    DEFAULT_SAMPLES,
    SaturationMonitor,
)


class SaturationCallback(TrainerCallback):
    """Log per-layer attention saturation every ``every`` optimizer steps through ``trainer.log``.

    The options are :class:`~ssacli.train.monitor.SaturationMonitor`'s (probes, metrics, the probe
    batch); the measurements are also kept in ``callback.monitor.history``. Keys:
    ``ssacli/layer{i}/{metric}@{probe}:{level}``, ``ssacli/model/{metric}@…`` (every head),
    ``ssacli/overflow@{probe}:{level}`` and ``ssacli/monitor_seconds`` (docs/monitor.md).
    """

    def __init__(
        self,
        trainer: Any,
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
        if not callable(getattr(trainer, "log", None)):
            raise UsageError(
                "SaturationCallback needs the Trainer it logs through: "
                "trainer.add_callback(SaturationCallback(trainer, every=N))"
            )
        self.trainer = trainer
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
        if values is not None:
            self.trainer.log(dict(values))

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step == 0:  # not on a resumed run: its step 0 was logged before
            self._measure(state, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step > 0:
            self._measure(state, model, processing_class)


__all__ = ["SaturationCallback"]
