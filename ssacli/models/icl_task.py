"""The paper's in-context-learning tasks (Garg et al. style prompts): every fact about an ICL prompt,
owned here and read by training, evaluation, diagnose and quality alike.

A prompt interleaves scalars with their labels, ``x_1, y_1, x_2, y_2, …`` (:data:`TOKENS_PER_POINT`
tokens per point, :func:`interleave`); the model reads one scalar per token and its prediction for
``y_i`` is read at the position of ``x_i`` (so it has seen ``x_1..x_i`` and ``y_1..y_{i-1}``).
Predictions are judged from point :data:`FIRST_SCORED` on (:func:`prediction_errors`), and prompts
are :data:`~ssacli.defaults.ICL_POINTS` points long unless a length is asked for.

* ``every``: y_i = +1 iff x_1..x_i are all > 0, else −1 (a 0 is not > 0).
* ``some``: y_i = +1 iff some x_j > 0 with j ≤ i, else −1.
* ``linear``: y_i = a·x_i + b with a, b drawn once per prompt.

Positions in this module's public API (``outlier_position``) are 1-based, as in the paper
("a deviant value at position 3").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..defaults import ICL_POINTS
from ..errors import UsageError
from .icl_settings import CLASSIFICATION, FIRST_SCORED, TASKS, TOKENS_PER_POINT, check_task  # noqa: F401 (here too)


@dataclass
class Batch:
    xs: torch.Tensor  # [batch, points]
    ys: torch.Tensor  # [batch, points]; ±1 for quantification tasks

    @property
    def tokens(self) -> torch.Tensor:
        """[batch, 2·points]: x_1, y_1, x_2, y_2, …"""
        return interleave(self.xs, self.ys)


def interleave(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """[batch, points] values and labels -> [batch, TOKENS_PER_POINT · points]: x_1, y_1, x_2, y_2, …"""
    return torch.stack([xs, ys], dim=-1).flatten(1)


def x_positions(tokens: int) -> slice:
    """The token positions that carry an x value (where predictions are read) in a prompt of
    ``tokens`` tokens."""
    return slice(0, tokens, TOKENS_PER_POINT)


def every_labels(xs: torch.Tensor) -> torch.Tensor:
    """+1 where every x so far is > 0, else −1."""
    all_positive = torch.cummin((xs > 0).to(torch.int8), dim=-1).values.bool()
    return torch.where(all_positive, 1.0, -1.0).to(xs.dtype)


def some_labels(xs: torch.Tensor) -> torch.Tensor:
    """+1 where some x so far is > 0, else −1."""
    any_positive = torch.cummax((xs > 0).to(torch.int8), dim=-1).values.bool()
    return torch.where(any_positive, 1.0, -1.0).to(xs.dtype)


def labels(task: str, xs: torch.Tensor, coef: torch.Tensor | None = None) -> torch.Tensor:
    """The labels y [batch, points] of ``xs`` under ``task``; ``linear`` reads a, b from ``coef``
    [batch, 2] (one line per prompt)."""
    check_task(task)
    if task == "every":
        return every_labels(xs)
    if task == "some":
        return some_labels(xs)
    if coef is None:
        raise UsageError("the linear task needs its coefficients a, b")
    return coef[:, :1] * xs + coef[:, 1:]


def prediction_errors(task: str, predictions: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Per prompt and scored point [batch, points − FIRST_SCORED + 1]: 1.0 where a sign prediction is
    wrong (classification tasks), the squared error (``linear``)."""
    scored = slice(FIRST_SCORED - 1, None)
    if task in CLASSIFICATION:
        return (torch.sign(predictions[:, scored]) != ys[:, scored]).float()
    return (predictions[:, scored] - ys[:, scored]) ** 2


def task_loss(task: str, predictions: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The training loss of one batch: logistic on the sign (classification tasks), MSE (``linear``)."""
    if task in CLASSIFICATION:
        return F.binary_cross_entropy_with_logits(predictions, (ys > 0).to(predictions.dtype))
    return F.mse_loss(predictions, ys)


def sample_batch(
    task: str,
    batch_size: int,
    points: int = ICL_POINTS,
    *,
    sigma: float = 1.0,
    coef_sigma: float = 1.0,
    outlier: float | None = None,
    outlier_position: int = 3,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> Batch:
    """Draw prompts: x ~ N(0, σ²); for ``linear``, a, b ~ N(0, coef_sigma²) per prompt.

    ``outlier`` plants that value at ``x_{outlier_position}`` (1-based) of every prompt, the
    paper's probe of attention collapse.
    """
    check_task(task)
    if points < 1:
        raise UsageError(f"points must be >= 1, got {points}")
    xs = torch.randn(batch_size, points, generator=generator) * sigma
    if outlier is not None:
        if not 1 <= outlier_position <= points:
            raise UsageError(f"outlier position {outlier_position} is outside 1..{points}")
        xs[:, outlier_position - 1] = outlier
    coef = None
    if task == "linear":
        a = torch.randn(batch_size, 1, generator=generator) * coef_sigma
        b = torch.randn(batch_size, 1, generator=generator) * coef_sigma
        coef = torch.cat([a, b], dim=1)
    return Batch(xs.to(device), labels(task, xs, coef).to(device))
