"""The optimizer every training loop builds, and what it records about the learned scorer.

Why scorer parameters get their own group. Adam moves each parameter by about ``lr`` per step,
whatever its gradient's size, so the distance a parameter can travel in a run is capped near the
sum of the learning rates of its steps (Σlr). That is right for a weight matrix (millions of
entries, each moving a little) and wrong for a scorer's few scalars: at a fine-tune's lr 1e-4, SSA's
n moves by at most ~0.06 in 1,000 cosine steps, so a converted model's n stays wherever it started
and "learned n" means nothing. Scorer parameters therefore form their own group, with their own
learning rate (``scorer_lr``, default :data:`ssacli.defaults.SCORER_LR`) and no weight decay
(decaying a raw b or n pulls it towards softplus(0) ≈ 0.69, an arbitrary value, not a "simpler" one).

Parametrization: every positive scorer parameter (SSA's b and n, ...) is ``softplus(raw) + 1e-9``
(:func:`ssacli.scorers.base.positive`); Adam moves ``raw``, and the natural value moves by
``sigmoid(raw)`` times that: 0.78× at n = 1.5, 0.95× at n = 3, ~1× above. With the default
``scorer_lr`` a 1,000-step cosine run lets n travel up to ~5 (docs/convert.md measures the choice).

Groups: ``decay`` (non-scorer matrices: ``weight_decay``), ``no_decay`` (non-scorer vectors: biases,
norms, embeddings' 1-D parts) and ``scorer``. Each keeps its peak rate in ``base_lr``;
:func:`set_lr` scales all of them by the schedule's factor, so warmup and cosine apply to both rates.

``scorer_lr=None`` is the layout of runs written before the scorer group (their records hold no
``scorer_lr``): the scorer keeps its own group, at the model's rate, so such a run resumes with the
rates and decay it was trained with. Their trainer files index Adam's moments in that older order;
:func:`legacy_order` gives it, and :func:`ssacli.models.checkpoint.restore_trainer_state` remaps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..attention.interface import scorers_of
from ..errors import UsageError
from ..scorers.base import Scorer

CONVERGED_TOLERANCE = 0.01  # a learned value converged: it moved < 1 % over the last 10 % of steps
CONVERGENCE_WINDOW = 0.1  # ... the last 10 % of steps


def scorer_parameter_ids(model: nn.Module) -> set[int]:
    """Ids of the parameters owned by a scorer module anywhere in ``model``."""
    return {id(p) for module in model.modules() if isinstance(module, Scorer) for p in module.parameters()}


def param_groups(
    model: nn.Module,
    params: Iterable[nn.Parameter],
    *,
    lr: float,
    scorer_lr: float | None,
    weight_decay: float,
) -> list[dict[str, Any]]:
    """``params`` (the trainable ones) split into the decay, no_decay and scorer groups (empty
    groups dropped), each with its ``base_lr``, ``lr`` and ``weight_decay``; ``scorer_lr=None``:
    the scorer at ``lr`` (a run from before the scorer group)."""
    scorer_ids = scorer_parameter_ids(model)
    scorer_rate = lr if scorer_lr is None else scorer_lr
    decay, no_decay, scorer = [], [], []
    for p in params:
        (scorer if id(p) in scorer_ids else decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"name": "decay", "params": decay, "base_lr": lr, "weight_decay": weight_decay},
        {"name": "no_decay", "params": no_decay, "base_lr": lr, "weight_decay": 0.0},
        {"name": "scorer", "params": scorer, "base_lr": scorer_rate, "weight_decay": 0.0},
    ]
    return [{**g, "lr": g["base_lr"]} for g in groups if g["params"]]


def check_rates(*, lr: float, scorer_lr: float | None) -> None:
    """``--lr`` and ``--scorer-lr`` finite and > 0 (``scorer_lr=None``: a run from before the scorer
    group, at ``lr``); a UsageError naming the flag otherwise."""
    for flag, value in (("--lr", lr), ("--scorer-lr", scorer_lr)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} must be finite and > 0, got {value}")


def make_optimizer(
    model: nn.Module,
    params: Iterable[nn.Parameter],
    *,
    lr: float,
    scorer_lr: float | None,
    weight_decay: float = 0.0,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (with ``weight_decay=0`` it is exactly Adam)."""
    return torch.optim.AdamW(
        param_groups(model, params, lr=lr, scorer_lr=scorer_lr, weight_decay=weight_decay)
    )


def legacy_order(model: nn.Module, params: Iterable[nn.Parameter], *, grouped: bool) -> list[nn.Parameter]:
    """The order in which a run from before the scorer group indexed Adam's moments: ``params`` as
    they are (``icl train``: one group), or, ``grouped`` (``finetune``), non-scorer matrices first,
    then everything else (vectors and the scorer) in model order."""
    params = list(params)
    if not grouped:
        return params
    scorer_ids = scorer_parameter_ids(model)
    matrices = [p for p in params if p.dim() >= 2 and id(p) not in scorer_ids]
    taken = {id(p) for p in matrices}
    return matrices + [p for p in params if id(p) not in taken]


def set_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Every group's rate at ``factor`` × its peak (the schedule's warmup/cosine factor)."""
    for group in optimizer.param_groups:
        group["lr"] = group.get("base_lr", group["lr"]) * factor


def scorer_values(root: nn.Module) -> dict[str, Any]:
    """Per layer (in attention-module order) the mean of each scorer parameter over heads, and the
    per-head values (``<name>_heads``) where a layer has more than one."""
    values: dict[str, Any] = {}
    for scorer in scorers_of(root).values():
        for name, tensor in scorer.parameter_values().items():
            flat = tensor.detach().float().cpu().flatten()
            values.setdefault(name, []).append(round(float(flat.mean()), 6))
            if flat.numel() > 1:
                values.setdefault(f"{name}_heads", []).append([round(float(v), 6) for v in flat])
    return values


def window_start(steps: int) -> int:
    """The step at which the convergence window (the last 10 % of ``steps``) opens."""
    return max(0, steps - math.ceil(CONVERGENCE_WINDOW * steps))


def learned_scorer(
    root: nn.Module, at_window: dict[str, Any] | None, learned: Iterable[str]
) -> dict[str, Any]:
    """The record of a run's scorer at its end: its values per layer (:func:`scorer_values`), and,
    for each learned parameter, per layer whether it ``converged`` (moved < 1 % relative over the last
    10 % of steps, from ``at_window``, the values when that window opened). ``converged`` is None
    where the run holds no such snapshot (it resumed past the window with an older record)."""
    now = scorer_values(root)
    record: dict[str, Any] = {"values": now, "learned": sorted(learned)}
    converged: dict[str, Any] = {}
    for name in record["learned"]:
        if name not in now:
            continue
        if not at_window or name not in at_window:
            converged[name] = None
            continue
        moved = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(now[name], at_window[name])]
        converged[name] = [m < CONVERGED_TOLERANCE for m in moved]
        record.setdefault("moved_in_window", {})[name] = [round(m, 6) for m in moved]
    record["converged"] = converged
    return record


def learned_names(root: nn.Module) -> set[str]:
    """Names (b, n, ...) of the scorer parameters that training moves (requires_grad)."""
    names = set()
    for scorer in scorers_of(root).values():
        names.update(n for n in scorer.trainable if getattr(scorer, f"{n}_raw").requires_grad)
    return names


__all__ = [
    "CONVERGED_TOLERANCE",
    "check_rates",
    "learned_names",
    "legacy_order",
    "learned_scorer",
    "make_optimizer",
    "param_groups",
    "scorer_parameter_ids",
    "scorer_values",
    "set_lr",
    "window_start",
]
