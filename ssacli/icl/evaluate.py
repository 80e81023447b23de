"""Evaluating an ICL model under magnitude shift (σ), length shift and a planted outlier.

Quantification tasks: the error of a prompt is "any wrong sign from position 3 on" (the paper's
metric); the per-position error rate is kept too. ``linear``: mean squared error from position 3
on, and the same divided by the variance of the targets, so that σ levels compare.

With a planted outlier at position p, ``error`` still scores from position 3 on (so it includes p,
whose own label the outlier sets); ``after_outlier`` scores only the positions after p (did the
rest of the context survive it?) and ``at_outlier`` the position p alone.

``linear`` also gets measures that the model's read-out cannot cap. A GPT-2 backbone ends in a
LayerNorm and a linear read-out, so its predictions are bounded (``max_abs_prediction``, against
``max_abs_target``) and MSE/Var(y) tends to 1 for every scorer once the targets outgrow that bound.
``rank_corr`` (mean over prompts of the Spearman correlation between predictions and targets) and
``sign_error`` (share of positions where the prediction has the wrong sign) only ask whether the
predictions are ordered and signed like the targets, which a capped model can still get right.
These are taken over the positions after the outlier when there is one, else from position 3.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..defaults import ICL_COEF_SIGMA, ICL_POINTS, ICL_PROMPTS, SEED
from ..errors import InputError
from ..models.checkpoint import ICL_FORMAT, folder_format
from ..models.icl import ICLModel, load_icl
from ..models.icl_settings import parse_outlier  # noqa: F401 (importable from here too)
from ..models.icl_task import CLASSIFICATION, FIRST_SCORED, sample_batch
from ..models.kinds import kind_from_config, not_icl
from ..models.loading import resolve_device, resolve_model_path


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
    coef_sigma: float = ICL_COEF_SIGMA  # linear: σ of the coefficients a, b
    # With an outlier at position p: the error on positions > p only (quantification: share of prompts
    # with a wrong sign there; linear: MSE / Var(y) there), and at p alone (error rate; MSE / Var(y)).
    after_outlier: float | None = None
    at_outlier: float | None = None
    # linear only (see the module docstring): uncapped measures, and the cap itself
    rank_corr: float | None = None
    sign_error: float | None = None
    max_abs_prediction: float | None = None
    max_abs_target: float | None = None


@torch.no_grad()
def evaluate(
    model: ICLModel,
    *,
    sigmas: tuple[float, ...] = (1.0,),
    lengths: tuple[int, ...] = (ICL_POINTS,),
    outliers: tuple[tuple[float, int] | None, ...] = (None,),
    prompts: int = ICL_PROMPTS,
    batch_size: int | None = None,
    coef_sigma: float = ICL_COEF_SIGMA,
    seed: int = SEED,
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
                wrong_rows, preds, targets = [], [], []
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
                        preds.append(pred.float().cpu())
                        targets.append(batch.ys.float().cpu())
                setting = dict(
                    sigma=sigma, length=length, prompts=prompts, coef_sigma=coef_sigma,
                    outlier=None if outlier is None else outlier[0],
                    outlier_position=FIRST_SCORED if outlier is None else outlier[1],
                )  # fmt: skip
                if task in CLASSIFICATION:
                    cells.append(_classification_cell(setting, torch.cat(wrong_rows)))
                else:
                    cells.append(_regression_cell(setting, torch.cat(preds), torch.cat(targets)))
    return cells


def _batch_for(points: int) -> int:
    """Prompts per forward pass: attention maps grow with the square of the length."""
    return max(16, min(500, 4_000_000 // (2 * points) ** 2))


def _scored_after(setting: dict) -> slice:
    """0-based columns scored by after_outlier and the uncapped measures."""
    first = setting["outlier_position"] if setting["outlier"] is not None else FIRST_SCORED - 1
    return slice(max(first, FIRST_SCORED - 1), None)


def _classification_cell(setting: dict, wrong: torch.Tensor) -> Cell:
    scored = slice(FIRST_SCORED - 1, None)
    cell = Cell(
        **setting,
        error=wrong[:, scored].amax(dim=1).mean().item(),
        position_error=wrong[:, scored].mean().item(),
        per_position=[round(v, 6) for v in wrong.mean(dim=0).tolist()],
    )
    if setting["outlier"] is not None:
        after = wrong[:, _scored_after(setting)]
        cell.after_outlier = after.amax(dim=1).mean().item() if after.shape[1] else None
        cell.at_outlier = wrong[:, setting["outlier_position"] - 1].mean().item()
    return cell


def normalized_mse(pred: torch.Tensor, ys: torch.Tensor) -> float | None:
    """MSE / Var(y) (variance pooled over every prompt and position given); None when Var(y) = 0."""
    variance = ys.double().var().item() if ys.numel() > 1 else 0.0
    mse = ((pred.double() - ys.double()) ** 2).mean().item()
    return mse / variance if variance > 0 else None


def spearman_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman correlation of each row of ``a`` with the same row of ``b`` ([rows, n] -> [rows]);
    0 for a row where either is constant. Ranks by sorting (no tie correction: values are floats)."""
    ranks = []
    for x in (a, b):
        r = x.argsort(dim=1).argsort(dim=1).double()
        constant = (x.amax(dim=1) == x.amin(dim=1)).unsqueeze(1)
        ranks.append(torch.where(constant, 0.0, r - r.mean(dim=1, keepdim=True)))
    num = (ranks[0] * ranks[1]).sum(dim=1)
    den = (ranks[0].pow(2).sum(dim=1) * ranks[1].pow(2).sum(dim=1)).sqrt()
    return torch.where(den > 0, num / den.clamp_min(1e-300), 0.0)


def _regression_cell(setting: dict, pred: torch.Tensor, ys: torch.Tensor) -> Cell:
    scored = slice(FIRST_SCORED - 1, None)
    err = (pred - ys) ** 2
    cell = Cell(
        **setting,
        error=err[:, scored].mean().item(),
        normalized_error=normalized_mse(pred[:, scored], ys[:, scored]),
        per_position=[round(v, 6) for v in err.mean(dim=0).tolist()],
    )
    after = _scored_after(setting)
    p, y = pred[:, after], ys[:, after]
    if setting["outlier"] is not None:
        at = setting["outlier_position"] - 1
        cell.after_outlier = normalized_mse(p, y) if p.shape[1] else None
        cell.at_outlier = normalized_mse(pred[:, at], ys[:, at])
    if p.shape[1]:
        cell.rank_corr = spearman_rows(p, y).mean().item() if p.shape[1] > 1 else None
        cell.sign_error = ((p > 0) != (y > 0)).double().mean().item()
    cell.max_abs_prediction = pred[:, scored].abs().max().item()
    cell.max_abs_target = ys[:, scored].abs().max().item()
    return cell


@torch.no_grad()
def outlier_capture(
    model: ICLModel,
    value: float | None,
    *,
    position: int = FIRST_SCORED,
    points: int = ICL_POINTS,
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
        "arch": model.spec.arch,
        "task": model.spec.task,
        "scorer": model.spec.scorer,
        "metric": "sequence error rate" if model.spec.task in CLASSIFICATION else "mse",
        "first_scored_position": FIRST_SCORED,
        "cells": [asdict(c) for c in cells],
    }


EVAL_SCHEMA = "ssacli-icl-eval"  # `icl eval --json`'s document


@dataclass
class ICLEvaluation:
    """An ICL model's cells (:func:`evaluate_icl`); :meth:`to_dict` is ``ssacli icl eval --json``."""

    model: ICLModel
    cells: list[Cell]
    source: str | None = None  # the MODEL reference the model was loaded from

    def to_dict(self) -> dict:
        return {"schema": EVAL_SCHEMA, "schema_version": 1, "model": self.source,
                **cells_to_json(self.model, self.cells)}  # fmt: skip


def _refuse_other_kinds(ref: str, path) -> None:
    """An InputError naming the kind of a model folder that is not an ICL checkpoint (a language
    model, an encoder, …); a folder that is no model at all is left to load_icl, which says what it
    lacks."""
    try:
        kind = kind_from_config(str(path), name=ref)
    except InputError:
        return
    raise not_icl(ref, kind)


def evaluate_icl(
    model: str | ICLModel,
    *,
    sigmas: tuple[float, ...],
    lengths: tuple[int, ...],
    outliers: tuple[tuple[float, int], ...] = (),
    prompts: int = ICL_PROMPTS,
    coef_sigma: float = ICL_COEF_SIGMA,
    seed: int = SEED,
    device: str = "auto",
) -> ICLEvaluation:
    """:func:`evaluate` over ``sigmas`` × ``lengths``, then each planted outlier (VALUE, POSITION)
    at σ = 1 over the same lengths. ``model``: an ICL model, or a checkpoint folder or
    ``builtin:NAME`` loaded onto ``device``."""
    source = model if isinstance(model, str) else None
    if isinstance(model, str):
        path = resolve_model_path(model)
        if folder_format(path) != ICL_FORMAT:
            _refuse_other_kinds(model, path)
        model = load_icl(path, resolve_device(device))
    grid = dict(lengths=tuple(lengths), prompts=prompts, coef_sigma=coef_sigma, seed=seed)
    cells = evaluate(model, sigmas=tuple(sigmas), **grid)
    if outliers:
        cells += evaluate(model, sigmas=(1.0,), outliers=tuple(outliers), **grid)
    return ICLEvaluation(model, cells, source)
