"""The diagnose pages' figures: metrics vs level, layer × head heatmaps, A-vs-B overlays.

They are drawn on :class:`matplotlib.figure.Figure` directly (no pyplot, no backend to select,
nothing global) and embedded as base64 PNG (:func:`png_img`), so a page opens offline. Figures are
small (about 100 dpi) to keep a 12-layer × 12-head × 6-probe page well under 2 MB. What a figure
says in words (titles, which level a heatmap shows) comes from :mod:`ssacli.report.summary`.
"""

from __future__ import annotations

import base64
import html
import io
import math

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, ScalarFormatter

from ..diagnosis.findings import level_text
from ..diagnosis.metrics import METRICS
from ..diagnosis.probe_result import COLLAPSE_SHARE, ProbeResult
from ..diagnosis.result import DiagnoseResult
from .summary import collapse_point_grid, fmt_level, heatmap_index, table_columns

DPI = 100
REPORT_DPI = 110  # `ssacli report`'s figures (trajectory, monitor): a little finer than diagnose's
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 1, 2, 4 rather than 10^0
HEAT = colormaps["YlOrRd"].with_extremes(bad="#d9d9d9")  # grey = undefined head
ARROW = {"high": "↑ saturated", "low": "↓ saturated", "none": ""}
LAYERS = colormaps["cool"]  # the layer lines: cyan = first layer, magenta = last (no dark end)
CELL_TEXT = 8  # points: ≥ 9 px on a page that shows the figure at ~90 % of its 100-dpi size


def line_figure(probe: ProbeResult):
    """Per metric: the model mean (bold black) and one thin line per layer (cyan = first layer,
    magenta = last, on the colour bar; a colormap with no dark end, so no layer is mistaken for the
    mean), so a single layer running away from the rest is visible. The x axis is the probe's
    variable and unit (:attr:`ProbeKind.axis`)."""
    metrics = table_columns(probe)
    panels: list[tuple[str, np.ndarray, np.ndarray | None]] = [
        (m, probe.model_mean(m), probe.layer_mean(m)) for m in metrics
    ]
    for name, values in probe.extras.items():
        panels.append((name, np.array([np.nan if v is None else v for v in values], dtype=float), None))
    fig, axes = panel_grid(len(panels))
    levels = np.asarray(probe.levels, dtype=float)
    count = max((p.shape[1] for _, _, p in panels if p is not None), default=0)
    for ax, (name, mean, per_layer) in zip(axes, panels):
        if per_layer is not None:
            for layer in range(per_layer.shape[1]):
                color = LAYERS(layer / max(count - 1, 1))
                ax.plot(levels, per_layer[:, layer], lw=0.7, alpha=0.7, color=color)
        ax.plot(levels, mean, lw=2.2, color="black", marker="o", ms=3, label="model mean")
        if name == "collapse_rate":
            _share_line(ax, probe.levels)
        _y_range(ax, name, mean if per_layer is None else per_layer)
        _level_axis(ax, probe.levels, level_axis_label(probe))
        metric_title(ax, name)
    handles = [axes[0].lines[-1]] if axes else []
    fig.legend(handles, ["model mean (black)"], loc="upper left", fontsize=8, frameon=False)
    if count > 1:
        layer_bar(fig, axes, count)
    fig.suptitle(f"{probe.name}: metrics vs {level_axis_label(probe)}", size=9)
    return fig


def level_axis_label(probe: ProbeResult) -> str:
    """The x axis of a probe's plots: its variable and unit, from the probe kind's declaration."""
    return probe.kind.axis if probe.kind is not None else "level"


def layer_bar(fig: Figure, axes, count: int) -> None:
    """The colour bar that names the layer lines of ``axes`` (first layer at the bottom, whole
    layer numbers)."""
    mappable = ScalarMappable(norm=Normalize(-0.5, count - 0.5), cmap=LAYERS)
    single = len(axes) == 1  # one axes: a gridspec colour bar, which tight_layout can lay out
    bar = fig.colorbar(mappable, ax=axes[0] if single else axes, fraction=0.05 if single else 0.02, pad=0.02)
    bar.set_label("layer", size=8)
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(count, 8)))
    bar.ax.tick_params(labelsize=7)


def heatmap_figure(probe: ProbeResult):
    """Layer × head panels: each head's collapse point (where the probe can say one), then collapse
    rate and max weight at the level where the probe acts (:func:`heatmap_index`: its collapse
    point, or its harshest level), which each panel names; values are written in the cells of a
    grid small enough to read them."""
    layers, heads = probe.metrics["max_weight"].shape[1:]
    index = heatmap_index(probe)
    points = collapse_point_grid(probe) is not None and probe.reached() is not False
    panels = ["collapse_point"] * points + ["collapse_rate", "max_weight"]
    height = min(max(2.6, 0.28 * layers + 1.3), 11.0)
    fig = Figure(figsize=(max(4.5, 0.42 * heads + 1.6) * len(panels), height))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, metric in zip(axes, panels):
        if metric == "collapse_point":
            _collapse_point_panel(fig, ax, probe)
        else:
            grid = probe.metrics[metric][index]
            image = ax.imshow(np.ma.masked_invalid(grid), cmap=HEAT, vmin=0.0, vmax=1.0, aspect="auto")
            bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
            bar.ax.tick_params(labelsize=7)
            _cell_values(ax, grid)
            ax.set_title(f"{metric} at {level_text(probe, probe.levels[index])}", size=9)
        step_h, step_l = max(1, math.ceil(heads / 16)), max(1, math.ceil(layers / 16))
        ax.set_xticks(range(0, heads, step_h))
        ax.set_yticks(range(0, layers, step_l))
        ax.tick_params(labelsize=8)
        ax.set_xlabel("head", size=8)
        ax.set_ylabel("layer", size=8)
    fig.tight_layout()  # each panel's title names the level; the page's note says why that level
    return fig


def _cell_values(ax, grid: np.ndarray) -> None:
    """Each cell's value (two decimals, "1" for 1.00), where the grid is small enough to read."""
    if grid.size > 400:
        return
    for (layer, head), value in np.ndenumerate(grid):
        if np.isfinite(value):
            text = f"{value:.2f}".removeprefix("0") if value < 0.995 else "1"
            color = "white" if value > 0.6 else "black"
            ax.text(head, layer, text, ha="center", va="center", size=CELL_TEXT, color=color)


def _collapse_point_panel(fig: Figure, ax, probe: ProbeResult) -> None:
    """Each head colored by the level where it collapses: dark = early, B (darkest) = already at
    the first level, pale = never, grey = a head this layer does not have; the level is written in
    the cell when the grid is small enough to read."""
    levels, cells = probe.levels, collapse_point_grid(probe) or []
    never = len(levels)  # one category per level (0 = baseline), then "never"
    exists = np.isfinite(probe.metrics["collapse_rate"]).any(axis=0)
    grid = np.full(exists.shape, np.nan)
    for (layer, head), point in np.ndenumerate(np.array(probe.head_collapse_points(), dtype=object)):
        if exists[layer, head]:
            grid[layer, head] = never if point is None else levels.index(point)
    grid[probe.baseline_collapsed() & exists] = 0
    colors = colormaps["YlOrRd_r"](np.linspace(0.0, 1.0, never + 1))
    cmap = ListedColormap(colors).with_extremes(bad="#d9d9d9")
    norm = BoundaryNorm(np.arange(-0.5, never + 1), never + 1)
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02, ticks=range(never + 1))
    bar.ax.set_yticklabels(["B", *(fmt_level(v) for v in levels[1:]), "never"], size=7)
    if grid.size <= 400:
        for (layer, head), text in np.ndenumerate(np.array(cells, dtype=object)):
            if np.isfinite(grid[layer, head]):
                dark = grid[layer, head] < never / 2
                color = "white" if dark else "black"
                ax.text(head, layer, text, ha="center", va="center", size=CELL_TEXT, color=color)
    ax.set_title(f"collapse point per head ({probe.name})", size=9)


def compare_figure(pa: ProbeResult, pb: ProbeResult, name_a: str, name_b: str):
    """A (solid) and B (dashed) model means per compared metric, over the probe's variable; bounded
    metrics on a fixed 0–1 axis, so a small difference is drawn small."""
    metrics = [
        m
        for m, spec in METRICS.items()
        if (spec.key or spec.compared)
        and m in pa.metrics
        and m in pb.metrics
        and (np.isfinite(pa.metrics[m]).any() or np.isfinite(pb.metrics[m]).any())
    ]
    fig, axes = panel_grid(len(metrics))
    for ax, metric in zip(axes, metrics):
        mean_a, mean_b = pa.model_mean(metric), pb.model_mean(metric)
        ax.plot(pa.levels, mean_a, lw=2, marker="o", ms=3, color="#2166ac", label=name_a)
        ax.plot(pb.levels, mean_b, lw=2, ls="--", marker="s", ms=3, color="#b2182b", label=name_b)
        if metric == "collapse_rate":
            _share_line(ax, [*pa.levels, *pb.levels])
        _y_range(ax, metric, np.concatenate([mean_a, mean_b]))
        _level_axis(ax, sorted({*pa.levels, *pb.levels}), level_axis_label(pa))
        metric_title(ax, metric)
    handles, labels = axes[0].get_legend_handles_labels() if metrics else ([], [])
    fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def overview_figure(result: DiagnoseResult):
    """The whole run at a glance: per probe (rows) and layer (columns), the layer's collapse point,
    coloured by how far into the probe's sweep it comes (dark = early, pale = never), the level
    written in the cell; n/a, absorbed, skipped and overflow probes are named. None with no probe."""
    probes = [p for p in result.probes if not p.skipped]
    if not probes:
        return None
    layers = len(result.layers)
    grid = np.full((len(probes), layers), np.nan)
    texts: list[list[str]] = []
    for row, probe in enumerate(probes):
        status = probe.collapse_status()
        if probe.insensitive or probe.reached() is False or status.startswith("overflow"):
            texts.append([status if layer == 0 else "" for layer in range(layers)])
            continue
        points = probe.layer_collapse_points()
        cells = []
        for layer, point in enumerate(points[:layers]):
            if point is None:
                grid[row, layer] = 1.0
                cells.append("never")
            else:
                grid[row, layer] = probe.levels.index(point) / max(len(probe.levels) - 1, 1)
                cells.append(level_text(probe, point))
        texts.append(cells + [""] * (layers - len(cells)))
    width = min(max(5.0, 0.75 * layers + 2.5), 12.4)
    fig = Figure(figsize=(width, 0.42 * len(probes) + 1.4))
    ax = fig.subplots()
    cmap = colormaps["YlOrRd_r"].with_extremes(bad="#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    size = CELL_TEXT if layers <= 16 else CELL_TEXT - 2
    for row, cells in enumerate(texts):
        for layer, text in enumerate(cells):
            if not text:
                continue
            value = grid[row, layer]
            if np.isfinite(value):
                color = "white" if value < 0.5 else "black"
                ax.text(layer, row, text, ha="center", va="center", size=size, color=color)
            else:  # one note across the row, from the first layer on
                ax.text(-0.4, row, text, ha="left", va="center", size=CELL_TEXT, color="#555555")
    ax.set_yticks(range(len(probes)), [p.name for p in probes], size=8)
    step = max(1, math.ceil(layers / 24))
    ax.set_xticks(range(0, layers, step))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("layer", size=8)
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, ticks=[0, 1])
    bar.ax.set_yticklabels(["first level", "last / never"], size=7)
    ax.set_title("collapse point per probe and layer (dark = collapses early in the sweep)", size=9)
    fig.tight_layout()
    return fig


def panel_grid(count: int):
    """A row-major grid of small axes, 4 per row; unused cells removed."""
    cols = max(1, min(4, count))
    rows = max(1, math.ceil(count / cols))
    fig = Figure(figsize=(3.0 * cols, 2.3 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        fig.delaxes(ax)
    fig.subplots_adjust(hspace=0.55, wspace=0.35)
    return fig, flat[:count]


def _level_axis(ax, levels, label: str = "level") -> None:
    """Log x when the sweep is geometric (all positive, ≥ 8× span); symlog when it starts at 0 and
    the positive part is geometric (e.g. outlier 0, 10, 100, 1000); linear otherwise. Labelled with
    the probe's variable and unit; the y values are printed plainly (no offset such as "1e-9" or
    "+0.8" above the axis, which collided with the title)."""
    values = [float(v) for v in levels]
    positive = [v for v in values if v > 0]
    if positive and len(positive) == len(values) and max(positive) >= 8 * min(positive):
        ax.set_xscale("log")
        # the swept range itself: with no finite point to autoscale on (levels that all overflowed)
        # a log axis would keep matplotlib's default 0–1 and fail to draw
        ax.set_xlim(min(positive) / 1.5, max(positive) * 1.5)
    elif len(positive) >= 2 and min(values) == 0 and max(positive) >= 8 * min(positive):
        ax.set_xscale("symlog", linthresh=min(positive))
    ax.set_xticks(values)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    ax.set_xlabel(label, size=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    plain_y(ax)


def plain_y(ax) -> None:
    """A linear y axis that writes each tick's own value in four significant digits (0.82, 32.5,
    1e-05): no offset or ×10ⁿ text above the axis, where it collided with the title."""
    if isinstance(ax.yaxis.get_major_formatter(), ScalarFormatter):
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.4g}"))


def _y_range(ax, name: str, values: np.ndarray) -> None:
    """Bounded metrics on [0, 1]; others on at least ±5 % of their magnitude, so a flat curve looks
    flat rather than a magnified wobble of rounding noise."""
    if name in METRICS and METRICS[name].bounded:
        ax.set_ylim(-0.02, 1.02)
        return
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return
    lo, hi = float(finite.min()), float(finite.max())
    magnitude = max(abs(lo), abs(hi))
    pad = 0.05 * magnitude if magnitude > 0 else 0.05  # all zero (a task error of 0): a ±0.05 band
    if hi - lo < 2 * pad:
        middle = (hi + lo) / 2
        ax.set_ylim(middle - pad, middle + pad)


def _share_line(ax, levels) -> None:
    """The collapse threshold, drawn over the swept range only (axhline would stretch a symlog
    axis into negative levels)."""
    ax.plot([min(levels), max(levels)], [COLLAPSE_SHARE] * 2, color="grey", ls=":", lw=1)


def metric_title(ax, name: str) -> None:
    """The metric's name over a panel, with the direction that means saturated."""
    arrow = ARROW[METRICS[name].direction] if name in METRICS else ""
    ax.set_title(f"{name} ({arrow})" if arrow else name, size=9)


def png_img(fig: Figure, alt: str, dpi: int = DPI) -> str:
    """The figure as an <img> whose source is the PNG itself (a data URI): the page stays one file."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{data}">'
