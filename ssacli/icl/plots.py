"""Figures for ICL evaluations (matplotlib, headless). Files are written to a temp name first,
then renamed, so a crash never leaves half a figure. Figures are :class:`matplotlib.figure.Figure`
objects drawn directly (no pyplot, no backend to select), so importing this changes nothing."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..files import publish
from .evaluate import Cell

PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 1, 2, 4 rather than 2^0 or 1.0


def save_figure(fig: Figure, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def plot_eval(cells: Sequence[Cell], title: str, metric: str, path: str | Path) -> None:
    """Left: error vs σ, one line per length. Right: error per position at the first length."""
    plain = [c for c in cells if c.outlier is None] or list(cells)
    lengths = sorted({c.length for c in plain})
    fig = Figure(figsize=(10, 3.8))
    left, right = fig.subplots(1, 2)
    for length in lengths:
        row = sorted((c for c in plain if c.length == length), key=lambda c: c.sigma)
        left.plot([c.sigma for c in row], [_y(c) for c in row], marker="o", label=f"{length} points")
    left.set_xscale("log", base=2)
    left.xaxis.set_major_formatter(PLAIN)
    left.set_xlabel("σ of the inputs")
    left.set_ylabel(metric)
    left.legend()
    left.grid(alpha=0.3)
    for c in sorted((c for c in plain if c.length == lengths[0]), key=lambda c: c.sigma):
        right.plot(range(1, len(c.per_position) + 1), c.per_position, label=f"σ = {c.sigma:g}")
    right.set_xlabel("position")
    right.set_ylabel("per-position " + ("error rate" if "error" in metric else "MSE"))
    if "MSE" in metric:  # squared errors grow with σ²: a log axis keeps every σ readable
        right.set_yscale("log")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, path)


def _y(cell: Cell) -> float:
    return cell.normalized_error if cell.normalized_error is not None else cell.error


def plot_sweep(summary: dict, folder: str | Path) -> list[Path]:
    """Per task: error vs σ (trained length), vs length (σ = 1), vs planted outlier value.
    Lines are means over seeds; shaded bands are ± one standard deviation."""
    folder = Path(folder)
    rows = summary["aggregate"]
    plan = summary["plan"]
    trained = plan["points_end"]
    written = []
    for task in plan["tasks"]:
        metric = "error rate (any wrong from pos. 3)" if task != "linear" else "MSE / Var(y)"
        views = [
            ("sigma", "σ of the inputs", lambda r: r["outlier"] is None and r["length"] == trained, True),
            ("length", "prompt length (points)", lambda r: r["outlier"] is None and r["sigma"] == 1, False),
            (
                "outlier",
                "planted outlier value at position 3",
                lambda r: r["outlier"] is not None and r["length"] == trained,
                True,
            ),
        ]
        for name, xlabel, keep, logx in views:
            fig = Figure(figsize=(5.5, 3.8))
            ax = fig.subplots()
            for label in dict.fromkeys(r["label"] for r in rows if r["task"] == task):
                sel = sorted(
                    (r for r in rows if r["task"] == task and r["label"] == label and keep(r)),
                    key=lambda r: r[name],
                )
                if not sel:
                    continue
                xs, means = [r[name] for r in sel], [r["mean"] for r in sel]
                stds = [r["std"] or 0.0 for r in sel]
                line = ax.plot(xs, means, marker="o", label=f"{label} (n={sel[0]['seeds']})")[0]
                ax.fill_between(
                    xs,
                    [m - s for m, s in zip(means, stds)],
                    [m + s for m, s in zip(means, stds)],
                    color=line.get_color(),
                    alpha=0.15,
                )
            if logx:
                ax.set_xscale("log")
                ax.xaxis.set_major_formatter(PLAIN)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(metric)
            ax.set_title(
                f"{task}: "
                + {
                    "sigma": f"magnitude shift ({trained} points)",
                    "length": "length shift (σ = 1)",
                    "outlier": f"planted outlier ({trained} points, σ = 1)",
                }[name]
            )
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            path = folder / f"{task}-{name}.png"
            save_figure(fig, path)
            written.append(path)
    return written
