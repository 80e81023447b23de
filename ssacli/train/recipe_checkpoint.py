"""The conversion recipe's checkpoints: what a stopped run keeps, and how it continues exactly.

Every ``checkpoint_every`` steps of a stage, at each stage's end and after SIGINT/SIGTERM, OUT is
written whole (atomically, :func:`ssacli.conversion.save_model`):

* the model as it stands (during distillation the adapters merged into a copy), so an interrupted
  OUT still loads and can be measured (``ssacli diagnose``, ``report``) like any folder;
* ssacli.json's ``recipe`` record so far: ``finished`` false and ``at`` (the stage and its steps
  done), with the evaluations, the loss history and the seconds of every stage;
* trainer.safetensors: the optimizer's moments and what the merged model does not keep exactly, the
  LoRA adapters and every scorer's raw n and b (:func:`resumable_tensors`, prefixed ``model.``);
* OUT/stages/ (the finished stages' snapshots) carried over from the previous write.

Resuming converts the source again (deterministic: the same calibration text gives the same start,
which :func:`check_same_start` compares with the record, so a source changed since is refused),
restores those tensors and the optimizer, and continues at the next step. Batches and dropout come
from (seed, step), so the run ends with the weights of an uninterrupted one: bit for bit on the same
hardware and thread count, as for fine-tuning.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from ..errors import InputError, UsageError
from ..models.checkpoint import SCORER_KEY, TRAINER_FILE, read_meta
from .finetune_config import refuse_changed_settings
from .recipe_config import CONTROL_SETTINGS, reusable_control  # noqa: F401 (torch-free there; here too)

MODEL_PREFIX = "model."  # trainer.safetensors: the model's tensors a continuation restores
ADAPTER_KEY = "lora_"  # peft's LoRA parameters: lora_A, lora_B
FREE = ("checkpoint_every",)  # settings a resumed run may change; every other one must match


def resumable_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a continuation needs beside the optimizer: the adapters (while distilling) and
    every scorer's raw parameters; the rest of the model is the converted source's, unchanged."""
    return {
        MODEL_PREFIX + name: value.detach().clone()
        for name, value in model.state_dict().items()
        if ADAPTER_KEY in name or SCORER_KEY in f".{name}"
    }


def restore_tensors(
    model: nn.Module, tensors: dict[str, torch.Tensor], file: Path, *, adapters: bool = True
) -> None:
    """Put the ``MODEL_PREFIX`` tensors of a checkpoint back into ``model``, which must hold every
    one of them (the same scorers; with ``adapters``, the same adapters; without, they are left for
    the stage that makes them)."""
    saved = {k[len(MODEL_PREFIX) :]: v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
    if not adapters:
        saved = {k: v for k, v in saved.items() if ADAPTER_KEY not in k}
    state = model.state_dict()
    # what this model would have saved: a softmax control before its adapters has nothing to restore
    expected = {k for k in state if (adapters and ADAPTER_KEY in k) or SCORER_KEY in f".{k}"}
    unknown, absent = sorted(set(saved) - set(state)), sorted(expected - set(saved))
    if unknown or absent:
        raise InputError(
            f"{file} does not match the model being converted "
            f"({'unknown ' + ', '.join(unknown[:2]) if unknown else 'lacks ' + ', '.join(absent[:2])})"
        )
    with torch.no_grad():
        for name, value in saved.items():
            state[name].copy_(value)


def trainer_tensors(out: Path) -> dict[str, torch.Tensor]:
    file = out / TRAINER_FILE
    try:
        return load_file(file)
    except (OSError, SafetensorError) as err:
        raise InputError(f"cannot read {file} ({err}); the checkpoint is corrupt or truncated") from None


def unfinished_run(out: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The ssacli.json of the unfinished recipe run in ``out`` to continue, or None when there is
    nothing at ``out`` yet (a resumed job that never wrote starts afresh). A finished run, another
    folder, or a run with other settings is a UsageError; ``config``: the settings asked for."""
    if not out.exists():
        return None
    meta = read_meta(out) if out.is_dir() else None
    record = (meta or {}).get("recipe")
    if not record:
        raise UsageError(
            f"--out {out} holds no conversion-recipe run to resume; pass --overwrite to replace it"
        )
    if record.get("finished", True):  # records of older versions were written only when finished
        raise UsageError(
            f"--out {out} holds a finished conversion; nothing to resume (pass --overwrite to convert again)"
        )
    if not (out / TRAINER_FILE).is_file():
        raise InputError(f"{out} has no {TRAINER_FILE} to resume from; pass --overwrite to start again")
    refuse_changed_settings(config, record.get("config", {}), FREE, f"{out} holds a conversion")
    return meta


def check_same_start(meta: dict[str, Any], source: str, fidelity: dict[str, Any], out: Path) -> None:
    """Refuse to continue from a source that is not the one the run began with: the path, the m
    chosen per layer and the measured KL must be what the record holds."""
    recorded = meta.get("fidelity") or {}
    ms = [row.get("m") for row in fidelity.get("layers") or []]
    same = (
        meta.get("source") == source
        and [row.get("m") for row in recorded.get("layers") or []] == ms
        and _close(recorded.get("kl_per_token"), fidelity.get("kl_per_token"))
    )
    if not same:
        raise UsageError(
            f"{out} was converted from {meta.get('source')} with another start than {source} gives now "
            "(the model or the calibration text changed); pass --overwrite to convert again"
        )


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-4, abs_tol=1e-9)


__all__ = [
    "check_same_start", "restore_tensors", "resumable_tensors", "trainer_tensors",
    "unfinished_run",
]  # fmt: skip
