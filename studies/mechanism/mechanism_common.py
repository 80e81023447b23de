"""What both parts of the mechanism study share (docs/results/mechanism.md): rank correlations with
a bootstrap that resamples seeds, and softening chosen heads of a softmax model.

Imported by ``length.py`` (Part A) and ``icl.py`` (Part B), which run as scripts from this folder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ssacli.stats import spearman  # the one owner of the rank correlation

RESAMPLES = 2000


def partial_spearman(x: Sequence[float], y: Sequence[float], z: Sequence[float]) -> float | None:
    """Spearman's ρ of x and y with z partialled out: the Pearson partial correlation of the ranks,
    (r_xy − r_xz r_yz) / √((1 − r_xz²)(1 − r_yz²)). None where it is undefined."""
    rxy, rxz, ryz = spearman(x, y), spearman(x, z), spearman(y, z)
    if rxy is None or rxz is None or ryz is None:
        return None
    denominator = math.sqrt(max(0.0, (1 - rxz**2) * (1 - ryz**2)))
    return None if denominator == 0 else (rxy - rxz * ryz) / denominator


def seed_bootstrap(
    groups: dict[Any, list], statistic: Callable[[Iterable[list]], float | None], resamples: int = RESAMPLES
) -> dict[str, Any]:
    """``statistic`` over all groups (one group per seed: every arm and level of a seed travel
    together), with a 95 % percentile interval from resampling seeds. With one seed there is no
    interval (None), not a zero-width one."""
    seeds = sorted(groups)
    value = statistic([groups[s] for s in seeds])
    low = high = None
    if len(seeds) >= 2:
        rng = np.random.default_rng(0)
        draws = [statistic([groups[s] for s in rng.choice(seeds, len(seeds))]) for _ in range(resamples)]
        draws = [d for d in draws if d is not None]
        if draws:
            low, high = np.percentile(draws, [2.5, 97.5]).tolist()
    return {
        "rho": value,
        "ci_low": low,
        "ci_high": high,
        "seeds": len(seeds),
        "models": sum(len(g) for g in groups.values()),
    }


def association(points: dict[Any, list[tuple[float, float]]]) -> dict[str, Any]:
    """Spearman's ρ over every (measure, failure) point, seeds resampled; ``points`` by seed."""

    def rho(groups: Iterable[list]) -> float | None:
        flat = [p for g in groups for p in g]
        return spearman([p[0] for p in flat], [p[1] for p in flat])

    return seed_bootstrap(points, rho)


def partial_association(points: dict[Any, list[tuple[float, float, float]]]) -> dict[str, Any]:
    """Partial Spearman's ρ of (measure, failure) controlling for the level, over every (measure,
    failure, level) point, seeds resampled."""

    def rho(groups: Iterable[list]) -> float | None:
        flat = [p for g in groups for p in g]
        return partial_spearman(*([p[i] for p in flat] for i in range(3)))

    return seed_bootstrap(points, rho)


def load(model: str | Path):
    """A model for measuring: float32 on the CPU, in eval mode (both parts load every model so)."""
    from ssacli.models.loading import load_model

    loaded = load_model(str(model), dtype="float32", device="cpu")
    loaded.model.eval()
    return loaded


def soften_heads(model, heads: Sequence[tuple[int, int]], temperature: float):
    """``model`` with softmax(x / T) on ``heads`` ((layer, head)) and softmax elsewhere, exactly:
    the ``temperature`` scorer at t = 1 is softmax (tests/scorers), then t = T on those heads only."""
    import torch

    from ssacli.attention.interface import apply_scorer, scorers_of

    apply_scorer(model, "temperature:t=1")
    scorers = list(scorers_of(model).values())
    with torch.no_grad():
        for layer, head in heads:
            raw = scorers[layer].t_raw
            raw.view(-1)[head if raw.numel() > 1 else 0] = math.log(temperature)
    return model


def level_key(level: float) -> str:
    """A level as a JSON key: 8.0 -> "8" (JSON keeps keys as strings; a cached record reads back the same)."""
    return f"{float(level):g}"


def interval(row: dict[str, Any]) -> str:
    """'+0.12 [−0.30, +0.50]', the point alone without an interval, or why there is no value."""
    if row.get("rho") is None:
        few = row.get("models") is not None and row["models"] < 3
        return "n/a (fewer than 3 models)" if few else "n/a (a measure did not vary)"
    if row.get("ci_low") is None:
        return f"{row['rho']:+.2f} (no interval: 1 seed)"
    return f"{row['rho']:+.2f} [{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]"
