"""Print the markdown tables of docs/results/icl.md from a sweep's results.json.

python scripts/icl_report.py runs/icl-study/results.json > /tmp/tables.md
"""

from __future__ import annotations

import json
import sys


def fmt(row: dict | None, percent: bool) -> str:
    if row is None:
        return "–"
    scale = 100 if percent else 1
    mean = f"{scale * row['mean']:.1f}" if percent else f"{row['mean']:.3f}"
    if row["std"] is None:
        return mean
    std = f"{scale * row['std']:.1f}" if percent else f"{row['std']:.3f}"
    return f"{mean} ± {std}"


def table(rows, task, labels, column, values, keep, percent) -> list[str]:
    header = "| scorer (seeds) | " + " | ".join(f"{column} = {v:g}" for v in values) + " |"
    lines = [header, "|" + "---|" * (len(values) + 1)]
    for label in labels:
        cells = {r[column]: r for r in rows if r["task"] == task and r["label"] == label and keep(r)}
        seeds = next(iter(cells.values()))["seeds"] if cells else 0
        lines.append(
            f"| {label} ({seeds}) | " + " | ".join(fmt(cells.get(v), percent) for v in values) + " |"
        )
    return lines


def main(path: str) -> None:
    summary = json.loads(open(path).read())
    plan, rows = summary["plan"], summary["aggregate"]
    trained = plan["points_end"]
    labels = [s["label"] for s in plan["scorers"]]
    views = [  # (heading, column, values, which cells)
        (f"magnitude shift ({trained} points", "sigma", plan["sigmas"],
         lambda r: r["outlier"] is None and r["length"] == trained),
        ("length shift (σ = 1", "length", plan["lengths"],
         lambda r: r["outlier"] is None and r["sigma"] == 1),
        (f"planted outlier at position {plan['outlier_position']} (σ = 1, {trained} points", "outlier",
         plan["outliers"], lambda r: r["outlier"] is not None and r["length"] == trained),
    ]  # fmt: skip
    for task in plan["tasks"]:
        percent = task != "linear"
        unit = "% of prompts with an error from position 3" if percent else "MSE / Var(y) from position 3"
        for heading, column, values, keep in views:
            print(f"\n### {task}: {heading}; {unit})\n")
            print("\n".join(table(rows, task, labels, column, values, keep, percent)))
    runs = summary["runs"]
    train_s = sum(r["train_seconds"] or 0 for r in runs)
    print(
        f"\nWall time of the sweep: {summary['wall_seconds'] / 60:.1f} min for {len(runs)} runs "
        f"({train_s / 60:.1f} CPU-thread minutes of training)."
    )


if __name__ == "__main__":
    main(sys.argv[1])
