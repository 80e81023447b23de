"""Markdown tables (and figures) of an ICL sweep's results.json, paired by seed.

    python studies/icl/tables.py runs/icl-v2/results.json > /tmp/tables.md
    python studies/icl/tables.py runs/icl-v2/results.json --figures docs/results/icl-v2 \
        --per-seed docs/results/icl-v2/per-seed.md > /tmp/tables.md

For every task, backbone and view (σ, length, planted outlier scored after the outlier, and for
linear the uncapped rank correlation and the coefficient σ):

* a table of mean ± std over seeds per arm;
* a paired table: each arm minus the reference arm (the plan's ``reference``, default the first),
  per-seed differences summarized as mean Δ [95 % bootstrap CI], the exact sign-flip permutation p
  (``p``) and the paired t-test p (``t``), and how many seeds the arm is better / worse on; the
  verdict (ssacli.stats.verdict) needs the interval to exclude 0 and the permutation p <= 0.05; a
  line under the table states its multiplicity: how many of its comparisons reach p <= 0.05, how
  many chance alone would give, and which survive Holm's adjustment over the table;
* for linear, the read-out cap: max |prediction| against max |y| per σ.

``--per-seed FILE`` writes every arm's value for every seed and cell; ``--figures DIR`` draws the
sweep's figures (per-seed lines and the paired differences with their CIs). Aggregates and pairs
are recomputed from the runs, so results.json files written before pairing existed render too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssacli.icl.sweep import aggregate, cell_key, paired
from ssacli.report.plots import plot_sweep, sweep_views
from ssacli.stats import ALPHA, holm, verdict

PERCENT_METRICS = ("error", "after_outlier", "at_outlier", "sign_error")
TITLES = {
    "sigma": "magnitude shift (σ of the inputs, {trained} points)",
    "length": "length shift (σ = 1)",
    "outlier": "planted outlier at position {position}, scored on the positions after it (σ = 1)",
    "sigma-rank": "magnitude shift, rank correlation of predictions with targets (higher is better)",
    "coef": "coefficient shift (σ of a, b; σ_x = 1, {trained} points)",
    "coef-rank": "coefficient shift, rank correlation (higher is better)",
}
COLUMN_NAMES = {"sigma": "σ", "length": "length", "outlier": "outlier", "coef_sigma": "σ_ab"}


def unit(task: str, metric: str) -> str:
    if metric == "rank_corr":
        return "Spearman ρ"
    if task == "linear" and metric in ("error", "after_outlier", "at_outlier"):
        return "MSE / Var(y)"
    return "% of prompts with an error" if metric != "sign_error" else "% of wrong signs"


def number(value: float | None, task: str, metric: str, signed: bool = False) -> str:
    if value is None:
        return "–"
    percent = metric in PERCENT_METRICS and not (task == "linear" and metric != "sign_error")
    text = f"{100 * value:+.1f}" if percent and signed else f"{100 * value:.1f}" if percent else None
    if text is None:
        text = f"{value:+.3f}" if signed else f"{value:.3f}"
    return text


def grid_table(rows, first_header, labels, column, values, cell, row_name) -> list[str]:
    """One row per arm, one column per value of ``column``: ``cell(row)`` for each cell that exists
    ("–" where it does not), ``row_name(label, any row of the arm)`` in the first column."""
    lines = [
        f"| {first_header} | " + " | ".join(f"{COLUMN_NAMES[column]} = {v:g}" for v in values) + " |",
        "|" + "---|" * (len(values) + 1),
    ]
    for label in labels:
        cells = {r[column]: r for r in rows if r["label"] == label}
        if not cells:
            continue
        texts = [cell(cells[v]) if v in cells else "–" for v in values]
        lines.append(f"| {row_name(label, next(iter(cells.values())))} | " + " | ".join(texts) + " |")
    return lines


def mean_table(rows, task, labels, column, values, metric) -> list[str]:
    def cell(r) -> str:
        std = "" if r["std"] is None else f" ± {number(r['std'], task, metric)}"
        return number(r["mean"], task, metric) + std

    return grid_table(
        rows, "arm (seeds)", labels, column, values, cell, lambda label, r: f"{label} ({r['seeds']})"
    )


def p_text(p: float | None) -> str:
    return "–" if p is None else f"{p:.2g}"


def paired_table(pairs, task, labels, column, values, metric) -> list[str]:
    def cell(r) -> str:
        lower = not r["higher_is_better"]
        better, worse = (r["b_lower"], r["b_higher"]) if lower else (r["b_higher"], r["b_lower"])
        return (
            f"{number(r['mean_difference'], task, metric, True)} "
            f"[{number(r['ci_low'], task, metric, True)}, {number(r['ci_high'], task, metric, True)}] "
            f"p={p_text(r['permutation_p'])} t={p_text(r['t_test_p'])} {better}/{worse} "
            f"**{verdict(r, lower_is_better=lower)}**"
        )

    lines = grid_table(
        pairs, "arm − reference", labels, column, values, cell,
        lambda label, r: f"{label} − {r['reference']}",
    )  # fmt: skip
    return [*lines, "", multiplicity_line(pairs, task, metric, column)]


def multiplicity_line(pairs, task, metric, column) -> str:
    """The table as a family: its size, how many comparisons reach p <= ALPHA, the number chance
    alone would give if no arm differed, and those that survive Holm's adjustment over the table."""
    tested = [r for r in pairs if r["permutation_p"] is not None]
    if not tested:
        return "*Family: every comparison ties (nothing to test).*"
    passing = [r for r in tested if r["permutation_p"] <= ALPHA]
    adjusted = holm([r["permutation_p"] for r in tested])
    survivors = [
        f"{r['label']} at {COLUMN_NAMES[column]} = {r[column]:g} (Holm p = {p:.2g})"
        for r, p in zip(tested, adjusted)
        if p <= ALPHA
    ]
    return (
        f"*Family: {len(tested)} comparisons; {len(passing)} with permutation p ≤ {ALPHA:g} "
        f"({len(tested) * ALPHA:.1f} expected by chance if no arm differed); after Holm over this "
        f"table: {', '.join(survivors) if survivors else 'none'}.*"
    )


def cap_table(runs, task, arch, labels, trained) -> list[str]:
    """linear: max |prediction| (mean over seeds) and max |y| per σ."""
    by = {}
    for run in runs:
        if run["task"] != task or run.get("arch", "gpt2") != arch:
            continue
        for c in run["cells"]:
            if c["outlier"] is None and c["length"] == trained and c.get("coef_sigma", 1.0) == 1.0:
                if c.get("max_abs_prediction") is not None:
                    by.setdefault((run["label"], c["sigma"]), []).append(c)
    if not by:
        return []
    sigmas = sorted({s for _, s in by})
    lines = [
        "| max abs value | " + " | ".join(f"σ = {s:g}" for s in sigmas) + " |",
        "|" + "---|" * (len(sigmas) + 1),
    ]
    for label in labels:
        cells = [by.get((label, s), []) for s in sigmas]
        if any(cells):
            texts = [
                f"{sum(c['max_abs_prediction'] for c in cs) / len(cs):.1f}" if cs else "–" for cs in cells
            ]
            lines.append(f"| prediction, {label} | " + " | ".join(texts) + " |")
    targets = [by.get((labels[0], s), []) for s in sigmas]
    lines.append(
        "| target y | " + " | ".join(f"{cs[0]['max_abs_target']:.0f}" if cs else "–" for cs in targets) + " |"
    )
    return lines


def per_seed_tables(runs, plan) -> list[str]:
    out = ["# Per-seed values of every cell\n", "One row per cell; one column per seed; arms in rows.\n"]
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    from ssacli.icl.sweep import cell_metrics

    for run in runs:
        for cell in run["cells"]:
            for metric, value in cell_metrics(cell).items():
                key = (*cell_key(run, cell), metric)
                groups.setdefault(key, {}).setdefault(run["label"], {})[run["seed"]] = value
    seeds = sorted({run["seed"] for run in runs})
    out.append(
        "| task | arch | σ | length | outlier | σ_ab | metric | arm | "
        + " | ".join(f"s{s}" for s in seeds)
        + " |"
    )
    out.append("|" + "---|" * (8 + len(seeds)))
    for key, arms in groups.items():
        task, arch, sigma, length, outlier, coef, metric = key
        for label, values in arms.items():
            texts = [number(values.get(s), task, metric) for s in seeds]
            planted = "–" if outlier is None else f"{outlier:g}"
            head = f"| {task} | {arch} | {sigma:g} | {length} | {planted} | {coef:g} | {metric} | {label} | "
            out.append(head + " | ".join(texts) + " |")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--figures", type=Path, help="folder for the figures")
    parser.add_argument("--per-seed", type=Path, help="markdown file for the per-seed values")
    args = parser.parse_args(argv)
    summary = json.loads(args.results.read_text())
    plan, runs = summary["plan"], summary["runs"]
    labels = [s["label"] for s in plan["scorers"]]
    reference = plan.get("reference") or labels[0]
    rows, pairs = aggregate(runs), paired(runs, reference)
    archs = plan.get("archs") or ["gpt2"]
    trained = plan["points_end"]
    out = []
    for task in plan["tasks"]:
        for arch in archs:
            mine = [r for r in rows if r["task"] == task and r["arch"] == arch]
            mine_pairs = [r for r in pairs if r["task"] == task and r["arch"] == arch]
            for name, column, metric, keep in sweep_views(plan, task):
                sel = [r for r in mine if r["metric"] == metric and keep(r)]
                if not sel:
                    continue
                values = sorted({r[column] for r in sel})
                title = TITLES[name].format(trained=trained, position=plan.get("outlier_position", 3))
                out.append(f"\n#### {task}, {arch}: {title}; {unit(task, metric)}\n")
                out += mean_table(sel, task, labels, column, values, metric)
                ps = [r for r in mine_pairs if r["metric"] == metric and keep(r)]
                if ps:
                    out.append("")
                    out += paired_table(ps, task, labels, column, values, metric)
            if task == "linear":
                cap = cap_table(runs, task, arch, labels, trained)
                if cap:
                    out.append(
                        f"\n#### {task}, {arch}: the read-out cap "
                        f"(max over prompts and positions, {trained} points)\n"
                    )
                    out += cap
    train_s = sum(r.get("train_seconds") or 0 for r in runs)
    eval_s = sum(r.get("eval_seconds") or 0 for r in runs)
    out.append(
        f"\nWall time of the sweep: {summary['wall_seconds'] / 60:.1f} min for {len(runs)} runs on "
        f"{summary.get('device', 'cpu')} ({train_s / 60:.1f} thread-minutes of training, {eval_s / 60:.1f} "
        "of evaluation)."
    )
    print("\n".join(out))
    if args.per_seed:
        args.per_seed.parent.mkdir(parents=True, exist_ok=True)
        args.per_seed.write_text("\n".join(per_seed_tables(runs, plan)) + "\n")
    if args.figures:
        for path in plot_sweep({**summary, "aggregate": rows, "paired": pairs}, args.figures):
            print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
