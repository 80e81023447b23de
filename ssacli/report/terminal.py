"""Rich terminal rendering of a diagnose result, and of two results side by side.

The summary helpers here (facts, table columns, number formats, layer labels, saturation colors)
are shared with the HTML reports so the terminal and the page always say the same thing; what each
metric is called and which way it saturates comes from :data:`ssacli.diagnosis.metrics.METRICS`.
Every colored cell also prints its value: with NO_COLOR (or a dumb terminal) the numbers still
carry the information.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ..diagnosis.metrics import METRICS
from ..diagnosis.result import DiagnoseResult, ProbeResult, common_levels
from ..errors import UsageError

# Yellow -> orange -> dark red (ColorBrewer YlOrRd): light is calm, dark is saturated.
PALETTE = ((255, 255, 204), (255, 237, 160), (254, 217, 118), (254, 178, 76), (253, 141, 60), (252, 78, 42),
           (227, 26, 28), (189, 0, 38), (128, 0, 38))  # fmt: skip


# ---- shared helpers (also used by report/html.py) -----------------------------------------------


def fmt(value: Any) -> str:
    """Three significant digits; a dash where the value is missing or undefined."""
    if value is None:
        return "–"
    value = float(value)
    return f"{value:.3g}" if math.isfinite(value) else "–"


def fmt_level(level: float) -> str:
    return f"{level:g}"


def fmt_delta(value: Any) -> str:
    """Signed, so a change reads as one: "+0.1", "-0.25", "0" for no change."""
    text = fmt(value)
    if text in ("–", "0", "-0"):
        return text.lstrip("-")
    return text if text.startswith("-") else "+" + text


def fmt_collapse(point: float | None) -> str:
    return "none" if point is None else fmt_level(point)


def describe(value: Any, limit: int = 100) -> str:
    """One line for a settings value of any shape (inputs can be a list of texts or a count)."""
    if isinstance(value, dict):
        text = ", ".join(f"{k}={describe(v, limit)}" for k, v in value.items())
    elif isinstance(value, list | tuple):
        text = ", ".join(describe(v, limit) for v in value)
    elif value is None:
        text = "–"
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def layer_labels(layers: Sequence[str], width: int = 24) -> list[str]:
    """``"3 mid.part"``: the layer index plus what differs between module names.

    Leading and trailing dotted components shared by every name ("model.layers." ... ".self_attn")
    say nothing, so they are dropped; when only the index remains, the index alone is the label.
    """
    parts = [name.split(".") for name in layers]
    if not parts:
        return []
    lead = 0
    while all(len(p) > lead + 1 for p in parts) and len({p[lead] for p in parts}) == 1:
        lead += 1
    tail = 0
    while all(len(p) > lead + tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    labels = []
    for index, p in enumerate(parts):
        rest = ".".join(p[lead : len(p) - tail])
        if rest == str(index) or len(layers) == 1:
            labels.append(str(index))
            continue
        if len(rest) > width:
            rest = "…" + rest[-(width - 1) :]
        labels.append(f"{index} {rest}")
    return labels


def table_columns(probe: ProbeResult) -> list[str]:
    """The metrics worth a column for this probe: the key ones, plus outlier capture where the
    probe defines it, the learned sink where the model has one and row mass where a scorer does not
    normalize rows."""
    names = [m for m, spec in METRICS.items() if spec.key and m in probe.metrics]
    for name in ("outlier_capture", "learned_sink"):
        if name in probe.metrics and np.isfinite(probe.metrics[name]).any():
            names.append(name)
    if "row_mass" in probe.metrics:
        mass = probe.metrics["row_mass"]
        finite = mass[np.isfinite(mass)]
        if finite.size and float(np.abs(finite - 1.0).max()) > 1e-3:
            names.append("row_mass")
    return names


def probe_table_rows(probe: ProbeResult) -> tuple[list[str], list[list[str]]]:
    """Header and formatted rows (one per level) of a probe's model-mean table."""
    metrics = table_columns(probe)
    means = {m: probe.model_mean(m) for m in metrics}
    header = ["level", *metrics, *probe.extras]
    rows = []
    for i, level in enumerate(probe.levels):
        extras = [fmt(values[i] if i < len(values) else None) for values in probe.extras.values()]
        rows.append([fmt_level(level), *(fmt(means[m][i]) for m in metrics), *extras])
    return header, rows


def summary_facts(result: DiagnoseResult) -> list[tuple[str, str]]:
    """The header facts of a result, in display order, as plain strings."""
    settings = result.settings
    probes = "; ".join(
        f"{p.name}: " + ("skipped" if p.skipped else ", ".join(fmt_level(v) for v in p.levels))
        for p in result.probes
    )
    points = "; ".join(
        f"{p.name}: " + ("skipped" if p.skipped else fmt_collapse(p.collapse_point())) for p in result.probes
    )
    device = f"{describe(settings.get('device'))} / {describe(settings.get('dtype'))}"
    return [
        ("model", result.model),
        ("family", result.family),
        ("scorer", result.scorer),
        ("route", result.route),
        ("layers × heads", _shape(result)),
        ("inputs", describe(settings.get("inputs"))),
        ("device / dtype", device),
        ("probes (levels)", probes),
        ("collapse point", points),
        ("elapsed", f"{result.elapsed_s:.1f} s"),
    ]


def pick_heatmap(result: DiagnoseResult, metric: str, probe: str | None) -> ProbeResult:
    """The probe a heatmap shows: the one asked for, else the non-skipped probe whose harshest
    level has the highest model-mean max weight (where saturation shows most)."""
    if metric not in METRICS:
        raise UsageError(f"unknown heatmap metric '{metric}'; choose one of: {', '.join(METRICS)}")
    if probe is not None:
        try:
            chosen = result.probe(probe)
        except KeyError as err:
            raise UsageError(err.args[0]) from None
        if chosen.skipped:
            raise UsageError(f"probe '{probe}' was skipped ({chosen.note or 'no data'}); pick another")
    else:
        live = [p for p in result.probes if not p.skipped]
        if not live:
            raise UsageError("every probe was skipped; there is no heatmap to draw")
        chosen = max(live, key=_last_peak)
    if metric not in chosen.metrics:
        raise UsageError(f"probe '{chosen.name}' has no metric '{metric}'; choose another heatmap metric")
    return chosen


def _last_peak(probe: ProbeResult) -> float:
    value = float(probe.model_mean("max_weight")[-1])
    return value if math.isfinite(value) else -math.inf


def saturation_scale(metric: str, grid: np.ndarray) -> tuple[float, float]:
    """Value range for colors: [0, 1] for bounded metrics so colors compare across models,
    the grid's own range otherwise."""
    if metric in METRICS and METRICS[metric].bounded:
        return 0.0, 1.0
    finite = grid[np.isfinite(grid)]
    if not finite.size:
        return 0.0, 1.0
    return float(finite.min()), float(finite.max())


def saturation(metric: str, value: float, lo: float, hi: float) -> float:
    """0 = calm, 1 = saturated, for a value on the metric's color range."""
    t = 0.5 if hi <= lo else min(max((value - lo) / (hi - lo), 0.0), 1.0)
    return 1.0 - t if metric in METRICS and METRICS[metric].higher_is_saturated is False else t


def delta_verdict(metric: str, delta: float) -> str:
    """What Δ = B − A of a metric says: "worse" (B more saturated), "better" (less), or "" (no
    change, undefined, or a metric with no saturating direction)."""
    direction = METRICS[metric].direction if metric in METRICS else "none"
    if not math.isfinite(delta) or direction == "none" or abs(delta) < 1e-12:
        return ""
    return "worse" if (delta > 0) == (direction == "high") else "better"


# ---- terminal rendering ---------------------------------------------------------------------------


def facts_panel(facts: list[tuple[str, str]], title: str) -> Panel:
    """A titled panel of (key, value) lines: the head of every terminal report."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in facts:
        grid.add_row(key, Text(value))
    return Panel(grid, title=title, title_align="left", expand=False)


def render_diagnose(
    result: DiagnoseResult,
    console: Console,
    *,
    heatmap_metric: str = "max_weight",
    heatmap_probe: str | None = None,
    top: int = 5,
) -> None:
    """Summary panel, one table per probe, a layer × head heatmap, the most saturated heads."""
    console.print(facts_panel(summary_facts(result), "ssacli diagnose"))
    for probe in result.probes:
        if probe.skipped:
            console.print(Text(f"{probe.name}: skipped — {probe.note or 'no countable rows'}", style="dim"))
            continue
        console.print(_probe_table(probe))
    if any(not p.skipped for p in result.probes):
        chosen = pick_heatmap(result, heatmap_metric, heatmap_probe)
        for table in heatmap_tables(result, chosen, heatmap_metric, console.width):
            console.print(table)
        console.print(Text(heatmap_legend(chosen, heatmap_metric), style="dim"))
    heads = result.most_saturated(top)
    if heads:
        console.print(_saturated_table(result, heads))


def render_comparison(a: DiagnoseResult, b: DiagnoseResult, console: Console) -> None:
    """A panel naming A and B, then per shared probe A, B and Δ = B − A of the key metrics on the
    levels both swept, and both collapse points."""
    facts = [
        ("A", f"{a.model} · {a.scorer} · {a.route}"),
        ("B", f"{b.model} · {b.scorer} · {b.route}"),
        ("layers × heads", f"A {_shape(a)} · B {_shape(b)}"),
        ("Δ", "B − A of the model means; red = B more saturated, green = B less"),
    ]
    console.print(facts_panel(facts, "ssacli diagnose: comparison"))
    names_b = {p.name for p in b.probes}
    for pa in a.probes:
        if pa.name not in names_b:
            console.print(Text(f"{pa.name}: only in A", style="dim"))
            continue
        pb = b.probe(pa.name)
        if pa.skipped or pb.skipped:
            which = " and ".join(s for s, p in (("A", pa), ("B", pb)) if p.skipped)
            console.print(Text(f"{pa.name}: skipped in {which}", style="dim"))
            continue
        table = comparison_table(pa, pb)
        if table is None:
            console.print(Text(f"{pa.name}: no level in common", style="dim"))
            continue
        console.print(table)
    for pb in b.probes:
        if pb.name not in {p.name for p in a.probes}:
            console.print(Text(f"{pb.name}: only in B", style="dim"))


def comparison_columns(pa: ProbeResult, pb: ProbeResult) -> list[str]:
    """The compared metrics (:attr:`MetricSpec.compared`) defined (finite somewhere) in at least one
    of the two probes."""
    return [
        m
        for m, spec in METRICS.items()
        if spec.compared
        and m in pa.metrics
        and m in pb.metrics
        and (np.isfinite(pa.metrics[m]).any() or np.isfinite(pb.metrics[m]).any())
    ]


def comparison_table(pa: ProbeResult, pb: ProbeResult) -> Table | None:
    """Rows = common levels; per metric an A, B and Δ column under a two-line header, tightly
    packed so four metrics fit a 120-column terminal."""
    shared = common_levels(pa, pb)
    if not shared:
        return None
    metrics = comparison_columns(pa, pb)
    title = (
        f"{pa.name} · collapse point A {fmt_collapse(pa.collapse_point())} "
        f"→ B {fmt_collapse(pb.collapse_point())}"
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    table.add_column("\nlevel", justify="right")
    for m in metrics:
        for side in ("A", "B", "Δ"):
            table.add_column(f"{METRICS[m].short}\n{side}", justify="right", no_wrap=True)
    means = {m: (pa.model_mean(m), pb.model_mean(m)) for m in metrics}
    for level, ia, ib in shared:
        cells: list[Text | str] = [fmt_level(level)]
        for m in metrics:
            va, vb = float(means[m][0][ia]), float(means[m][1][ib])
            cells += [_fixed(va), _fixed(vb), _delta_text(m, vb - va)]
        table.add_row(*cells)
    abbreviated = [f"{METRICS[m].short} = {m}" for m in metrics if METRICS[m].short != m]
    if abbreviated:
        table.caption = ", ".join(abbreviated)
        table.caption_justify = "left"
    return table


def heatmap_legend(probe: ProbeResult, metric: str) -> str:
    direction = METRICS[metric].direction
    saturated = {"high": "high values", "low": "low values"}.get(direction, "no direction")
    return (
        f"heatmap: {metric}, probe {probe.name} at level {fmt_level(probe.levels[-1])} (its harshest); "
        f"rows = layers, columns = heads; darker = more saturated ({saturated}); · = undefined"
    )


def heatmap_tables(result: DiagnoseResult, probe: ProbeResult, metric: str, width: int) -> list[Table]:
    """The layer × head grid as rich tables of colored cells, split into column groups that fit
    the terminal so wide models never wrap mid-cell."""
    grid = probe.metrics[metric][-1]
    lo, hi = saturation_scale(metric, grid)
    texts = [[heat_cell(v) for v in row] for row in grid]
    cell = max((len(t) for row in texts for t in row), default=3) + 1
    labels = layer_labels(result.layers)[: grid.shape[0]]
    labels += [str(i) for i in range(len(labels), grid.shape[0])]
    label_width = max(len(s) for s in labels) + 1
    per_table = max(1, (width - label_width - 2) // cell)
    tables = []
    for start in range(0, grid.shape[1], per_table):
        heads = range(start, min(start + per_table, grid.shape[1]))
        table = Table(box=None, padding=0, pad_edge=False, show_edge=False)
        table.add_column("layer\\head", no_wrap=True, min_width=label_width)
        for head in heads:
            table.add_column(str(head), justify="right", width=cell, no_wrap=True)
        for layer, label in enumerate(labels):
            row: list[Text] = [Text(label + " ")]
            for head in heads:
                style = _heat_style(metric, grid[layer, head], lo, hi)
                row.append(Text(texts[layer][head].rjust(cell), style=style))
            table.add_row(*row)
        tables.append(table)
    return tables


def heat_cell(value: float) -> str:
    """Shortest readable value for a heatmap cell: ".93" below 1, "2.5" below 10, else 3 digits."""
    value = float(value)
    if not math.isfinite(value):
        return "·"
    if 0 <= value < 0.995:
        return f"{value:.2f}"[1:]
    if 0 <= value < 9.95:
        return f"{value:.1f}"
    return f"{value:.3g}" if value > 0 else f"{value:.2g}"


# ---- private helpers ------------------------------------------------------------------------------


def _shape(result: DiagnoseResult) -> str:
    heads = sorted(set(result.heads)) or [0]
    return f"{len(result.layers)} × {heads[0] if len(heads) == 1 else f'{heads[0]}–{heads[-1]}'}"


def _probe_table(probe: ProbeResult) -> Table:
    header, rows = probe_table_rows(probe)
    point = fmt_collapse(probe.collapse_point())
    title = f"{probe.name} · model means · collapse point {point}"
    if probe.note:
        title += f" · {probe.note}"
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False
    )
    for name in header:
        table.add_column(METRICS[name].header if name in METRICS else name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def _saturated_table(result: DiagnoseResult, heads: list[dict[str, Any]]) -> Table:
    labels = layer_labels(result.layers)
    table = Table(title="most saturated heads (harshest level of each probe)", title_justify="left")
    for name in ("probe", "level", "layer", "head", "collapse_rate", "max_weight", "entropy"):
        table.add_column(name, justify="left" if name in ("probe", "layer") else "right")
    for h in heads:
        layer = labels[h["layer"]] if h["layer"] < len(labels) else str(h["layer"])
        values = (fmt(h["collapse_rate"]), fmt(h["max_weight"]), fmt(h["entropy"]))
        table.add_row(h["probe"], fmt_level(h["level"]), layer, str(h["head"]), *values)
    return table


def _heat_style(metric: str, value: float, lo: float, hi: float) -> Style:
    if not math.isfinite(float(value)):
        return Style(dim=True)
    t = saturation(metric, float(value), lo, hi)
    pos = t * (len(PALETTE) - 1)
    i = min(int(pos), len(PALETTE) - 2)
    frac = pos - i
    rgb = tuple(round(c0 + (c1 - c0) * frac) for c0, c1 in zip(PALETTE[i], PALETTE[i + 1]))
    return Style(bgcolor=f"rgb({rgb[0]},{rgb[1]},{rgb[2]})", color="white" if t > 0.6 else "black")


def _fixed(value: float) -> str:
    """Comparison cells: three decimals, so A, B and Δ line up (these metrics lie in [0, 1])."""
    return f"{value:.3f}" if math.isfinite(value) else "–"


def _delta_text(metric: str, delta: float) -> Text:
    """Δ colored by meaning: red where B is more saturated than A, green where it is less."""
    text = f"{delta:+.3f}" if math.isfinite(delta) else "–"
    style = {"worse": "red", "better": "green"}.get(delta_verdict(metric, delta), "")
    return Text(text, style=style) if style else Text(text)
