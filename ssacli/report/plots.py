"""Figures of the studies, as files: an ICL evaluation (``ssacli icl eval --plot``), an ICL sweep
(:func:`plot_sweep`, ``ssacli icl sweep``) and the language-model study (:func:`plot_lm_context`,
:func:`plot_lm_paired`, ``studies/lm/run.py --report``). Files are written to a temp name first,
then renamed, so a crash never leaves half a figure. Figures are :class:`matplotlib.figure.Figure`
objects drawn directly (no pyplot, no backend to select), so importing this changes nothing."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..files import confined, write_bytes
from ..icl.evaluate import Cell
from .figure_files import METADATA

PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 1, 2, 4 rather than 2^0 or 1.0


def save_figure(fig: Figure, path: str | Path) -> None:
    """``fig`` at ``path`` in the format its suffix names, written whole (ssacli.files.write_bytes)."""
    path = Path(path)
    buffer = io.BytesIO()
    kind = path.suffix.lstrip(".").lower() or "png"
    marked = METADATA.get(kind)  # so a later run knows it may replace it
    fig.savefig(buffer, format=kind, dpi=120, bbox_inches="tight", metadata=marked)
    write_bytes(buffer.getvalue(), path)


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


METRIC_LABELS = {
    "error": None,  # the task's headline, set per task
    "after_outlier": "error after the outlier",
    "at_outlier": "error at the outlier's position",
    "rank_corr": "rank correlation (higher is better)",
    "sign_error": "share of wrong signs",
}


def sweep_views(plan: dict, task: str) -> list[tuple[str, str, str, Any]]:
    """(name, x column, metric, which aggregate rows) of every figure of a task; the names are the
    figures' file stems after ``{task}-`` (and the arch, when the plan has several)."""
    trained = plan["points_end"]

    def plain(r):
        return r["outlier"] is None and r.get("coef_sigma", 1.0) == 1.0

    def at_sigma(r):
        return plain(r) and r["length"] == trained

    def at_length(r):
        return plain(r) and r["sigma"] == 1

    def planted(r):
        return r["outlier"] is not None and r["length"] == trained

    def at_coef(r):
        return r["outlier"] is None and r["sigma"] == 1 and r["length"] == trained

    views = [
        ("sigma", "sigma", "error", at_sigma),
        ("length", "length", "error", at_length),
        ("outlier", "outlier", "after_outlier", planted),
    ]
    if task == "linear":
        views += [("sigma-rank", "sigma", "rank_corr", at_sigma)]
        if plan.get("coef_sigmas"):
            views += [
                ("coef", "coef_sigma", "error", at_coef),
                ("coef-rank", "coef_sigma", "rank_corr", at_coef),
            ]
    return views


XLABELS = {
    "sigma": "σ of the inputs",
    "length": "prompt length (points)",
    "outlier": "planted outlier value",
    "coef_sigma": "σ of the coefficients a, b",
}


def _metric_label(task: str, metric: str) -> str:
    if metric == "error":
        return "error rate (any wrong from pos. 3)" if task != "linear" else "MSE / Var(y)"
    return METRIC_LABELS[metric]


def plot_sweep(summary: dict, folder: str | Path) -> list[Path]:
    """Per task (and backbone): the metric against σ, length, planted outlier (scored after it) and,
    for linear, the uncapped rank correlation and the coefficient σ. One thin line per seed, a thick
    line for the mean over seeds, one colour per arm. Plus, where results hold ``paired`` rows,
    ``…-paired.png``: each arm's mean difference from the reference with its bootstrap CI."""
    folder = Path(folder)
    rows = summary["aggregate"]
    plan = summary["plan"]
    archs = plan.get("archs") or ["gpt2"]
    written = []
    for task in plan["tasks"]:
        for arch in archs:
            stem = task if len(archs) == 1 else f"{task}-{arch}"
            mine = [r for r in rows if r["task"] == task and r.get("arch", "gpt2") == arch]
            for name, column, metric, keep in sweep_views(plan, task):
                sel = [r for r in mine if r.get("metric", "error") == metric and keep(r)]
                if not sel:
                    continue
                path = confined(folder, f"{stem}-{name}.png", "a figure of the plan's task")
                _plot_view(sel, column, f"{stem}: {name}", _metric_label(task, metric), path)
                written.append(path)
                pairs = [
                    r for r in summary.get("paired", [])
                    if r["task"] == task and r["arch"] == arch and r["metric"] == metric and keep(r)
                ]  # fmt: skip
                if pairs:
                    path = confined(folder, f"{stem}-{name}-paired.png", "a figure of the plan's task")
                    _plot_paired(pairs, column, f"{stem}: {name}, paired", _metric_label(task, metric), path)
                    written.append(path)
    return written


def _plot_view(rows: list[dict], column: str, title: str, ylabel: str, path: Path) -> None:
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    for label in dict.fromkeys(r["label"] for r in rows):
        sel = sorted((r for r in rows if r["label"] == label), key=lambda r: r[column])
        xs = [r[column] for r in sel]
        name = f"{label} (n={sel[0]['seeds']})"
        line = ax.plot(xs, [r["mean"] for r in sel], marker="o", lw=2, label=name)[0]
        for i in range(sel[0]["seeds"]):
            per_seed = [r["values"][i] if i < len(r["values"]) else float("nan") for r in sel]
            ax.plot(xs, per_seed, color=line.get_color(), lw=0.6, alpha=0.35)
    _finish(ax, column, ylabel, title)
    save_figure(fig, path)


def _plot_paired(rows: list[dict], column: str, title: str, ylabel: str, path: Path) -> None:
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.subplots()
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for index, label in enumerate(labels):
        sel = sorted((r for r in rows if r["label"] == label), key=lambda r: r[column])
        # a small horizontal offset per arm keeps the intervals apart (log axes: a factor)
        factor = 1 + 0.04 * (index - (len(labels) - 1) / 2)
        xs = [r[column] * factor for r in sel]
        means = [r["mean_difference"] for r in sel]
        # no interval (fewer than two seeds paired): the point alone, no bar
        low = [0.0 if r["ci_low"] is None else m - r["ci_low"] for m, r in zip(means, sel)]
        high = [0.0 if r["ci_high"] is None else r["ci_high"] - m for m, r in zip(means, sel)]
        name = f"{label} − {sel[0]['reference']}"
        ax.errorbar(xs, means, yerr=[low, high], marker="o", capsize=3, label=name)
    ax.axhline(0.0, color="black", lw=0.8)
    _finish(ax, column, f"Δ {ylabel}", title + " (mean difference, 95 % bootstrap CI)")
    save_figure(fig, path)


def _finish(ax, column: str, ylabel: str, title: str) -> None:
    if column != "length":
        ax.set_xscale("log")
    ax.xaxis.set_major_formatter(PLAIN)
    ax.set_xlabel(XLABELS[column])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


# ---- the language-model study (ssacli.quality.lm_study) -------------------------------------------


def plot_lm_paired(results: dict[str, Any], path: Path) -> None:
    """Every paired difference (arm − reference): a dot per seed and the mean with its bootstrap 95 %
    CI, one panel per metric family (perplexities, BLiMP, diagnose), one colour per arm."""
    groups = list(dict.fromkeys(r["metric"].split()[0] for r in results["paired"]))
    fig = Figure(
        figsize=(
            5 * len(groups),
            0.5
            + 0.45 * max(sum(1 for r in results["paired"] if r["metric"].split()[0] == g) for g in groups),
        )
    )
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    arms = list(dict.fromkeys(r["label"] for r in results["paired"]))
    for ax, group in zip(axes, groups):
        rows = [r for r in results["paired"] if r["metric"].split()[0] == group]
        names = list(dict.fromkeys(r["metric"] for r in rows))
        for r in rows:
            k = arms.index(r["label"])
            y = names.index(r["metric"]) + (k - (len(arms) - 1) / 2) * 0.25
            color = f"C{k}"
            ax.scatter(r["differences"], [y] * len(r["differences"]), s=10, color=color, alpha=0.5)
            if r["ci_low"] is not None:
                ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=color, lw=2)
            ax.scatter(
                [r["mean_difference"]],
                [y],
                marker="D",
                s=25,
                color=color,
                label=f"{r['label']} − {r['reference']}" if r["metric"] == names[0] else None,
            )
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{group}: paired difference (dots: seeds; bar: 95 % CI)")
        ax.grid(alpha=0.3, axis="x")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


def plot_lm_context(results: dict[str, Any], path: Path) -> None:
    """Perplexity against the evaluation context (× the trained one), ID and OOD: a thin line per
    seed, a thick one for the mean, one colour per arm."""
    plan = results["plan"]
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    for ax, key in zip(axes, ("id", "ood")):
        for arm in plan["arms"]:
            mine = [r for r in results["runs"] if r["label"] == arm["label"]]
            xs = plan["contexts"]
            series = [[r["metrics"].get(f"ppl {key}@{f}x", float("nan")) for f in xs] for r in mine]
            mean = [sum(col) / len(col) for col in zip(*series)]
            line = ax.plot(xs, mean, marker="o", lw=2, label=arm["label"])[0]
            for s in series:
                ax.plot(xs, s, color=line.get_color(), lw=0.6, alpha=0.4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation context (× trained)")
        ax.set_ylabel(f"perplexity ({key})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path)
