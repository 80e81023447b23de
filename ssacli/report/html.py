"""One self-contained HTML page per diagnose result (or per comparison of two).

Everything is inline: CSS in a <style> block, figures as base64 PNG data URIs, so the page can
be mailed or attached to an issue and still open offline. Figures are small (about 100 dpi) to
keep a 12-layer × 12-head × 6-probe page well under 2 MB.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from ..diagnosis.result import COLLAPSE_SHARE, METRICS, DiagnoseResult, ProbeResult, common_levels  # noqa: E402
from .terminal import (  # noqa: E402
    KEY_METRICS,
    comparison_columns,
    fmt,
    fmt_collapse,
    fmt_delta,
    fmt_level,
    layer_labels,
    probe_table_rows,
    summary_facts,
    table_columns,
)

DPI = 100
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 1, 2, 4 rather than 10^0
HEAT = plt.get_cmap("YlOrRd").with_extremes(bad="#d9d9d9")  # grey = undefined head
ARROW = {"high": "↑ saturated", "low": "↓ saturated", "none": ""}
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1240px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { padding: 0.15em 0.6em; border-bottom: 1px solid #e4e4e4; }
th { background: #f4f4f4; text-align: right; } th:first-child { text-align: left; }
td { text-align: right; font-family: ui-monospace, Menlo, Consolas, monospace; }
table.facts th { text-align: left; background: none; }
table.facts td { text-align: left; font-family: inherit; }
td.worse { color: #b2182b; } td.better { color: #1a7837; }
.note { color: #777; } img { max-width: 100%; display: block; margin: 0.5em 0; }
pre { background: #f6f6f6; padding: 0.8em; font-size: 0.8em; overflow-x: auto; }
footer { margin-top: 3em; color: #555; font-size: 0.9em; }
"""


def diagnose_html(result: DiagnoseResult) -> str:
    """The full report: summary facts, per probe line plots + heatmaps + table, most saturated
    heads, and versions/settings for reproduction."""
    parts = [f"<h1>ssacli diagnose: {_e(result.model)}</h1>", _facts(summary_facts(result))]
    labels = layer_labels(result.layers)
    for probe in result.probes:
        parts.append(f"<h2>{_e(probe.name)}</h2>")
        if probe.skipped:
            parts.append(f'<p class="note">skipped: {_e(probe.note or "no countable rows")}</p>')
            continue
        if probe.note:
            parts.append(f'<p class="note">{_e(probe.note)}</p>')
        parts.append(f"<p>collapse point: <b>{_e(fmt_collapse(probe.collapse_point()))}</b></p>")
        parts.append(_img(_line_figure(probe), f"{probe.name}: metrics vs level"))
        parts.append(_img(_heatmap_figure(probe), f"{probe.name}: layer × head heatmaps"))
        parts.append(_table(*probe_table_rows(probe)))
    heads = result.most_saturated(10)
    if heads:
        parts.append("<h2>most saturated heads (harshest level of each probe)</h2>")
        keys = ("probe", "level", "layer", "head", "collapse_rate", "max_weight", "entropy")
        rows = [
            [
                h["probe"],
                fmt_level(h["level"]),
                labels[h["layer"]] if h["layer"] < len(labels) else str(h["layer"]),
                str(h["head"]),
                fmt(h["collapse_rate"]),
                fmt(h["max_weight"]),
                fmt(h["entropy"]),
            ]
            for h in heads
        ]
        parts.append(_table(list(keys), rows))
    parts.append(_footer([result]))
    return _page(f"ssacli diagnose: {result.model}", parts)


def comparison_html(a: DiagnoseResult, b: DiagnoseResult) -> str:
    """A and B overlaid per shared probe (A solid, B dashed) and B − A tables on common levels."""
    name_a, name_b = _side_label("A", a), _side_label("B", b)
    facts = [("A", name_a), ("B", name_b), ("Δ", "B − A of the model means (red: B more saturated)")]
    parts = ["<h1>ssacli diagnose: comparison</h1>", _facts(facts)]
    probes_b = {p.name: p for p in b.probes}
    for pa in a.probes:
        pb = probes_b.get(pa.name)
        parts.append(f"<h2>{_e(pa.name)}</h2>")
        if pb is None or pa.skipped or pb.skipped:
            why = (
                "only in A"
                if pb is None
                else "skipped in " + " and ".join(side for side, p in (("A", pa), ("B", pb)) if p.skipped)
            )
            parts.append(f'<p class="note">{_e(why)}</p>')
            continue
        parts.append(
            f"<p>collapse point: A <b>{_e(fmt_collapse(pa.collapse_point()))}</b>, "
            f"B <b>{_e(fmt_collapse(pb.collapse_point()))}</b></p>"
        )
        parts.append(_img(_compare_figure(pa, pb, name_a, name_b), f"{pa.name}: A vs B"))
        parts.append(_delta_table(pa, pb))
    for pb in b.probes:
        if pb.name not in {p.name for p in a.probes}:
            parts.append(f'<h2>{_e(pb.name)}</h2><p class="note">only in B</p>')
    parts.append(_footer([a, b]))
    return _page("ssacli diagnose: comparison", parts)


# ---- figures ----------------------------------------------------------------------------------------


def _line_figure(probe: ProbeResult):
    """Per metric: the model mean (bold black) and one thin line per layer (cyan = first layer,
    magenta = last; a colormap with no dark end, so no layer is mistaken for the mean), so a single
    layer running away from the rest is visible."""
    metrics = table_columns(probe)
    panels: list[tuple[str, np.ndarray, np.ndarray | None]] = [
        (m, probe.model_mean(m), probe.layer_mean(m)) for m in metrics
    ]
    for name, values in probe.extras.items():
        panels.append((name, np.array([np.nan if v is None else v for v in values], dtype=float), None))
    fig, axes = _grid(len(panels))
    levels = np.asarray(probe.levels, dtype=float)
    colors = plt.get_cmap("cool")
    for ax, (name, mean, per_layer) in zip(axes, panels):
        if per_layer is not None:
            count = per_layer.shape[1]
            for layer in range(count):
                ax.plot(
                    levels, per_layer[:, layer], lw=0.7, alpha=0.7, color=colors(layer / max(count - 1, 1))
                )
        ax.plot(levels, mean, lw=2.2, color="black", marker="o", ms=3, label="model mean")
        if name == "collapse_rate":
            _share_line(ax, probe.levels)
        _level_axis(ax, probe.levels)
        _title(ax, name)
    fig.suptitle(
        f"{probe.name}: model mean (black) and layer means (cyan → magenta = first → last layer)", size=9
    )
    return fig


def _heatmap_figure(probe: ProbeResult):
    """collapse_rate and max_weight per layer × head at the probe's harshest level."""
    layers, heads = probe.metrics["max_weight"].shape[1:]
    height = min(max(2.4, 0.2 * layers + 1.2), 9.0)
    fig, axes = plt.subplots(1, 2, figsize=(9.0, height), squeeze=False)
    for ax, metric in zip(axes[0], ("collapse_rate", "max_weight")):
        grid = probe.metrics[metric][-1]
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=HEAT, vmin=0.0, vmax=1.0, aspect="auto")
        fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
        step_h, step_l = max(1, math.ceil(heads / 16)), max(1, math.ceil(layers / 16))
        ax.set_xticks(range(0, heads, step_h))
        ax.set_yticks(range(0, layers, step_l))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head", size=8)
        ax.set_ylabel("layer", size=8)
        ax.set_title(f"{metric} at {probe.name} = {fmt_level(probe.levels[-1])}", size=9)
    fig.tight_layout()
    return fig


def _compare_figure(pa: ProbeResult, pb: ProbeResult, name_a: str, name_b: str):
    metrics = [
        m
        for m in (*KEY_METRICS, "outlier_capture")
        if m in pa.metrics
        and m in pb.metrics
        and (np.isfinite(pa.metrics[m]).any() or np.isfinite(pb.metrics[m]).any())
    ]
    fig, axes = _grid(len(metrics))
    for ax, metric in zip(axes, metrics):
        ax.plot(pa.levels, pa.model_mean(metric), lw=2, marker="o", ms=3, color="#2166ac", label=name_a)
        ax.plot(
            pb.levels, pb.model_mean(metric), lw=2, ls="--", marker="s", ms=3, color="#b2182b", label=name_b
        )
        if metric == "collapse_rate":
            _share_line(ax, [*pa.levels, *pb.levels])
        _level_axis(ax, sorted({*pa.levels, *pb.levels}))
        _title(ax, metric)
    handles, labels = axes[0].get_legend_handles_labels() if metrics else ([], [])
    fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def _grid(count: int):
    """A row-major grid of small axes, 4 per row; unused cells removed."""
    cols = max(1, min(4, count))
    rows = max(1, math.ceil(count / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.3 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        fig.delaxes(ax)
    fig.subplots_adjust(hspace=0.55, wspace=0.35)
    return fig, flat[:count]


def _level_axis(ax, levels) -> None:
    """Log x when the sweep is geometric (all positive, ≥ 8× span); symlog when it starts at 0 and
    the positive part is geometric (e.g. outlier 0, 10, 100, 1000); linear otherwise."""
    values = [float(v) for v in levels]
    positive = [v for v in values if v > 0]
    if positive and len(positive) == len(values) and max(positive) >= 8 * min(positive):
        ax.set_xscale("log")
    elif len(positive) >= 2 and min(values) == 0 and max(positive) >= 8 * min(positive):
        ax.set_xscale("symlog", linthresh=min(positive))
    ax.set_xticks(values)
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _share_line(ax, levels) -> None:
    """The collapse threshold, drawn over the swept range only (axhline would stretch a symlog
    axis into negative levels)."""
    ax.plot([min(levels), max(levels)], [COLLAPSE_SHARE] * 2, color="grey", ls=":", lw=1)


def _title(ax, name: str) -> None:
    arrow = ARROW.get(METRICS.get(name, ("", "none"))[1], "")
    ax.set_title(f"{name} ({arrow})" if arrow else name, size=9)


def _img(fig, alt: str) -> str:
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


# ---- HTML pieces ------------------------------------------------------------------------------------


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _side_label(side: str, result: DiagnoseResult) -> str:
    return f"{side}: {result.model} · {result.scorer}"


def _facts(facts: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{rows}</table>'


def _table(header: list[str], rows: list[list[str]], classes: list[list[str]] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, value in enumerate(row):
            css = classes[r][c] if classes else ""
            cells.append(f'<td class="{css}">{_e(value)}</td>' if css else f"<td>{_e(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _delta_table(pa: ProbeResult, pb: ProbeResult) -> str:
    shared = common_levels(pa, pb)
    if not shared:
        return '<p class="note">no level in common</p>'
    metrics = comparison_columns(pa, pb)
    header = ["level"] + [f"{m} {side}" for m in metrics for side in ("A", "B", "Δ")]
    rows, classes = [], []
    for level, ia, ib in shared:
        row, css = [fmt_level(level)], [""]
        for m in metrics:
            va, vb = float(pa.model_mean(m)[ia]), float(pb.model_mean(m)[ib])
            row += [fmt(va), fmt(vb), fmt_delta(vb - va)]
            css += ["", "", _delta_class(m, vb - va)]
        rows.append(row)
        classes.append(css)
    return _table(header, rows, classes)


def _delta_class(metric: str, delta: float) -> str:
    direction = METRICS.get(metric, ("", "none"))[1]
    if not math.isfinite(delta) or direction == "none" or abs(delta) < 1e-12:
        return ""
    return "worse" if (delta > 0) == (direction == "high") else "better"


def _footer(results: list[DiagnoseResult]) -> str:
    blocks = []
    for side, result in zip(("A", "B") if len(results) == 2 else ("",), results):
        data = {"versions": result.versions, "settings": result.settings}
        text = json.dumps(data, indent=2, ensure_ascii=False, default=str, sort_keys=True)
        heading = f"{side} versions and settings".strip()
        blocks.append(f"<h3>{_e(heading)}</h3><pre>{_e(text)}</pre>")
    return "<footer>" + "".join(blocks) + "</footer>"


def _page(title: str, parts: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
