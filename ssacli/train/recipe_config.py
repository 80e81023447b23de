"""The conversion recipe's settings (:class:`RecipeConfig`) and the names its runs share: the start it
converts to, its stages and where their snapshots go; and how its record reads as a trajectory
(:func:`recipe_trajectory`, what ``ssacli report`` draws); and whether a ``--control`` folder holds
a softmax control a run can reuse (:func:`reusable_control`, read from its ssacli.json before the
model stack loads). The run is :mod:`ssacli.train.recipe`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..defaults import (
    HELDOUT_TOKENS,
    LM_SEQ_LEN,
    RECIPE_B,
    RECIPE_CHECKPOINT_EVERY,
    RECIPE_DISTILL_STEPS,
    RECIPE_LM_WEIGHT,
    RECIPE_LORA_RANK,
    RECIPE_LR,
    RECIPE_MAX_LOSS,
    RECIPE_STAGES,
    RECIPE_TARGET_N,
    RECIPE_TRANSFER_STEPS,
    SCORER_LR,
    SEED,
    TRAIN_BATCH_SIZE,
)
from ..errors import UsageError
from ..models.builtins import read_meta
from ..scorers.declaration import check_positive  # torch-free: the configs are checked before torch

RECIPE_START = "ssa:init=faithful,learn=b+n"  # m=auto per layer: the exact start
STAGES = ("transfer", "distill")
STAGE_DIR = "stages"


@dataclass
class RecipeConfig:
    data: str
    target_n: float | None = RECIPE_TARGET_N  # None: each layer keeps its faithful m (distill only)
    b: str = RECIPE_B  # learned (rescaled with n, then trained) or tied (b = 1/n)
    learn_n: bool = False  # distillation trains n too (after the transfer set it)
    # None: distillation alone (RECIPE_STAGES), or transfer first when transfer_steps is given
    stages: tuple[str, ...] | None = None
    transfer_steps: int | None = None  # None: RECIPE_TRANSFER_STEPS (when the transfer stage runs)
    distill_steps: int = RECIPE_DISTILL_STEPS
    lr: float = RECIPE_LR  # LoRA's (adapters start at zero: higher than a full fine-tune's)
    scorer_lr: float = SCORER_LR
    lora_rank: int = RECIPE_LORA_RANK
    lora_targets: str = "all-linear"  # peft's target_modules: all-linear, or a comma list of names
    lm_weight: float = RECIPE_LM_WEIGHT  # distill loss = KL + lm_weight · cross-entropy on the text
    max_loss: float = RECIPE_MAX_LOSS  # the held-out loss may end this far above the original's
    heldout_tokens: int = HELDOUT_TOKENS  # measured on (all of the held-out slice when shorter)
    batch_size: int = TRAIN_BATCH_SIZE
    seq_len: int = LM_SEQ_LEN
    seed: int = SEED
    eval_every: int = 50
    checkpoint_every: int = RECIPE_CHECKPOINT_EVERY  # steps between checkpoints of a stage

    def __post_init__(self) -> None:
        # asking for transfer steps asks for the transfer stage; the stages, once resolved, are what
        # the record and a resume compare
        if self.stages is None:
            self.stages = STAGES if self.transfer_steps is not None else RECIPE_STAGES
        self.stages = tuple(self.stages)
        if self.transfer_steps is None:
            self.transfer_steps = RECIPE_TRANSFER_STEPS

    def validate(self) -> None:
        if not self.stages or any(s not in STAGES for s in self.stages):
            raise UsageError(
                f"--stages takes a comma list of {', '.join(STAGES)}, got {','.join(self.stages)}"
            )
        if self.target_n is None:
            if "transfer" in self.stages:
                raise UsageError("target_n None keeps the faithful n: it takes stages=('distill',) only")
        else:
            check_positive(self.target_n, "ssa", "--target-n")
        if self.b not in ("learned", "tied"):
            raise UsageError(f"--recipe-b takes learned or tied, got {self.b!r}")
        for name in (
            "transfer_steps",
            "distill_steps",
            "lora_rank",
            "batch_size",
            "eval_every",
            "checkpoint_every",
            "heldout_tokens",
        ):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise UsageError(f"--seq-len must be >= 2, got {self.seq_len}")
        for name in ("lr", "scorer_lr", "max_loss"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"--{name.replace('_', '-')} must be finite and > 0, got {value}")
        if not (math.isfinite(self.lm_weight) and self.lm_weight >= 0):
            raise UsageError(f"--lm-weight must be >= 0, got {self.lm_weight}")

    def recorded(self) -> dict[str, Any]:
        """The settings as the record holds them (JSON: stages a list)."""
        return {**asdict(self), "stages": list(self.stages)}


OnStep = Callable[[str, int, int, float, float], None]  # (stage, step, steps, loss, lr)


def recipe_trajectory(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A recipe record's evaluations as fine-tuning trajectory records (what ``ssacli report``
    draws): one step axis (distillation's steps after transfer's), the stage named, held-out loss,
    KL to the original and n, b per layer. The merged model's evaluation (the same numbers as the
    last distillation step, up to merging's rounding) is left out."""
    config = record.get("config", {})
    offset = config.get("transfer_steps", 0) if "transfer" in config.get("stages", ()) else 0
    rows = []
    for entry in record.get("evaluations", []):
        if entry["stage"] == "distill-merged":
            continue
        step = entry["step"] + (offset if entry["stage"] == "distill" else 0)
        rows.append({
            "step": step, "stage": entry["stage"], "loss": entry.get("train_loss"),
            "heldout_loss": entry.get("heldout_loss"), "kl_to_source": entry.get("kl"),
            "heldout_ppl": entry.get("heldout_ppl"),
            "scorer": {k: entry[k] for k in ("n", "b") if entry.get(k) is not None},
        })  # fmt: skip
    return rows


# settings of a recipe run that decide what its distillation stage does (a softmax control's run)
CONTROL_SETTINGS = ("data", "lr", "lora_rank", "lora_targets", "lm_weight", "batch_size", "seq_len", "seed",
                    "distill_steps", "heldout_tokens")  # fmt: skip


def reusable_control(out: Path, config: dict[str, Any], source: str) -> dict[str, Any] | None:
    """The record of a finished softmax control in ``out`` that matches ``config`` (a recipe run's
    settings: CONTROL_SETTINGS) and ``source``, or None when ``out`` does not exist. A folder that
    holds anything else is a UsageError (a control is reused only when it measures the same budget)."""
    if not out.exists():
        return None
    meta = read_meta(out) if out.is_dir() else None
    record = (meta or {}).get("recipe") or {}
    if not record.get("control"):
        raise UsageError(f"--control {out} holds no softmax control; give a new folder to train one in")
    if not record.get("finished"):
        raise UsageError(f"--control {out} holds an unfinished control; continue it with --resume")
    recorded = record.get("config", {})
    changed = [k for k in CONTROL_SETTINGS if recorded.get(k) != config.get(k)]
    if meta.get("source") != source:
        changed.insert(0, "source")
    if changed:
        diffs = ", ".join(
            f"{k} {meta.get('source') if k == 'source' else recorded.get(k)!r} -> "
            f"{source if k == 'source' else config.get(k)!r}"
            for k in changed
        )
        raise UsageError(
            f"--control {out} was trained with another budget ({diffs}); give a new folder to train the "
            "control this conversion needs"
        )
    return record


__all__ = [
    "CONTROL_SETTINGS", "RECIPE_START", "STAGES", "STAGE_DIR", "OnStep", "RecipeConfig", "recipe_trajectory",
    "reusable_control",
]  # fmt: skip


def not_causal(name: str, kind: str) -> UsageError:
    """A model of ``kind`` given to the recipe, which distils causal LMs."""
    from ..models.kinds import ModelKind

    return UsageError(
        f"the conversion recipe distils causal LMs; '{name}' is {ModelKind(kind).with_article} model"
    )


def check_recipe_model(model: str) -> None:
    """Refuse, before the model stack, a local ``model`` folder that declares another kind than a
    causal LM (:func:`~ssacli.models.kinds.declared_kind`); a kind only loading tells is left to it."""
    from ..models.kinds import ModelKind, declared_kind
    from ..models.references import local_model_path

    path = local_model_path(model)
    kind = declared_kind(path) if path is not None and path.is_dir() else None
    if kind not in (None, ModelKind.CAUSAL):
        raise not_causal(model, kind)
