"""A fine-tuning run's settings (:class:`FinetuneConfig`): what it trains, at which rates on which
schedule, how often it checkpoints, and which of them a resumed run may change
(:func:`check_resumable`). The run is :mod:`ssacli.train.finetune`.

The schedule (:meth:`FinetuneConfig.lr_at`): linear warmup, then cosine decay to ``MIN_LR_RATIO`` of
the rate (or ``schedule="constant"``); the recipe's stages take it too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..attention.backend import check_backend
from ..defaults import (
    ATTENTION,
    CHECKPOINT_EVERY,
    FINETUNE_LR,
    FINETUNE_STEPS,
    GRAD_ACCUM,
    LM_SEQ_LEN,
    LOG_EVERY,
    MIN_LR_RATIO,
    SCHEDULE,
    SCORER_LR,
    SEED,
    TRAIN_BATCH_SIZE,
    TRAIN_WHAT,
    WARMUP_DIVISOR,
    WARMUP_MAX,
    WEIGHT_DECAY,
)
from ..errors import UsageError
from ..models.optim import check_rates
from ..scorers.declaration import check_positive  # torch-free: the configs are checked before torch
from . import check_data

# Settings a resumed run may change; every other one must match the recorded run (they decide what
# each step draws and computes, so a change would not continue the same run).
RESUMABLE_CHANGES = ("steps", "checkpoint_every", "log_every", "attention", "monitor_every")


@dataclass
class FinetuneConfig:
    data: str
    steps: int = FINETUNE_STEPS
    lr: float = FINETUNE_LR
    # The scorer's own AdamW group (ssacli.models.optim); None: at ``lr``, the layout of runs written
    # before that group, which resume with it.
    scorer_lr: float | None = SCORER_LR
    batch_size: int = TRAIN_BATCH_SIZE
    seq_len: int = LM_SEQ_LEN  # text only; ICL prompts have the length of their data spec (ICL_POINTS)
    grad_accum: int = GRAD_ACCUM
    warmup: int | None = None  # None: steps // WARMUP_DIVISOR, at most WARMUP_MAX (warmup_steps)
    seed: int = SEED
    train: str = TRAIN_WHAT  # "all" or "scorer"
    anneal_n: float | None = None
    checkpoint_every: int = CHECKPOINT_EVERY
    log_every: int = LOG_EVERY
    weight_decay: float = WEIGHT_DECAY
    schedule: str = SCHEDULE  # or "constant"
    objective: str = "auto"  # auto: causal LM, masked LM or the ICL loss, from the model's kind
    attention: str = ATTENTION  # attention backend: auto (fused kernels), eager or fused
    monitor_every: int = 0  # saturation measured every N steps into the record's "monitor" (0: off)

    def validate(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "checkpoint_every", "log_every"):
            if getattr(self, name) < (2 if name == "seq_len" else 1):
                raise UsageError(f"--{name.replace('_', '-')} must be >= {2 if name == 'seq_len' else 1}")
        check_rates(lr=self.lr, scorer_lr=self.scorer_lr)
        if self.weight_decay < 0:
            raise UsageError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.warmup is not None and self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if self.train not in ("all", "scorer"):
            raise UsageError(f"--train takes all or scorer, got {self.train!r}")
        if self.schedule not in ("cosine", "constant"):
            raise UsageError(f"--schedule takes cosine or constant, got {self.schedule!r}")
        if self.anneal_n is not None:
            check_positive(self.anneal_n, "ssa", "--anneal-n target n")
        check_backend(self.attention)
        check_data(self.data)  # an unknown icl:TASK before the model loads, not after a conversion

    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else min(WARMUP_MAX, self.steps // WARMUP_DIVISOR)

    def lr_at(self, step: int) -> float:
        """Learning rate of step ``step`` (0-based)."""
        warmup = self.warmup_steps()
        if step < warmup:
            return self.lr * (step + 1) / warmup
        if self.schedule == "constant":
            return self.lr
        progress = min(1.0, (step - warmup) / max(1, self.steps - warmup))
        return self.lr * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def check_resumable(config: FinetuneConfig, recorded: dict[str, Any], out: Path) -> None:
    """Refuse to resume the run in ``out`` (its recorded config, ``recorded``) with settings other
    than those it was started with, :data:`RESUMABLE_CHANGES` aside."""
    refuse_changed_settings(asdict(config), recorded, RESUMABLE_CHANGES, f"{out} holds a run")


def refuse_changed_settings(given: dict[str, Any], recorded: dict[str, Any], free, holder: str) -> None:
    """The one refusal of every resumable run (fine-tuning, the recipe): ``given`` settings that
    differ from the ``recorded`` ones, those in ``free`` aside, are a UsageError naming each."""
    changed = [k for k in given if k not in free and recorded.get(k) != given[k]]
    if changed:
        diffs = ", ".join(f"{k} {recorded.get(k)!r} -> {given[k]!r}" for k in changed)
        raise UsageError(
            f"{holder} with other settings ({diffs}); resume with the same settings or pick a new --out"
        )


__all__ = ["RESUMABLE_CHANGES", "FinetuneConfig", "check_resumable"]
