"""Rich terminal rendering of a diagnose result, and of two results side by side.

What the tables and legends say comes from :mod:`ssacli.report.summary` (shared with the HTML
page, so both always say the same thing); this module lays it out for a terminal of any width:
tables split into column groups that fit, never truncating a cell. Every colored cell also prints
its value: with NO_COLOR (or a dumb terminal) the numbers still carry the information.
"""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ..defaults import FINDINGS, HEATMAP
from ..diagnosis.comparison import common_levels, comparison_findings, generation_comparison
from ..diagnosis.findings import level_text
from ..diagnosis.metrics import METRICS
from ..diagnosis.probe_result import ProbeResult
from ..diagnosis.result import DiagnoseResult
from ..diagnosis.shift import shift_lines
from ..diagnosis.verdicts import Verdict, paired_verdicts, probe_verdicts
from .positions import render_positions
from .summary import (
    collapse_cell,
    collapse_detail,
    collapse_grid_legend,
    collapse_point_grid,
    column_header,
    comparison_columns,
    delta_verdict,
    fmt,
    fmt_level,
    heatmap_index,
    heatmap_legend,
    layer_labels,
    layers_by_heads,
    pick_heatmap,
    probe_table_rows,
    saturation,
    saturation_scale,
    summary_facts,
    summary_findings,
)

# Yellow -> orange -> dark red (ColorBrewer YlOrRd): light is calm, dark is saturated.
PALETTE = ((255, 255, 204), (255, 237, 160), (254, 217, 118), (254, 178, 76), (253, 141, 60), (252, 78, 42),
           (227, 26, 28), (189, 0, 38), (128, 0, 38))  # fmt: skip


# ---- layout -----------------------------------------------------------------------------------------


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
    heatmap_metric: str = HEATMAP,
    heatmap_probe: str | None = None,
    top: int = 5,
    findings: int | None = FINDINGS,
) -> None:
    """The verdict (one line per probe, most severe first), summary panel, the first ``findings``
    findings (None: all) and a count of the rest, one table
    per probe (split to fit the width), the heads collapsed at baseline, a layer × head grid of
    per-head collapse points and a heatmap at the level where heads differ most, the most
    saturated heads."""
    verdicts = probe_verdicts(result)
    if verdicts:
        console.print(verdict_panel(verdicts))
    console.print(facts_panel(summary_facts(result), "ssacli diagnose"))
    texts = summary_findings(result)
    if texts:
        console.print(findings_panel(texts, findings))
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
        detail = collapse_detail(probe)
        if detail:
            console.print(Text(detail, style="dim"))
        for line in shift_lines(probe):  # the shift probe: per document, against the reference
            console.print(Text(line, style="dim"))
        console.print()  # a blank line before the next probe's title
    if any(not p.skipped for p in result.probes):
        chosen = pick_heatmap(result, heatmap_metric, heatmap_probe)
        points = collapse_point_grid(chosen)
        if points is not None:
            title = f"per-head collapse points · {chosen.name}"
            for table in grid_tables(result, points, None, console.width, text=True, title=title):
                console.print(table)
            console.print(Text(collapse_grid_legend(chosen), style="dim"))
        index = heatmap_index(chosen)
        for table in heatmap_tables(result, chosen, heatmap_metric, console.width, index):
            console.print(table)
        console.print(Text(heatmap_legend(chosen, heatmap_metric, index), style="dim"))
    render_positions(result, console)  # where attention lands (sinks, distance, head classes)
    if result.generation is not None:
        from .generation import generation_tables

        for table in generation_tables(result.generation, layer_labels(result.layers), console.width):
            console.print(table)
    heads = result.most_saturated(top)
    if heads:
        for table in _saturated_tables(result, heads, console.width):
            console.print(table)


# The verdict's tones (Verdict.tone): failed (red), could not test (yellow), held (green), no
# collapse with the outputs unmeasured (plain). The kind is also printed, so the colour carries
# nothing that NO_COLOR loses.
VERDICT_STYLES = {"failed": "bold red", "untested": "yellow", "held": "green", "unconfirmed": ""}


def verdict_panel(verdicts: list[Verdict]) -> Panel:
    """The block a report opens with: per probe its name and verdict line, most severe first."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(overflow="fold")
    for verdict in verdicts:
        grid.add_row(verdict.probe, Text(verdict.line, style=VERDICT_STYLES[verdict.tone]))
    return Panel(grid, title="verdict", title_align="left", expand=False)


def paired_verdict_panel(a: DiagnoseResult, b: DiagnoseResult) -> Panel:
    """A comparison opens with both verdicts per probe (A's line, then B's), the most severe first."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for name, va, vb in paired_verdicts(a, b):
        for side, verdict in (("A", va), ("B", vb)):
            line = (
                Text("not run", style="dim")
                if verdict is None
                else Text(verdict.line, style=VERDICT_STYLES[verdict.tone])
            )
            grid.add_row(name if side == "A" else "", side, line)
    return Panel(grid, title="verdict (A, B)", title_align="left", expand=False)


def findings_panel(findings: list[str], budget: int | None = FINDINGS) -> Panel:
    """The first ``budget`` findings (None: all), most important first, and a last line counting the
    rest, so none is dropped without a word (JSON and HTML hold them all)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    shown = findings if budget is None else findings[:budget]
    for text in shown:
        grid.add_row("•", Text(text))
    if len(findings) > len(shown):
        grid.add_row("", Text(f"and {len(findings) - len(shown)} more: --findings all", style="dim"))
    return Panel(grid, title="findings", title_align="left", expand=False)


def render_comparison(
    a: DiagnoseResult, b: DiagnoseResult, console: Console, findings: int | None = FINDINGS
) -> None:
    """A panel naming A and B, the first ``findings`` changes (None: all) and a count of the rest,
    then per shared probe A, B and Δ = B − A of the key metrics on the levels both swept, and both
    collapse points."""
    facts = [
        ("A", f"{a.model} · {a.scorer} · {a.route}"),
        ("B", f"{b.model} · {b.scorer} · {b.route}"),
        ("layers × heads", f"A {layers_by_heads(a)} · B {layers_by_heads(b)}"),
        ("Δ", "B − A of the model means; red = B more saturated, green = B less"),
    ]
    console.print(paired_verdict_panel(a, b))
    console.print(facts_panel(facts, "ssacli diagnose: comparison"))
    changes = [f["text"] for f in comparison_findings(a, b)]
    if changes:
        console.print(findings_panel(changes, findings))
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
        legend = comparison_legend(pa, pb)
        if legend:  # under the tables, wrapped to the terminal (a caption wraps at the table's edge)
            console.print(Text(legend, style="dim"))
    for pb in b.probes:
        if pb.name not in {p.name for p in a.probes}:
            console.print(Text(f"{pb.name}: only in B", style="dim"))
    render_generation_comparison(generation_comparison(a, b), console)


def render_generation_comparison(comparison: dict | None, console: Console) -> None:
    """diagnose --generate on both sides: A, B and Δ of each metric's mean while generating."""
    if comparison is None:
        return
    if "only" in comparison:
        only = f"generation: only in {comparison['only']} (run both with --generate)"
        console.print(Text(only, style="dim"))
        return
    from .generation import comparison_rows

    caption, header, rows = comparison_rows(comparison)
    for table in _split_tables(caption, header, rows, console.width, keep=1, left=(0,)):
        console.print(table)


def comparison_tables(pa: ProbeResult, pb: ProbeResult, width: int) -> list[Table]:
    """Rows = common levels; per metric an A, B and Δ column under a two-line header, split into
    tables of whole metrics (A, B, Δ together) that fit ``width``; the level column repeats in each."""
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
    continued = f"{pa.name} · A, B, Δ (continued)"
    return _split_tables(title, header, rows, width, keep=1, group=3, continued=continued)


def comparison_legend(pa: ProbeResult, pb: ProbeResult) -> str | None:
    """What the comparison tables' abbreviated headers stand for ("ent = entropy, …"), or None."""
    metrics = comparison_columns(pa, pb)
    abbreviated = [f"{METRICS[m].short} = {m}" for m in metrics if METRICS[m].short != m]
    return ", ".join(abbreviated) if abbreviated and common_levels(pa, pb) else None


def heatmap_tables(
    result: DiagnoseResult, probe: ProbeResult, metric: str, width: int, index: int | None = None
) -> list[Table]:
    """The layer × head grid at level ``index`` (default: the harshest) as rich tables of colored
    cells, split into column groups that fit the terminal so wide models never wrap mid-cell."""
    index = len(probe.levels) - 1 if index is None else index
    title = f"{metric} per head · {probe.name} at {level_text(probe, probe.levels[index])}"
    return grid_tables(result, probe.metrics[metric][index], metric, width, title=title)


def grid_tables(
    result: DiagnoseResult, grid, metric: str | None, width: int, text: bool = False, title: str | None = None
) -> list[Table]:
    """A layer × head grid (numbers colored by ``metric``, or ready-made strings when ``text``),
    titled ``title`` (every part of a split grid: "…, heads 8–15")."""
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
        part = title
        if title is not None and n_heads > per_table:
            part = f"{title}, heads {heads[0]}–{heads[-1]}"
        table = Table(title=part, title_justify="left", box=None, padding=0, pad_edge=False, show_edge=False)
        table.add_column("layer\\head", no_wrap=True, min_width=label_width)
        for head in heads:
            table.add_column(str(head), justify="right", width=cell, no_wrap=True)
        _room_for_title(table, part, label_width + cell * len(heads), width)
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


def _probe_tables(probe: ProbeResult, width: int) -> list[Table]:
    header, rows = probe_table_rows(probe)
    title = f"{probe.name} · model means · collapse point {collapse_cell(probe)}"
    if probe.note:
        title += f" · {probe.note}"
    names = [column_header(n) for n in header]
    return _split_tables(title, names, rows, width, keep=1)


def _split_tables(
    title: str, header: list[str], rows: list[list], width: int, keep: int = 1, group: int = 1,
    left: tuple[int, ...] = (), continued: str | None = None,
) -> list[Table]:  # fmt: skip
    """Plain tables of the given cells that each fit ``width`` (one space between columns)."""
    widths = [
        max(max((len(line) for line in str(h).split("\n")), default=0),
            max((len(c.plain if isinstance(c, Text) else str(c)) for c in col), default=0)) + 1
        for h, col in zip(header, zip(*rows) if rows else [()] * len(header))
    ]  # fmt: skip
    tables = []
    # Every part is titled: the continuation of a split table by the title's first two parts.
    continued = continued or " · ".join(title.split(" · ")[:2]) + " (continued)"
    # SIMPLE_HEAD draws a space between columns (counted in each width) and one at each edge.
    for part, columns in enumerate(split_columns(widths, width - 3, keep, group)):
        name = title if part == 0 else continued
        table = Table(
            title=name, title_justify="left", box=box.SIMPLE_HEAD,
            padding=0, pad_edge=False, collapse_padding=True,
        )  # fmt: skip
        for i in columns:
            table.add_column(header[i], justify="left" if i in left else "right", no_wrap=True)
        _room_for_title(table, name, sum(widths[i] for i in columns) + 2, width)
        for row in rows:
            table.add_row(*(row[i] for i in columns))
        tables.append(table)
    return tables


def _room_for_title(table: Table, title: str | None, natural: int, width: int) -> None:
    """An empty last column that makes a narrow table (``natural`` characters) as wide as its
    title, up to the terminal's ``width``: rich wraps a title at the table's edge, and widening the
    table itself would spread its columns apart."""
    if title is not None and len(title) > natural:
        table.add_column("", width=min(len(title), width) - natural, no_wrap=True)


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
