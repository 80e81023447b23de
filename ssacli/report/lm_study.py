"""The language-model study's report (``studies/lm/run.py --report``): tables.md and its figures
(:func:`ssacli.report.plots.plot_lm_context`, :func:`~ssacli.report.plots.plot_lm_paired`) from a
results.json of :mod:`ssacli.quality.lm_study`. The aggregate and the pairs are recomputed from the
runs, so files written before a test existed render with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..files import write_text
from ..quality.lm_study import summarize
from ..stats import ALPHA, holm
from .plots import plot_lm_context, plot_lm_paired


def fmt(value: float | None, name: str, signed: bool = False) -> str:
    if value is None:
        return "–"
    if name.startswith(("blimp", "collapse")):
        return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def p_text(p: float | None) -> str:
    return "–" if p is None else f"{p:.2g}"


def multiplicity_lines(paired_rows: list[dict[str, Any]]) -> list[str]:
    """Each metric family (ppl, blimp, collapse) as a family of tests: its size, how many reach
    p <= ALPHA by the permutation test and by the t-test, how many chance alone would give, and
    which survive Holm's adjustment within the family."""
    lines = []
    for group in dict.fromkeys(r["metric"].split()[0] for r in paired_rows):
        mine = [r for r in paired_rows if r["metric"].split()[0] == group]
        tested = [r for r in mine if r["permutation_p"] is not None]
        if not tested:
            continue
        seeds = max(len(r["differences"]) for r in tested)
        counts = []
        for key, name in (("permutation_p", "permutation"), ("t_test_p", "t-test")):
            ps = [r[key] for r in tested]
            survivors = [
                f"{r['metric']} ({r['label']})"
                for r, p in zip(tested, holm(ps))
                if p is not None and p <= ALPHA
            ]
            passing = sum(1 for p in ps if p is not None and p <= ALPHA)
            counts.append(f"{name} p ≤ {ALPHA:g}: {passing}, after Holm: {', '.join(survivors) or 'none'}")
        lines.append(
            f"*{group}: {len(tested)} comparisons ({len(tested) * ALPHA:.1f} below {ALPHA:g} by chance; "
            f"the smallest permutation p {seeds} seeds allow is {2 / 2**seeds:.2g}); "
            + "; ".join(counts)
            + ".*"
        )
    return lines


def tables(results: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """tables.md (mean ± std per metric and arm, the paired differences with their family lines,
    every run's values, the time spent), and the results with the recomputed summaries it shows."""
    plan = results["plan"]
    results = {**results}
    results["aggregate"], results["paired"] = summarize(plan, results["runs"])  # with today's tests
    labels = [a["label"] for a in plan["arms"]]
    metrics = list(dict.fromkeys(r["metric"] for r in results["aggregate"]))
    seeds = sorted({r["seed"] for r in results["runs"]})
    lines = ["| metric | " + " | ".join(f"{label} (mean ± std)" for label in labels) + " |",
             "|" + "---|" * (len(labels) + 1)]  # fmt: skip
    rows = {(r["metric"], r["label"]): r for r in results["aggregate"]}
    for name in metrics:
        cells = []
        for label in labels:
            r = rows.get((name, label))
            std = "" if r is None or r["std"] is None else f" ± {fmt(r['std'], name)}"
            cells.append("–" if r is None else fmt(r["mean"], name) + std)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| metric | arm − reference | per seed | mean Δ [95 % CI] | permutation p | t-test p | "
              "verdict |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["paired"]:
        per_seed = ", ".join(fmt(d, r["metric"], True) for d in r["differences"])
        lines.append(
            f"| {r['metric']} | {r['label']} − {r['reference']} | {per_seed} | "
            f"{fmt(r['mean_difference'], r['metric'], True)} [{fmt(r['ci_low'], r['metric'], True)}, "
            f"{fmt(r['ci_high'], r['metric'], True)}] | {p_text(r['permutation_p'])} | "
            f"{p_text(r['t_test_p'])} | {r['verdict']} |"
        )
    lines += ["", *multiplicity_lines(results["paired"])]
    lines += ["", "| run | " + " | ".join(f"s{s}" for s in seeds) + " |", "|" + "---|" * (len(seeds) + 1)]
    for label in labels:
        for name in metrics:
            by_seed = {r["seed"]: r["metrics"].get(name) for r in results["runs"] if r["label"] == label}
            lines.append(f"| {label} {name} | " + " | ".join(fmt(by_seed.get(s), name) for s in seeds) + " |")
    train_s = sum(r["train_seconds"] or 0 for r in results["runs"])
    eval_s = sum(r["eval_seconds"] or 0 for r in results["runs"])
    wall = (results["wall_seconds"] or 0) / 60
    lines.append(f"\nWall time: {wall:.1f} min; {train_s / 60:.1f} thread-minutes of training, "
                 f"{eval_s / 60:.1f} of evaluation.")  # fmt: skip
    return "\n".join(lines) + "\n", results


def write_report(results: dict[str, Any], folder: Path) -> Path:
    """FOLDER/tables.md, lm-context.png and lm-paired.png; the path of tables.md."""
    text, summarized = tables(results)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_text(text, folder / "tables.md")
    plot_lm_context(summarized, folder / "lm-context.png")
    plot_lm_paired(summarized, folder / "lm-paired.png")
    return folder / "tables.md"
