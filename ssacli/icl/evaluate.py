"""Evaluating an ICL model under magnitude shift (σ), length shift and a planted outlier.

Quantification tasks: the error of a prompt is "any wrong sign from position 3 on" (the paper's
metric); the per-position error rate is kept too. ``linear``: mean squared error from position 3
on, and the same divided by the variance of the targets, so that σ levels compare.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..models.icl import ICLModel
from .tasks import CLASSIFICATION, sample_batch

FIRST_SCORED = 3  # 1-based: positions 1 and 2 have too little context to be judged


@dataclass
class Cell:
    sigma: float
    length: int
    outlier: float | None
    outlier_position: int
    prompts: int
    error: float  # share of prompts with a wrong sign (quantification) or MSE (linear)
    normalized_error: float | None = None  # linear: MSE / Var(y)
    position_error: float | None = None  # quantification: share of wrong signs, positions >= 3
    per_position: list[float] = field(default_factory=list)  # error rate or MSE at positions 1..L


def parse_outlier(text: str) -> tuple[float, int]:
    """'1000@3' -> (1000.0, 3); a bare value means position 3."""
    value, _, position = text.partition("@")
    try:
        return float(value), int(position) if position else FIRST_SCORED
    except ValueError:
        raise ValueError(f"bad outlier {text!r}; write VALUE@POSITION, e.g. 1000@3") from None


@torch.no_grad()
def evaluate(
    model: ICLModel,
    *,
    sigmas: tuple[float, ...] = (1.0,),
    lengths: tuple[int, ...] = (41,),
    outliers: tuple[tuple[float, int] | None, ...] = (None,),
    prompts: int = 1000,
    batch_size: int | None = None,
    coef_sigma: float = 1.0,
    seed: int = 0,
) -> list[Cell]:
    """One :class:`Cell` per (outlier, σ, length), on fresh prompts drawn from ``seed``."""
    model.eval()
    task = model.spec.task
    device = next(model.parameters()).device
    cells = []
    for outlier in outliers:
        for sigma in sigmas:
            for length in lengths:
                generator = torch.Generator().manual_seed(seed)
                wrong_rows, sq_err, targets = [], [], []
                step = batch_size or _batch_for(length)
                for start in range(0, prompts, step):
                    n = min(step, prompts - start)
                    batch = sample_batch(
                        task,
                        n,
                        length,
                        sigma=sigma,
                        coef_sigma=coef_sigma,
                        outlier=None if outlier is None else outlier[0],
                        outlier_position=FIRST_SCORED if outlier is None else outlier[1],
                        generator=generator,
                        device=device,
                    )
                    pred = model(batch.tokens)
                    if task in CLASSIFICATION:
                        wrong_rows.append(((pred > 0) != (batch.ys > 0)).float().cpu())
                    else:
                        sq_err.append(((pred - batch.ys) ** 2).cpu())
                        targets.append(batch.ys.cpu())
                cells.append(_cell(task, sigma, length, outlier, prompts, wrong_rows, sq_err, targets))
    return cells


def _batch_for(points: int) -> int:
    """Prompts per forward pass: attention maps grow with the square of the length."""
    return max(16, min(500, 4_000_000 // (2 * points) ** 2))


def _cell(task, sigma, length, outlier, prompts, wrong_rows, sq_err, targets) -> Cell:
    value, position = (None, FIRST_SCORED) if outlier is None else outlier
    setting = dict(sigma=sigma, length=length, outlier=value, outlier_position=position, prompts=prompts)
    scored = slice(FIRST_SCORED - 1, None)
    if task in CLASSIFICATION:
        wrong = torch.cat(wrong_rows)
        return Cell(
            **setting,
            error=wrong[:, scored].amax(dim=1).mean().item(),
            position_error=wrong[:, scored].mean().item(),
            per_position=[round(v, 6) for v in wrong.mean(dim=0).tolist()],
        )
    err, ys = torch.cat(sq_err), torch.cat(targets)
    mse = err[:, scored].mean().item()
    variance = ys[:, scored].var().item()
    return Cell(
        **setting,
        error=mse,
        normalized_error=mse / variance if variance > 0 else None,
        per_position=[round(v, 6) for v in err.mean(dim=0).tolist()],
    )


@torch.no_grad()
def outlier_capture(
    model: ICLModel,
    value: float | None,
    *,
    position: int = FIRST_SCORED,
    points: int = 41,
    prompts: int = 200,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Attention mass that the tokens after ``x_position`` put on it, per layer.

    With ``value`` planted there, a collapsing head sends most of every later query's mass to that
    one token; ``value=None`` gives the same measure on ordinary prompts, for comparison. Returns
    per layer the mean over heads and the largest head (means over prompts and later queries).
    """
    model.eval()
    device = next(model.parameters()).device
    batch = sample_batch(
        model.spec.task, prompts, points, outlier=value, outlier_position=position,
        generator=torch.Generator().manual_seed(seed), device=device,
    )  # fmt: skip
    key = 2 * (position - 1)  # token index of x_position (tokens interleave x and y)
    rows = []
    for layer in model.attention_maps(batch.tokens):
        per_head = layer[:, :, key + 1 :, key].float().mean(dim=(0, 2))  # [heads]
        rows.append({"mean_over_heads": per_head.mean().item(), "max_head": per_head.max().item()})
    return rows


def cells_to_json(model: ICLModel, cells: list[Cell]) -> dict:
    return {
        "task": model.spec.task,
        "scorer": model.spec.scorer,
        "metric": "sequence error rate" if model.spec.task in CLASSIFICATION else "mse",
        "first_scored_position": FIRST_SCORED,
        "cells": [asdict(c) for c in cells],
    }
