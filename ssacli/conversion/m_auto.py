"""m=auto: choose m per layer for ``ssa:init=faithful``, the smallest powers of two that keep the
converted model within the fidelity target.

With softmax attached, :func:`attention_row_kl` measures per layer how far faithful SSA with each m of
:data:`M_GRID` moves the attention rows of the calibration inputs; :func:`choose_m` turns that ranking
into per-layer m's and checks each candidate end to end (:func:`~.calibration.fidelity`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..attention.forward import Observer, observing
from ..attention.interface import attention_modules, scorers_of
from ..errors import JobFailedError
from ..models.loading import LoadedModel
from ..scorers.base import positive_raw
from .calibration import fidelity, model_outputs, target_of

# m=auto searches powers of two: 1 … 2^20 (b = 1/m stays far above the positive floor of 1e-9).
M_GRID = tuple(2.0**k for k in range(21))


def wants_m_auto(scorer) -> bool:
    """``ssa:init=faithful`` with m=auto (its default) and no explicit b or n
    (:attr:`~ssacli.scorers.Scorer.needs_calibration`)."""
    return scorer.needs_calibration


def faithful_transform(x: torch.Tensor, m: float) -> torch.Tensor:
    """t(x) of SSA with b = 1/m, n = m: m·sgn(x)·log1p(|x|/m) ≈ x − sgn(x)·x²/2m."""
    return m * torch.sign(x) * torch.log1p(x.abs() / m)


def _with_sink_column(x: torch.Tensor, seen: torch.Tensor, sink_weight: torch.Tensor):
    """The logits plus the sink's own logit as a last, always visible column. Observers get the
    weight p the sink took under softmax, not its logit s; p = exp(s) / (exp(s) + Σ exp(x)) gives
    s = log p − log(1 − p) + logsumexp(x), so the sink is scored like any logit (as SSA does)."""
    p = sink_weight.double().clamp(1e-300, 1.0 - 1e-16)
    lse = torch.logsumexp(x.masked_fill(~seen, float("-inf")), -1)
    lse = torch.where(torch.isfinite(lse), lse, 0.0)  # a row that sees no key: only the sink
    s = (p.log() - torch.log1p(-p) + lse).unsqueeze(-1)
    return torch.cat([x, s], -1), torch.cat([seen, seen.new_ones(*seen.shape[:-1], 1)], -1)


class _RowKL(Observer):
    """An observer (ssacli.attention.forward.Observer) that, while the model runs with softmax,
    measures for every layer and every m of the grid the mean KL(softmax ‖ faithful SSA) of its
    attention rows, and the largest |logit| it sees."""

    block_size = 1 << 30  # one block: the whole row set of a call

    def __init__(self, modules: list[nn.Module], grid: tuple[float, ...]) -> None:
        self.index = {id(m): i for i, m in enumerate(modules)}
        self.grid = grid
        self.kl = torch.zeros(len(modules), len(grid), dtype=torch.float64)
        self.rows = torch.zeros(len(modules), dtype=torch.float64)
        self.max_abs = torch.zeros(len(modules), dtype=torch.float64)

    def record(self, module, weights, visible, query_positions, sink=None, logits=None) -> None:
        layer = self.index.get(id(module))
        if layer is None or logits is None:
            return
        x = logits.double()
        seen = torch.ones_like(x, dtype=torch.bool) if visible is None else visible.expand_as(x)
        if sink is not None:  # learned sink: one more, always visible key (attention.sinks)
            x, seen = _with_sink_column(x, seen, sink)
        live = seen.any(-1)  # rows with at least one visible key
        x = x.masked_fill(~seen, 0.0)
        log_p = torch.log_softmax(x.masked_fill(~seen, float("-inf")), -1)
        p = log_p.exp()
        for g, m in enumerate(self.grid):
            log_q = torch.log_softmax(faithful_transform(x, m).masked_fill(~seen, float("-inf")), -1)
            row = torch.where(seen, p * (log_p - log_q), 0.0).sum(-1)
            self.kl[layer, g] += float(row[live].sum())
        self.rows[layer] += float(live.sum())
        self.max_abs[layer] = max(float(self.max_abs[layer]), float(x.abs().max()))

    def mean_kl(self) -> torch.Tensor:
        """[layers, grid]: mean row KL per layer at each m."""
        return (self.kl / self.rows.clamp_min(1).unsqueeze(1)).clamp_min(0.0)


@torch.inference_mode()
def attention_row_kl(loaded: LoadedModel, batches: list, grid: tuple[float, ...] = M_GRID) -> _RowKL:
    """Run the model (with its softmax scorer attached) on ``batches`` and measure, per attention
    layer, the mean attention-row KL(softmax ‖ SSA faithful with m) for every m of ``grid``."""
    modules = [m for _, m in attention_modules(loaded.attention_root)]
    observer = _RowKL(modules, grid)
    with observing(observer):
        model_outputs(loaded, batches)
    return observer


@torch.no_grad()
def set_faithful_m(root: nn.Module, ms: list[float]) -> None:
    """b = 1/m, n = m in every head of layer i's SSA scorer, for m = ms[i]."""
    scorers = list(scorers_of(root).values())
    for scorer, m in zip(scorers, ms, strict=True):
        scorer.b_raw.fill_(positive_raw(1.0 / m, "ssa", "b"))
        scorer.n_raw.fill_(positive_raw(m, "ssa", "n"))


def choose_m(
    loaded: LoadedModel, batches: list, before: list[torch.Tensor], rows: _RowKL, max_error: float | None
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Per layer, the smallest m on the grid that keeps the model's measured error within target.

    The attention-row KL of each layer at each m (``rows``) ranks the layers: for a budget β, layer
    i gets the smallest m whose row KL is ≤ β / layers. The end-to-end error (:func:`fidelity` on
    the model's outputs) is then measured for β = β0·4^k, and the largest β that meets the target is
    kept (k goes up from 0 while the target holds, down until it does). β0 is the target itself
    (KL) or its square (relative error, which grows like the square root of a KL). If even m =
    2^20 in every layer misses the target, JobFailedError (exit 5).
    """
    root = loaded.attention_root
    layer_kl = rows.mean_kl()
    layers, grid = layer_kl.shape[0], rows.grid
    cache: dict[tuple[float, ...], tuple[list[torch.Tensor], dict[str, Any]]] = {}

    def evaluate(ms: tuple[float, ...]):
        if ms not in cache:
            set_faithful_m(root, list(ms))
            after = model_outputs(loaded, batches)
            cache[ms] = (after, fidelity(loaded.kind, before, after, batches))
        return cache[ms]

    def ms_for(beta: float) -> tuple[float, ...]:
        chosen = []
        for i in range(layers):
            ok = [g for g in range(len(grid)) if float(layer_kl[i, g]) <= beta / layers]
            chosen.append(grid[ok[0]] if ok else grid[-1])
        return tuple(chosen)

    first = evaluate(ms_for(float("inf")))[1]  # m = 1 everywhere: only to learn the metric
    metric, target = target_of(first, max_error)
    base = target if metric == "kl_per_token" else target**2

    def passes(ms):
        return evaluate(ms)[1][metric] <= target

    best, k, evaluations = None, 0, []
    ms = ms_for(base)
    evaluations.append(ms)
    if passes(ms):
        best = ms
        while k < 40:
            k += 1
            candidate = ms_for(base * 4.0**k)
            if candidate == best:
                continue
            if all(m == grid[0] for m in best):
                break
            evaluations.append(candidate)
            if not passes(candidate):
                break
            best = candidate
            if all(m == grid[0] for m in best):
                break
    else:
        while k > -60:
            k -= 1
            candidate = ms_for(base * 4.0**k)
            if candidate not in cache:
                evaluations.append(candidate)
            if passes(candidate):
                best = candidate
                break
            if all(m == grid[-1] for m in candidate):
                break
        if best is None:
            top = tuple(grid[-1] for _ in range(layers))
            error = evaluate(top)[1][metric]
            dtype = next(loaded.model.parameters()).dtype
            why = (
                f"the model runs in {str(dtype).removeprefix('torch.')}, whose rounding alone exceeds it; "
                "convert with --dtype float32, "
                if dtype != torch.float32
                else ""
            )
            raise JobFailedError(
                f"m=auto cannot meet the fidelity target: {metric.replace('_', ' ')} {error:.3g} > "
                f"{target:g} even with m = {grid[-1]:g} in every layer; {why}raise --max-error, or give "
                "an explicit m= and --finetune to recover the rest; nothing was written"
            )
    after, report = evaluate(best)
    set_faithful_m(root, list(best))
    grid_index = {m: g for g, m in enumerate(grid)}
    per_layer = []
    for i, (name, _) in enumerate(attention_modules(root)):
        m, peak = best[i], float(rows.max_abs[i])
        per_layer.append({
            "layer": i,
            "module": name,
            "m": m,
            "attention_kl": float(layer_kl[i, grid_index[m]]),
            "max_abs_logit": round(peak, 4),
            # how far SSA moves the largest logit seen: x − t(x) ≈ x²/2m
            "shift_at_max": round(peak - float(faithful_transform(torch.tensor(peak).double(), m)), 6),
        })  # fmt: skip
    report = {
        **report,
        "target": {"metric": metric, "max": target, "met": True},
        "m_auto": {"grid": [grid[0], grid[-1]], "evaluations": len(evaluations), "budget_scale": 4.0**k},
        "layers": per_layer,
    }
    return after, report
