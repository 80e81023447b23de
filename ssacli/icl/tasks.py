"""The paper's in-context-learning tasks (Garg et al. style prompts).

A prompt interleaves scalars with their labels, ``x_1, y_1, x_2, y_2, …``; the model reads one
scalar per token and its prediction for ``y_i`` is read at the position of ``x_i`` (so it has seen
``x_1..x_i`` and ``y_1..y_{i-1}``).

* ``every``: y_i = +1 iff x_1..x_i are all > 0, else −1 (a 0 is not > 0).
* ``some``: y_i = +1 iff some x_j > 0 with j ≤ i, else −1.
* ``linear``: y_i = a·x_i + b with a, b drawn once per prompt.

Positions in this module's public API (``outlier_position``) are 1-based, as in the paper
("a deviant value at position 3").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UsageError

TASKS = ("every", "some", "linear")
CLASSIFICATION = ("every", "some")


@dataclass
class Batch:
    xs: torch.Tensor  # [batch, points]
    ys: torch.Tensor  # [batch, points]; ±1 for quantification tasks

    @property
    def tokens(self) -> torch.Tensor:
        """[batch, 2·points]: x_1, y_1, x_2, y_2, …"""
        return torch.stack([self.xs, self.ys], dim=-1).flatten(1)


def every_labels(xs: torch.Tensor) -> torch.Tensor:
    """+1 where every x so far is > 0, else −1."""
    all_positive = torch.cummin((xs > 0).to(torch.int8), dim=-1).values.bool()
    return torch.where(all_positive, 1.0, -1.0).to(xs.dtype)


def some_labels(xs: torch.Tensor) -> torch.Tensor:
    """+1 where some x so far is > 0, else −1."""
    any_positive = torch.cummax((xs > 0).to(torch.int8), dim=-1).values.bool()
    return torch.where(any_positive, 1.0, -1.0).to(xs.dtype)


def check_task(task: str) -> str:
    if task not in TASKS:
        raise UsageError(f"unknown task '{task}'; choose one of: {', '.join(TASKS)}")
    return task


def sample_batch(
    task: str,
    batch_size: int,
    points: int,
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
    if task == "every":
        ys = every_labels(xs)
    elif task == "some":
        ys = some_labels(xs)
    else:
        a = torch.randn(batch_size, 1, generator=generator) * coef_sigma
        b = torch.randn(batch_size, 1, generator=generator) * coef_sigma
        ys = a * xs + b
    return Batch(xs.to(device), ys.to(device))
