"""The quality table of an ``ssacli report``: :func:`quality_rows`, one row per measure that every
side has (BEFORE, AFTER and, when given, CONTROL), with AFTER's change relative to each of the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .builtin import BUILTIN_PAIRS_NAME

NUMBERS = ("before", "after", "control", "delta", "delta_control")


def quality_rows(
    before: dict[str, Any], after: dict[str, Any], control: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per measure every side has: label, before, after, delta (after − before), and which
    direction is better ("lower" or "higher"). With ``control`` (a third model's measures, e.g. a
    softmax control trained with AFTER's budget) a row also has ``control`` and ``delta_control``
    (after − control), and a measure CONTROL lacks gets no row; without it the rows are as they were."""
    rows = []

    def add(key: str, label: str, pick: Callable[[dict], float | None], better: str) -> None:
        try:
            a, b = pick(before), pick(after)
            c = pick(control) if control is not None else None
        except KeyError:  # a measure only some sides have (or none) gets no row
            return
        row = {"key": key, "label": label, "before": a, "after": b}
        if control is not None:
            row["control"] = c
        row["delta"] = _change(b, a)
        if control is not None:
            row["delta_control"] = _change(b, c)
        row["better"] = better
        rows.append({k: _finite(v) if k in NUMBERS else v for k, v in row.items()})

    for key, name in (("lm_id", "in-dist. text"), ("lm_ood", "OOD text"), ("lm_builtin", "built-in texts")):
        add(f"{key}.nll", f"{name}: NLL / token", lambda s, k=key: s[k]["nll"], "lower")
        add(f"{key}.ppl", f"{name}: perplexity", lambda s, k=key: s[k]["perplexity"], "lower")
    add("lm_gap.nll", "OOD − in-dist. NLL", lambda s: s["lm_ood"]["nll"] - s["lm_id"]["nll"], "lower")
    source = " (built-in)" if before.get("pairs", {}).get("source") == BUILTIN_PAIRS_NAME else ""
    add("pairs.accuracy", f"minimal pairs{source}: accuracy", lambda s: s["pairs"]["accuracy"], "higher")
    for name in before.get("pairs", {}).get("files", {}):
        add(f"pairs.{name}", f"  {name}", lambda s, n=name: s["pairs"]["files"][n]["accuracy"], "higher")
    if "icl" in before:
        head = before["icl"]["headline"]
        unit = "error" if head == "error" else "MSE/Var"
        for cell in before["icl"]["sigma"] + before["icl"]["outliers"]:
            key = _cell_key(cell)
            if "outlier" in cell:
                tag = f"outlier {cell['outlier']:g}@{cell['position']}"
            else:
                tag = f"σ={cell['sigma']:g}" + (" (in-dist.)" if cell["sigma"] == 1 else "")
            add(f"icl.{key}", f"ICL {unit} {tag}", lambda s, k=key: _icl_cells(s)[k][head], "lower")
    return rows


def _change(to: float | None, base: float | None) -> float | None:
    return to - base if to is not None and base is not None else None


def _icl_cells(side: dict[str, Any]) -> dict[str, dict]:
    return {_cell_key(c): c for c in side["icl"]["sigma"] + side["icl"]["outliers"]}


def _cell_key(cell: dict) -> str:
    return f"{cell['sigma']:g}" + (f"@{cell['outlier']:g}:{cell['position']}" if "outlier" in cell else "")


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


__all__ = ["quality_rows"]
