"""Self-contained HTML pages: one per diagnose result, per comparison of two, per ``ssacli report``.

Every page is built the same way: :func:`page` takes a title and a list of :class:`Section`
(a heading and the HTML under it); :func:`diagnose_sections` and :func:`comparison_sections` give a
result's and a comparison's sections, so other pages (the before/after report) compose them.
:func:`escape`, :func:`facts_table` and :func:`html_table` are the shared pieces.

Everything is inline: CSS in a <style> block, figures as base64 PNG data URIs, so the page can
be mailed or attached to an issue and still open offline. Figures are small (about 100 dpi) to
keep a 12-layer × 12-head × 6-probe page well under 2 MB. They are drawn on
:class:`matplotlib.figure.Figure` directly: no pyplot, no backend to select, nothing global.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..diagnosis.comparison import common_levels, comparison_findings
from ..diagnosis.metrics import METRICS
from ..diagnosis.result import COLLAPSE_SHARE, DiagnoseResult, ProbeResult
from .summary import (
    comparison_columns,
    delta_verdict,
    fmt,
    fmt_collapse,
    fmt_delta,
    fmt_level,
    layer_labels,
    probe_table_rows,
    summary_facts,
    summary_findings,
    table_columns,
)

DPI = 100
PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 1, 2, 4 rather than 10^0
HEAT = colormaps["YlOrRd"].with_extremes(bad="#d9d9d9")  # grey = undefined head
ARROW = {"high": "↑ saturated", "low": "↓ saturated", "none": ""}
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1240px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; max-width: 100%; }
div.scroll { max-width: 100%; overflow-x: auto; }
table.facts td { overflow-wrap: anywhere; }
ul.findings li { margin: 0.2em 0; }
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


@dataclass(frozen=True)
class Section:
    """One part of a page: a heading (plain text, escaped here; None for none) at ``level`` (1 for
    the page's own head, 2 for its parts) and the HTML fragments under it, in order."""

    heading: str | None
    body: Sequence[str] = ()
    level: int = 2

    def html(self) -> str:
        parts = [f"<h{self.level}>{escape(self.heading)}</h{self.level}>"] if self.heading is not None else []
        return "\n".join([*parts, *self.body])


def page(title: str, sections: Sequence[Section]) -> str:
    """A complete self-contained page: ``title`` in the tab, the sections one after the other."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(section.html() for section in sections)
        + "\n</body></html>\n"
    )


def diagnose_html(result: DiagnoseResult) -> str:
    """The full report of one result (see :func:`diagnose_sections`)."""
    return page(f"ssacli diagnose: {result.model}", diagnose_sections(result))


def diagnose_sections(result: DiagnoseResult) -> list[Section]:
    """Summary facts, per probe line plots + heatmaps + table, most saturated heads, and
    versions/settings for reproduction."""
    sections = [Section(f"ssacli diagnose: {result.model}", [facts_table(summary_facts(result))], level=1)]
    findings = summary_findings(result)
    if findings:
        sections.append(Section("findings", [findings_list(findings)]))
    labels = layer_labels(result.layers)
    for probe in result.probes:
        if probe.skipped:
            why = escape(probe.note or "no countable rows")
            sections.append(Section(probe.name, [f'<p class="note">skipped: {why}</p>']))
            continue
        body = [f'<p class="note">{escape(probe.note)}</p>'] if probe.note else []
        if probe.insensitive:
            body.append(f'<p class="note">n/a: insensitive by construction: {escape(probe.insensitive)}</p>')
        collapsed = probe.baseline_collapsed_heads()
        if collapsed:
            heads = ", ".join(f"L{layer}H{head}" for layer, head in collapsed)
            body.append(f'<p class="note">collapsed at baseline (not counted): {escape(heads)}</p>')
        body += [
            f"<p>collapse point: <b>{escape(probe.collapse_status())}</b></p>",
            _img(_line_figure(probe), f"{probe.name}: metrics vs level"),
            _img(_heatmap_figure(probe), f"{probe.name}: layer × head heatmaps"),
            html_table(*probe_table_rows(probe)),
        ]
        sections.append(Section(probe.name, body))
    heads = result.most_saturated(10)
    if heads:
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
        heading = "most saturated heads (harshest level of each probe)"
        sections.append(Section(heading, [html_table(list(keys), rows)]))
    sections.append(Section(None, [_footer([result])]))
    return sections


def comparison_html(a: DiagnoseResult, b: DiagnoseResult) -> str:
    """A and B overlaid per shared probe (see :func:`comparison_sections`)."""
    return page("ssacli diagnose: comparison", comparison_sections(a, b))


def comparison_sections(a: DiagnoseResult, b: DiagnoseResult, *, head_level: int = 1) -> list[Section]:
    """A and B overlaid per shared probe (A solid, B dashed) and B − A tables on common levels,
    after a head naming both (at ``head_level``: 1 on its own page, lower inside another)."""
    name_a, name_b = _side_label("A", a), _side_label("B", b)
    facts = [("A", name_a), ("B", name_b), ("Δ", "B − A of the model means (red: B more saturated)")]
    sections = [Section("ssacli diagnose: comparison", [facts_table(facts)], level=head_level)]
    changes = [f["text"] for f in comparison_findings(a, b)]
    if changes:
        sections.append(Section("findings", [findings_list(changes)], level=head_level + 1))
    probes_b = {p.name: p for p in b.probes}
    for pa in a.probes:
        pb = probes_b.get(pa.name)
        if pb is None or pa.skipped or pb.skipped:
            why = (
                "only in A"
                if pb is None
                else "skipped in " + " and ".join(side for side, p in (("A", pa), ("B", pb)) if p.skipped)
            )
            sections.append(Section(pa.name, [f'<p class="note">{escape(why)}</p>']))
            continue
        points = (
            f"<p>collapse point: A <b>{escape(fmt_collapse(pa.collapse_point()))}</b>, "
            f"B <b>{escape(fmt_collapse(pb.collapse_point()))}</b></p>"
        )
        figure = _img(_compare_figure(pa, pb, name_a, name_b), f"{pa.name}: A vs B")
        sections.append(Section(pa.name, [points, figure, _delta_table(pa, pb)]))
    for pb in b.probes:
        if pb.name not in {p.name for p in a.probes}:
            sections.append(Section(pb.name, ['<p class="note">only in B</p>']))
    sections.append(Section(None, [_footer([a, b])]))
    return sections


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
    colors = colormaps["cool"]
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
        _y_range(ax, name, mean if per_layer is None else per_layer)
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
    fig = Figure(figsize=(9.0, height))
    axes = fig.subplots(1, 2, squeeze=False)
    index = probe.most_different_level()
    for ax, metric in zip(axes[0], ("collapse_rate", "max_weight")):
        grid = probe.metrics[metric][index]
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=HEAT, vmin=0.0, vmax=1.0, aspect="auto")
        fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
        step_h, step_l = max(1, math.ceil(heads / 16)), max(1, math.ceil(layers / 16))
        ax.set_xticks(range(0, heads, step_h))
        ax.set_yticks(range(0, layers, step_l))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head", size=8)
        ax.set_ylabel("layer", size=8)
        ax.set_title(f"{metric} at {probe.name} = {fmt_level(probe.levels[index])}", size=9)
    fig.tight_layout()
    return fig


def _compare_figure(pa: ProbeResult, pb: ProbeResult, name_a: str, name_b: str):
    metrics = [
        m
        for m, spec in METRICS.items()
        if (spec.key or spec.compared)
        and m in pa.metrics
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
    fig = Figure(figsize=(3.0 * cols, 2.3 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
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
    pad = max(0.05 * max(abs(lo), abs(hi)), 1e-9)
    if hi - lo < 2 * pad:
        middle = (hi + lo) / 2
        ax.set_ylim(middle - pad, middle + pad)


def _share_line(ax, levels) -> None:
    """The collapse threshold, drawn over the swept range only (axhline would stretch a symlog
    axis into negative levels)."""
    ax.plot([min(levels), max(levels)], [COLLAPSE_SHARE] * 2, color="grey", ls=":", lw=1)


def _title(ax, name: str) -> None:
    arrow = ARROW[METRICS[name].direction] if name in METRICS else ""
    ax.set_title(f"{name} ({arrow})" if arrow else name, size=9)


def _img(fig: Figure, alt: str) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


# ---- HTML pieces ------------------------------------------------------------------------------------


def escape(text: Any) -> str:
    """``text`` as HTML text or attribute value (quotes escaped too)."""
    return html.escape(str(text), quote=True)


def _side_label(side: str, result: DiagnoseResult) -> str:
    return f"{side}: {result.model} · {result.scorer}"


def findings_list(findings: list[str]) -> str:
    return '<ul class="findings">' + "".join(f"<li>{escape(t)}</li>" for t in findings) + "</ul>"


def facts_table(facts: list[tuple[str, str]]) -> str:
    """(key, value) lines as the two-column table under a page's heading."""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{rows}</table>'


def html_table(header: list[str], rows: list[list[str]], classes: list[list[str]] | None = None) -> str:
    """A data table; ``classes[r][c]`` is cell (r, c)'s CSS class ("worse", "better", "" for none)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, value in enumerate(row):
            css = classes[r][c] if classes else ""
            cells.append(f'<td class="{css}">{escape(value)}</td>' if css else f"<td>{escape(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


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
            css += ["", "", delta_verdict(m, vb - va)]
        rows.append(row)
        classes.append(css)
    return html_table(header, rows, classes)


def _footer(results: list[DiagnoseResult]) -> str:
    blocks = []
    for side, result in zip(("A", "B") if len(results) == 2 else ("",), results):
        data = {"versions": result.versions, "settings": result.settings}
        text = json.dumps(data, indent=2, ensure_ascii=False, default=str, sort_keys=True)
        heading = f"{side} versions and settings".strip()
        blocks.append(f"<h3>{escape(heading)}</h3><pre>{escape(text)}</pre>")
    return "<footer>" + "".join(blocks) + "</footer>"
