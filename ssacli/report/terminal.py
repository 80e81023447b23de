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

from ..diagnosis.metrics import LAYER_METRICS, METRICS
from ..diagnosis.result import DiagnoseResult, ProbeResult, common_levels, compare_findings
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


REACH_COLUMN = "logit rms ×"  # the per-level logit RMS ÷ the first level's (where the probe acts)


def probe_table_rows(probe: ProbeResult) -> tuple[list[str], list[list[str]]]:
    """Header and formatted rows (one per level) of a probe's model-mean table: the metrics, the
    logit RMS ratio for magnitude probes (did the probe reach attention?), then the extras. A level
    whose forward overflowed reads "overflow" in every cell."""
    metrics = table_columns(probe)
    means = {m: probe.model_mean(m) for m in metrics}
    reach = probe.reach_model() if probe.kind is not None and probe.kind.magnitude else None
    if reach is not None and all(r is None for r in reach):
        reach = None
    extras = [k for k in probe.extras if k != "tokens"]
    header = ["level", *(["tokens"] if "tokens" in probe.extras else []), *metrics,
              *([REACH_COLUMN] if reach is not None else []), *extras]  # fmt: skip
    rows = []
    for i, level in enumerate(probe.levels):
        if probe.overflowed(i):
            rows.append([fmt_level(level), *(["overflow"] * (len(header) - 1))])
            continue
        row = [fmt_level(level)]
        if "tokens" in probe.extras:
            row.append(fmt(probe.extras["tokens"][i]))
        row += [fmt(means[m][i]) for m in metrics]
        if reach is not None:
            row.append("–" if reach[i] is None else f"{reach[i]:.2f}")
        row += [fmt(probe.extras[k][i] if i < len(probe.extras[k]) else None) for k in extras]
        rows.append(row)
    return header, rows


def column_header(name: str) -> str:
    if name in METRICS:
        return METRICS[name].header
    if name in LAYER_METRICS:
        return LAYER_METRICS[name].header
    return name


def split_columns(widths: list[int], width: int, keep: int = 1, group: int = 1) -> list[list[int]]:
    """Column indices per table so that each fits ``width`` characters: the first ``keep`` columns
    (the row labels) repeat in every table; the others go in groups of ``group`` (A, B, Δ of one
    metric stay together). Every cell keeps its full text: tables split, they never truncate."""
    head = list(range(keep))
    base = sum(widths[:keep])
    tables, current, used = [], [], base
    rest = list(range(keep, len(widths)))
    for start in range(0, len(rest), group):
        chunk = rest[start : start + group]
        need = sum(widths[i] for i in chunk)
        if current and used + need > width:
            tables.append(head + current)
            current, used = [], base
        current += chunk
        used += need
    if current or not tables:
        tables.append(head + current)
    return tables


def summary_findings(result: DiagnoseResult) -> list[str]:
    """The findings' sentences, in order (terminal and HTML show the same list)."""
    return [f["text"] for f in result.findings()]


def collapse_cell(probe: ProbeResult) -> str:
    """What the summary says about a probe's collapse point (n/a and overflow included)."""
    return probe.collapse_status()


def summary_facts(result: DiagnoseResult) -> list[tuple[str, str]]:
    """The header facts of a result, in display order, as plain strings."""
    settings = result.settings
    probes = "; ".join(
        f"{p.name}: " + ("skipped" if p.skipped else ", ".join(fmt_level(v) for v in p.levels))
        for p in result.probes
    )
    points = "; ".join(f"{p.name}: " + ("skipped" if p.skipped else collapse_cell(p)) for p in result.probes)
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
    """Summary panel, the findings, one table per probe (split to fit the width), the heads
    collapsed at baseline, a layer × head grid of per-head collapse points and a heatmap at the
    level where heads differ most, the most saturated heads."""
    console.print(facts_panel(summary_facts(result), "ssacli diagnose"))
    findings = summary_findings(result)
    if findings:
        console.print(findings_panel(findings))
    for probe in result.probes:
        if probe.skipped:
            console.print(Text(f"{probe.name}: skipped — {probe.note or 'no countable rows'}", style="dim"))
            continue
        for table in _probe_tables(probe, console.width):
            console.print(table)
        if probe.insensitive:
            console.print(Text(f"n/a: insensitive by construction: {probe.insensitive}", style="dim"))
        collapsed = probe.baseline_collapsed_heads()
        if collapsed:
            heads = ", ".join(f"L{layer}H{head}" for layer, head in collapsed)
            line = f"collapsed at baseline (not counted in its collapse point): {heads}"
            console.print(Text(line, style="dim"))
    if any(not p.skipped for p in result.probes):
        chosen = pick_heatmap(result, heatmap_metric, heatmap_probe)
        points = collapse_point_grid(chosen)
        if points is not None:
            for table in grid_tables(result, points, None, console.width, text=True):
                console.print(table)
            console.print(Text(collapse_grid_legend(chosen), style="dim"))
        index = chosen.most_different_level()
        for table in heatmap_tables(result, chosen, heatmap_metric, console.width, index):
            console.print(table)
        console.print(Text(heatmap_legend(chosen, heatmap_metric, index), style="dim"))
    heads = result.most_saturated(top)
    if heads:
        for table in _saturated_tables(result, heads, console.width):
            console.print(table)


def findings_panel(findings: list[str]) -> Panel:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for text in findings:
        grid.add_row("•", Text(text))
    return Panel(grid, title="findings", title_align="left", expand=False)


def collapse_point_grid(probe: ProbeResult) -> list[list[str]] | None:
    """[layer][head] cells: the level where each head collapses, "B" if it is collapsed at the
    first level (baseline), "·" if it never does (None when no head ever collapses)."""
    if probe.insensitive or "collapse_rate" not in probe.metrics:
        return None
    points = probe.head_collapse_points()
    base = probe.baseline_collapsed()
    cells = [
        ["B" if base[layer, head] else ("·" if p is None else fmt_level(p)) for head, p in enumerate(row)]
        for layer, row in enumerate(points)
    ]
    if all(c == "·" for row in cells for c in row):
        return None
    return cells


def collapse_grid_legend(probe: ProbeResult) -> str:
    return (
        f"per-head collapse points, probe {probe.name}: the first level where the head collapses "
        "(max weight ≥ τ in half its rows); B = collapsed at baseline, · = never"
    )


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
    changes = [f["text"] for f in compare_findings(a, b)]
    if changes:
        console.print(findings_panel(changes))
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
        tables = comparison_tables(pa, pb, console.width)
        if not tables:
            console.print(Text(f"{pa.name}: no level in common", style="dim"))
            continue
        for table in tables:
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


def comparison_tables(pa: ProbeResult, pb: ProbeResult, width: int) -> list[Table]:
    """:func:`comparison_table`'s cells, split into tables of whole metrics (A, B, Δ together)
    that fit ``width``; the level column repeats in each."""
    shared = common_levels(pa, pb)
    if not shared:
        return []
    metrics = comparison_columns(pa, pb)
    title = f"{pa.name} · collapse point A {collapse_cell(pa)} → B {collapse_cell(pb)}"
    header = ["\nlevel"] + [f"{METRICS[m].short}\n{side}" for m in metrics for side in ("A", "B", "Δ")]
    means = {m: (pa.model_mean(m), pb.model_mean(m)) for m in metrics}
    rows = []
    for level, ia, ib in shared:
        cells: list[Text | str] = [fmt_level(level)]
        for m in metrics:
            va, vb = float(means[m][0][ia]), float(means[m][1][ib])
            cells += [_fixed(va), _fixed(vb), _delta_text(m, vb - va)]
        rows.append(cells)
    tables = _split_tables(title, header, rows, width, keep=1, group=3)
    abbreviated = [f"{METRICS[m].short} = {m}" for m in metrics if METRICS[m].short != m]
    if abbreviated:
        tables[-1].caption = ", ".join(abbreviated)
        tables[-1].caption_justify = "left"
    return tables


def heatmap_legend(probe: ProbeResult, metric: str, index: int | None = None) -> str:
    direction = METRICS[metric].direction
    saturated = {"high": "high values", "low": "low values"}.get(direction, "no direction")
    index = len(probe.levels) - 1 if index is None else index
    which = "its harshest" if index == len(probe.levels) - 1 else "where heads differ most"
    return (
        f"heatmap: {metric}, probe {probe.name} at level {fmt_level(probe.levels[index])} ({which}); "
        f"rows = layers, columns = heads; darker = more saturated ({saturated}); · = undefined"
    )


def heatmap_tables(
    result: DiagnoseResult, probe: ProbeResult, metric: str, width: int, index: int | None = None
) -> list[Table]:
    """The layer × head grid at level ``index`` (default: the harshest) as rich tables of colored
    cells, split into column groups that fit the terminal so wide models never wrap mid-cell."""
    grid = probe.metrics[metric][-1 if index is None else index]
    return grid_tables(result, grid, metric, width)


def grid_tables(
    result: DiagnoseResult, grid, metric: str | None, width: int, text: bool = False
) -> list[Table]:
    """A layer × head grid (numbers colored by ``metric``, or ready-made strings when ``text``)."""
    if text:
        texts = [list(row) for row in grid]
        lo = hi = 0.0
    else:
        lo, hi = saturation_scale(metric, grid)
        texts = [[heat_cell(v) for v in row] for row in grid]
    cell = max((len(t) for row in texts for t in row), default=3) + 1
    n_layers, n_heads = len(texts), max((len(r) for r in texts), default=0)
    labels = layer_labels(result.layers)[:n_layers]
    labels += [str(i) for i in range(len(labels), n_layers)]
    label_width = max(len(s) for s in labels) + 1
    per_table = max(1, (width - label_width - 2) // cell)
    tables = []
    for start in range(0, n_heads, per_table):
        heads = range(start, min(start + per_table, n_heads))
        table = Table(box=None, padding=0, pad_edge=False, show_edge=False)
        table.add_column("layer\\head", no_wrap=True, min_width=label_width)
        for head in heads:
            table.add_column(str(head), justify="right", width=cell, no_wrap=True)
        for layer, label in enumerate(labels):
            row: list[Text] = [Text(label + " ")]
            for head in heads:
                style = Style() if text else _heat_style(metric, grid[layer, head], lo, hi)
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


def _probe_tables(probe: ProbeResult, width: int) -> list[Table]:
    header, rows = probe_table_rows(probe)
    title = f"{probe.name} · model means · collapse point {collapse_cell(probe)}"
    if probe.note:
        title += f" · {probe.note}"
    names = [column_header(n) for n in header]
    return _split_tables(title, names, rows, width, keep=1)


def _split_tables(
    title: str, header: list[str], rows: list[list], width: int, keep: int = 1, group: int = 1,
    left: tuple[int, ...] = (),
) -> list[Table]:  # fmt: skip
    """Plain tables of the given cells that each fit ``width`` (one space between columns)."""
    widths = [
        max(max((len(line) for line in str(h).split("\n")), default=0),
            max((len(c.plain if isinstance(c, Text) else str(c)) for c in col), default=0)) + 1
        for h, col in zip(header, zip(*rows) if rows else [()] * len(header))
    ]  # fmt: skip
    tables = []
    # SIMPLE_HEAD draws a space between columns (counted in each width) and one at each edge.
    for part, columns in enumerate(split_columns(widths, width - 3, keep, group)):
        table = Table(
            title=title if part == 0 else None, title_justify="left", box=box.SIMPLE_HEAD,
            padding=0, pad_edge=False, collapse_padding=True,
        )  # fmt: skip
        for i in columns:
            table.add_column(header[i], justify="left" if i in left else "right", no_wrap=True)
        for row in rows:
            table.add_row(*(row[i] for i in columns))
        tables.append(table)
    return tables


def _saturated_tables(result: DiagnoseResult, heads: list[dict[str, Any]], width: int) -> list[Table]:
    labels = layer_labels(result.layers)
    header = ["probe", "level", "layer", "head", "collapse", "max w", "entropy"]
    rows = []
    for h in heads:
        layer = labels[h["layer"]] if h["layer"] < len(labels) else str(h["layer"])
        values = (fmt(h["collapse_rate"]), fmt(h["max_weight"]), fmt(h["entropy"]))
        rows.append([h["probe"], fmt_level(h["level"]), layer, str(h["head"]), *values])
    title = "most saturated heads (at the level where each probe's heads differ most)"
    return _split_tables(title, header, rows, width, keep=1, left=(0, 2))


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
