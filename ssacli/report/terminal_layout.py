"""Rich tables that fit a terminal of any width, never truncating a cell: a table split into
column groups (:func:`split_tables`), a layer × head grid split into head ranges and colored by
saturation (:func:`grid_tables`). The terminal report (:mod:`ssacli.report.terminal`) and its
sections lay their rows out with these; with NO_COLOR (or a dumb terminal) every colored cell
still prints its value."""

from __future__ import annotations

import math

from rich import box
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ..diagnosis.result import DiagnoseResult
from .summary import layer_labels, saturation, saturation_scale

# Yellow -> orange -> dark red (ColorBrewer YlOrRd): light is calm, dark is saturated.
PALETTE = ((255, 255, 204), (255, 237, 160), (254, 217, 118), (254, 178, 76), (253, 141, 60), (252, 78, 42),
           (227, 26, 28), (189, 0, 38), (128, 0, 38))  # fmt: skip


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


def split_tables(
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


def _heat_style(metric: str, value: float, lo: float, hi: float) -> Style:
    if not math.isfinite(float(value)):
        return Style(dim=True)
    t = saturation(metric, float(value), lo, hi)
    pos = t * (len(PALETTE) - 1)
    i = min(int(pos), len(PALETTE) - 2)
    frac = pos - i
    rgb = tuple(round(c0 + (c1 - c0) * frac) for c0, c1 in zip(PALETTE[i], PALETTE[i + 1]))
    return Style(bgcolor=f"rgb({rgb[0]},{rgb[1]},{rgb[2]})", color="white" if t > 0.6 else "black")


__all__ = ["PALETTE", "grid_tables", "heat_cell", "split_columns", "split_tables"]
