"""Rich tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from ..icl.evaluate import Cell


def icl_legend(task: str) -> str:
    if task != "linear":
        return "cells: % of prompts with any wrong sign from position 3 (% of wrong positions)"
    return "cells: MSE from position 3 (MSE / Var y)"


def icl_tables(cells: Sequence[Cell], task: str, scorer: str) -> list[Table]:
    """A σ × length table, and an outlier × length table when outliers were planted.

    Quantification: % of prompts with a wrong sign from position 3 on (and % of wrong positions).
    linear: MSE (MSE / Var y).
    """
    lengths = sorted({c.length for c in cells})
    plain = [c for c in cells if c.outlier is None]
    probes = [c for c in cells if c.outlier is not None]
    tables = []
    if plain:
        table = _table(f"{task} · {scorer}", "σ", lengths)
        for sigma in sorted({c.sigma for c in plain}):
            row = {c.length: c for c in plain if c.sigma == sigma}
            table.add_row(f"{sigma:g}", *(_fmt(row.get(n), task) for n in lengths))
        tables.append(table)
    if probes:
        table = _table(f"{task} · {scorer} · planted outlier", "outlier@pos (σ)", lengths)
        for key in dict.fromkeys((c.outlier, c.outlier_position, c.sigma) for c in probes):
            row = {c.length: c for c in probes if (c.outlier, c.outlier_position, c.sigma) == key}
            table.add_row(f"{key[0]:g}@{key[1]} ({key[2]:g})", *(_fmt(row.get(n), task) for n in lengths))
        tables.append(table)
    return tables


def _table(title: str, first: str, lengths: list[int]) -> Table:
    table = Table(title=title, title_justify="left", min_width=len(title) + 2)
    table.add_column(first, justify="right")
    for length in lengths:
        table.add_column(f"{length} pts", justify="right")
    return table


def _fmt(cell: Cell | None, task: str) -> str:
    if cell is None:
        return "–"
    if task != "linear":
        return f"{100 * cell.error:.1f} ({100 * cell.position_error:.1f})"
    norm = "" if cell.normalized_error is None else f" ({cell.normalized_error:.3f})"
    return f"{cell.error:.3g}{norm}"
