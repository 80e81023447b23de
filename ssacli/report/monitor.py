"""Saturation during AFTER's fine-tuning (``--monitor-every N``) in ``ssacli report``: a table for
the terminal and a figure for the page, both from the record's ``monitor`` history (the model means
that :class:`ssacli.train.monitor.SaturationMonitor` logged; per-layer values stay in the JSON)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from ..diagnosis.metrics import METRICS
from ..train.monitor import DEFAULT_METRICS, model_series
from .figures import REPORT_DPI, png_img
from .html import Section, html_table

TABLE_METRICS = ("max_weight", "collapse_rate")  # the two that say "saturated" (the figure has all)


def monitor_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """AFTER's monitor history (``report["conversion"]["after"]["monitor"]``), or []."""
    return ((report.get("conversion") or {}).get("after") or {}).get("monitor") or []


def monitor_columns(history: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Step, then max weight and collapse (model means) at each monitored probe level."""
    series = model_series(history)
    keys = [k for k in sorted(series, key=lambda k: (TABLE_METRICS.index(k[0]) if k[0] in TABLE_METRICS
            else 99, k[1], k[2])) if k[0] in TABLE_METRICS]  # fmt: skip
    steps = sorted({step for values in series.values() for step, _ in values})
    header = ["step"] + [f"{METRICS[m].short}\n{probe}:{level:g}" for m, probe, level in keys]
    lookup = {k: dict(series[k]) for k in keys}
    rows = [[str(step)] + [_fmt(lookup[k].get(step)) for k in keys] for step in steps]
    return header, rows


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def monitor_table(report: dict[str, Any]) -> Table | None:
    history = monitor_of(report)
    if not history:
        return None
    header, rows = monitor_columns(history)
    table = Table(title="saturation during fine-tuning (AFTER, --monitor-every)", title_justify="left",
                  box=box.SIMPLE_HEAD)  # fmt: skip
    for name in header:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def monitor_figure(history: list[dict[str, Any]]):
    """One panel per metric: its model mean over the steps, one line per probe level."""
    from matplotlib.figure import Figure

    from .figures import plain_y

    series = model_series(history)
    order = list(DEFAULT_METRICS)  # the monitor's own order; a metric asked for besides, after them
    metrics = sorted({m for m, _, _ in series}, key=lambda m: order.index(m) if m in order else 99)
    fig = Figure(figsize=(2.9 * max(len(metrics), 1) + 0.6, 2.9))
    axes = fig.subplots(1, max(len(metrics), 1), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        for (m, probe, level), values in sorted(series.items()):
            if m == metric:
                ax.plot(*zip(*values), marker=".", label=f"{probe}:{level:g}")
        ax.set_title(f"{metric} (model mean)", size=9)
        ax.set_xlabel("step", size=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
        plain_y(ax)
    fig.tight_layout()
    return fig


def monitor_section(report: dict[str, Any]) -> Section | None:
    history = monitor_of(report)
    if not history:
        return None
    header, rows = monitor_columns(history)
    note = ('<p class="note">model means on the monitor\'s fixed probe batch, measured during the run '
            "(docs/monitor.md); per-layer values are in the JSON</p>")  # fmt: skip
    figure = png_img(monitor_figure(history), "saturation during fine-tuning", dpi=REPORT_DPI)
    table = html_table([h.replace("\n", " ") for h in header], rows)  # html_table escapes
    return Section("saturation during fine-tuning (AFTER)", [figure, note, table])


__all__ = ["monitor_columns", "monitor_figure", "monitor_of", "monitor_section", "monitor_table"]
