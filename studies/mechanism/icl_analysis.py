"""Part B's analysis, tables and figure (docs/results/mechanism.md), from the per-run records that
``icl.py`` measures: what the page states before the runs, computed in that order.

A record: {task, arm, seed, failure: {baseline_error, SHIFT: {LEVEL: failure}}, saturation: {SHIFT:
probe summary}, intervention (softmax only)}; levels are strings ("8", "100", "2") as JSON keeps them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from mechanism_common import association, interval, level_key, partial_association, seed_bootstrap, spearman

from ssacli.stats import paired_summary

SIGMA = 8.0
PRIMARY = {"task": "every", "shift": "embed-scale", "level": SIGMA, "measure": "collapse_rate"}
REFERENCE, SSA = "softmax", "ssa-authors"
FAILED = 0.05  # failure at σ = 8 that counts as "fails": 5 points of error rate, 0.05 of Var(y)
DECISIVE_T = "8"
SHIFTS = ("embed-scale", "outlier", "length")
SHIFT_NAMES = {"embed-scale": "σ", "outlier": "outlier", "length": "length ×"}


def measure(record: dict, shift: str, name: str, level: float) -> float:
    probe = record["saturation"][shift]
    index = probe["levels"].index(float(level))
    if name == "delta_collapse":
        return probe["collapse_rate"][index] - probe["collapse_rate"][0]
    return probe[name][index]


def failure(record: dict, shift: str, level: float) -> float | None:
    return record["failure"][shift].get(level_key(level))


def reached(record: dict, shift: str) -> bool:
    """Whether the shift arrived (length always does; a magnitude probe by diagnose's reach check)."""
    return shift == "length" or record["saturation"][shift]["reached"] is not False


def levels_of(records: list[dict], shift: str) -> list[float]:
    return [
        lv
        for lv in records[0]["saturation"][shift]["levels"][1:]
        if failure(records[0], shift, lv) is not None
    ]


def across(records: list[dict], shift: str, name: str, level: float) -> dict[str, Any]:
    points: dict[int, list] = {}
    for r in records:
        if reached(r, shift):
            points.setdefault(r["seed"], []).append(
                (measure(r, shift, name, level), failure(r, shift, level))
            )
    return association(points)


def pooled_partial(records: list[dict], shift: str, name: str) -> dict[str, Any]:
    points: dict[int, list] = {}
    for r in records:
        if reached(r, shift):
            for lv in levels_of(records, shift):
                points.setdefault(r["seed"], []).append(
                    (measure(r, shift, name, lv), failure(r, shift, lv), lv)
                )
    return partial_association(points)


def heads_association(softmax: list[dict]) -> dict[str, Any]:
    """Mean over seeds of the across-heads ρ (collapse rise vs the head's softening effect)."""
    per_seed = {}
    for r in softmax:
        heads = r["intervention"]["per_head"]
        per_seed[r["seed"]] = [spearman([h["rise"] for h in heads], [h["did"] for h in heads])]

    def mean(groups) -> float | None:
        values = [v for g in groups for v in g if v is not None]
        return float(np.mean(values)) if values else None

    return {**seed_bootstrap(per_seed, mean), "per_seed": {s: v[0] for s, v in per_seed.items()}}


def temperature(softmax: list[dict]) -> dict[str, Any]:
    out = {}
    for t in softmax[0]["intervention"]["softened"]:
        did = {r["seed"]: r["intervention"]["softened"][t]["did"] for r in softmax}
        before = [measure(r, "embed-scale", "collapse_rate", SIGMA) for r in softmax]
        after = [r["intervention"]["softened"][t]["collapse"][-1] for r in softmax]
        out[t] = {
            "did": paired_summary({s: 0.0 for s in did}, did),
            "collapse_before": float(np.mean(before)),
            "collapse_after": float(np.mean(after)),
        }
    return out


def verdicts(records: list[dict]) -> dict[str, Any]:
    """Diagnose's verdict (collapse point at or below σ = 8) against failing at σ = 8."""
    counts = {"collapse_and_fail": [], "collapse_no_failure": [], "failure_no_collapse": [], "neither": []}
    for r in records:
        point = r["saturation"]["embed-scale"]["collapse_point"]
        collapsed = point is not None and point <= SIGMA
        failed = failure(r, "embed-scale", SIGMA) >= FAILED
        name = {
            (True, True): "collapse_and_fail",
            (True, False): "collapse_no_failure",
            (False, True): "failure_no_collapse",
            (False, False): "neither",
        }[(collapsed, failed)]
        counts[name].append(f"{r['arm']}-s{r['seed']}")
    return counts


def reach(records: list[dict]) -> dict[str, Any]:
    out = {}
    for arm in sorted({r["arm"] for r in records}):
        mine = [r for r in records if r["arm"] == arm]
        for shift in ("embed-scale", "outlier"):
            shares = [r["saturation"][shift]["reach_share"][-1] for r in mine]
            shares = [s for s in shares if s is not None]
            out[f"{arm}/{shift}"] = {
                "reached": sum(r["saturation"][shift]["reached"] is True for r in mine),
                "not_reached": sum(r["saturation"][shift]["reached"] is False for r in mine),
                "not_measured": sum(r["saturation"][shift]["reached"] is None for r in mine),
                "absorbed_by": sorted(
                    {
                        str(r["saturation"][shift]["absorbed_by"])
                        for r in mine
                        if r["saturation"][shift]["reached"] is False
                    }
                ),
                "share_top_level": [min(shares), max(shares)] if shares else None,
            }
    return out


def analyse_task(records: list[dict]) -> dict[str, Any]:
    by_arm = {arm: [r for r in records if r["arm"] == arm] for arm in sorted({r["arm"] for r in records})}
    associations = {}
    for shift in SHIFTS:
        names = ("collapse_rate", "max_weight", "entropy", "delta_collapse")
        names += ("outlier_capture",) if shift == "outlier" else ()
        for lv in levels_of(records, shift):
            for name in names:
                associations[f"{shift}@{level_key(lv)}/{name}"] = across(records, shift, name, lv)
            for arm, mine in by_arm.items():
                associations[f"{shift}@{level_key(lv)}/collapse_rate/{arm}"] = across(
                    mine, shift, "collapse_rate", lv
                )
        associations[f"{shift}/partial/collapse_rate"] = pooled_partial(records, shift, "collapse_rate")
    base = {arm: [r["failure"]["baseline_error"] for r in mine] for arm, mine in by_arm.items()}
    out: dict[str, Any] = {
        "models": len(records),
        "associations": associations,
        "reach": reach(records),
        "baseline_error": {a: [min(v), float(np.mean(v)), max(v)] for a, v in base.items()},
        "verdicts": verdicts(records),
    }
    if REFERENCE in by_arm and SSA in by_arm:
        ref, ssa = ({r["seed"]: r for r in by_arm[a]} for a in (REFERENCE, SSA))
        out["ssa_vs_softmax"] = {
            "collapse": paired_summary(
                *(
                    {s: measure(r, "embed-scale", "collapse_rate", SIGMA) for s, r in m.items()}
                    for m in (ref, ssa)
                )
            ),
            "failure": paired_summary(
                *({s: failure(r, "embed-scale", SIGMA) for s, r in m.items()} for m in (ref, ssa))
            ),
        }
    softmax = [r for r in by_arm.get(REFERENCE, []) if "intervention" in r]
    if softmax:
        out["heads"] = heads_association(softmax)
        out["temperature"] = temperature(softmax)
    return out


def analyse(records: list[dict]) -> dict[str, Any]:
    tasks = {
        t: analyse_task([r for r in records if r["task"] == t]) for t in sorted({r["task"] for r in records})
    }
    primary = (
        tasks.get(PRIMARY["task"], {})
        .get("associations", {})
        .get(f"{PRIMARY['shift']}@{level_key(PRIMARY['level'])}/{PRIMARY['measure']}")
    )
    return {"primary": {**PRIMARY, **(primary or {})}, "tasks": tasks}


def _ci(s: dict[str, Any], digits: int = 3) -> str:
    if s.get("mean_difference") is None:
        return "n/a"
    if s.get("ci_low") is None:
        return f"{s['mean_difference']:+.{digits}f}"
    return f"{s['mean_difference']:+.{digits}f} [{s['ci_low']:+.{digits}f}, {s['ci_high']:+.{digits}f}]"


def tables(summary: dict[str, Any]) -> str:
    out = [
        "# Mechanism, Part B: tables",
        "",
        "Generated by `python studies/mechanism/icl.py` (docs/results/mechanism.md). Spearman ρ across "
        "models within each level, 95 % bootstrap over seeds; failure = error at the level − the "
        "model's baseline error.",
        "",
    ]
    p = summary["primary"]
    out += [
        f"**Primary endpoint** ({p['task']}, σ = {p['level']:g}, collapse rate vs failure, both arms): "
        f"ρ = {interval(p)} over {p.get('models', 0)} models.",
        "",
    ]
    for task, t in summary["tasks"].items():
        out += [
            f"## {task} ({t['models']} models)",
            "",
            "In-distribution (baseline) error, min / mean / max: "
            + "; ".join(f"{a} {v[0]:.3f} / {v[1]:.3f} / {v[2]:.3f}" for a, v in t["baseline_error"].items()),
            "",
            "| reach (top level) | reached | not | not measured | share of the shift that arrived |",
            "|---|---:|---:|---:|---|",
        ]
        for name, r in t["reach"].items():
            share = (
                "–"
                if r["share_top_level"] is None
                else f"{r['share_top_level'][0]:.3f}–{r['share_top_level'][1]:.3f}"
            )
            out.append(f"| {name} | {r['reached']} | {r['not_reached']} | {r['not_measured']} | {share} |")
        out += [
            "",
            "| shift @ level | collapse (all) | max weight | entropy | Δ collapse | "
            + " | ".join(f"collapse ({a})" for a in t["baseline_error"])
            + " |",
            "|---|---|---|---|---|" + "---|" * len(t["baseline_error"]),
        ]
        a = t["associations"]
        for name in [k.split("/")[0] for k in a if k.endswith("/collapse_rate") and "@" in k]:
            cells = [
                interval(a[f"{name}/{m}"])
                for m in ("collapse_rate", "max_weight", "entropy", "delta_collapse")
            ]
            cells += [interval(a.get(f"{name}/collapse_rate/{arm}", {})) for arm in t["baseline_error"]]
            shift, level = name.split("@")
            out.append(f"| {SHIFT_NAMES[shift]} {level} | " + " | ".join(cells) + " |")
        out += [
            "",
            "Partial ρ pooled over levels (collapse rate vs failure, the level partialled out): "
            + "; ".join(f"{s} {interval(a[f'{s}/partial/collapse_rate'])}" for s in SHIFTS),
            "",
        ]
        if "ssa_vs_softmax" in t:
            s = t["ssa_vs_softmax"]
            out += [
                f"SSA − softmax at σ = {SIGMA:g}, paired by seed: Δ collapse {_ci(s['collapse'])}; "
                f"Δ failure {_ci(s['failure'])} (SSA higher on {s['failure']['b_higher']} of "
                f"{len(s['failure']['seeds'])} seeds).",
                "",
            ]
        if "heads" in t:
            h = t["heads"]
            out += [
                f"Across heads (softmax models): ρ(collapse rise σ 1 → {SIGMA:g}, the head's softening "
                f"effect) mean over seeds {interval(h)}.",
                "",
                "| T on the 4 most-rising heads | collapse at σ = 8 "
                "| Δ error(σ=8) − Δ error(σ=1) [95 % CI] | seeds lower / higher |",
                "|---:|---|---|---|",
            ]
            for temp, row in t["temperature"].items():
                d = row["did"]
                out.append(
                    f"| {temp} | {row['collapse_before']:.3f} → {row['collapse_after']:.3f} | {_ci(d)} "
                    f"| {d['b_lower']} / {d['b_higher']} |"
                )
            out.append("")
        v = t["verdicts"]
        out += [
            f"Diagnose's verdict at σ ≤ {SIGMA:g} against failing at σ = {SIGMA:g} (≥ {FAILED:g}): "
            + "; ".join(f"{k.replace('_', ' ')} {len(m)}" for k, m in v.items()),
            "",
        ]
    return "\n".join(out) + "\n"


SECOND = (
    4.0  # the figure's second row: below the error ceiling that σ = 8 reaches on the classification tasks
)


def figure(records: list[dict], summary: dict[str, Any], path: Path) -> None:
    """Per task, collapse against the failure at σ = 8 (top) and at σ = SECOND (bottom), one colour
    per arm. Last column: the temperature intervention's difference in differences per T (top), and
    each softmax head's collapse rise against its own softening effect (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(summary["tasks"])
    fig, axes = plt.subplots(2, len(tasks) + 1, figsize=(4.2 * (len(tasks) + 1), 7.6), squeeze=False)
    colours = {REFERENCE: "tab:blue", SSA: "tab:orange"}
    for row, level in enumerate((SIGMA, SECOND)):
        for ax, task in zip(axes[row], tasks):
            for arm, colour in colours.items():
                mine = [r for r in records if r["task"] == task and r["arm"] == arm]
                xs = [measure(r, "embed-scale", "collapse_rate", level) for r in mine]
                ax.scatter(
                    xs, [failure(r, "embed-scale", level) for r in mine], s=16, color=colour, label=arm
                )
            rho = summary["tasks"][task]["associations"][f"embed-scale@{level_key(level)}/collapse_rate"]
            ax.set_title(f"{task}, σ = {level:g}: ρ = {interval(rho)}", size=9)
            ax.set_xlabel(f"collapse rate at σ = {level:g} (rows with max weight >= 0.9)", size=8)
            ax.set_ylabel(f"failure at σ = {level:g} (error − baseline)", size=8)
            ax.axhline(FAILED, color="grey", lw=0.6, ls=":")
    axes[0][0].legend(fontsize=7)
    ax = axes[0][-1]
    for index, task in enumerate(tasks):
        temp = summary["tasks"][task].get("temperature", {})
        rows = list(temp.values())
        xs = [math.log2(float(t)) + 0.08 * (index - 1) for t in temp]
        ys = [r["did"]["mean_difference"] for r in rows]
        low = [y - (r["did"]["ci_low"] if r["did"]["ci_low"] is not None else y) for y, r in zip(ys, rows)]
        high = [(r["did"]["ci_high"] if r["did"]["ci_high"] is not None else y) - y for y, r in zip(ys, rows)]
        ax.errorbar(xs, ys, yerr=[low, high], fmt="o", capsize=3, label=task)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xlabel("log2 T on the 4 heads whose collapse rises most (softmax models)", size=8)
    ax.set_ylabel("Δ error(σ=8) − Δ error(σ=1), mean [95 % CI]", size=8)
    ax.set_title("softening the collapsing heads at a fixed shift", size=9)
    ax.legend(fontsize=7)
    ax = axes[1][-1]
    for task in tasks:
        heads = [
            h
            for r in records
            if r["task"] == task and "intervention" in r
            for h in r["intervention"]["per_head"]
        ]
        ax.scatter([h["rise"] for h in heads], [h["did"] for h in heads], s=8, alpha=0.6, label=task)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xlabel(f"a head's collapse rise, σ 1 → {SIGMA:g}", size=8)
    ax.set_ylabel(f"its softening effect (T = 8): Δ error(σ={SIGMA:g}) − Δ error(σ=1)", size=8)
    ax.set_yscale("symlog", linthresh=0.05)  # a few heads' effects are 100x the rest's
    ticks = [-1.0, -0.1, 0.0, 0.1, 1.0]
    ax.set_yticks(ticks, [f"{v:g}" for v in ticks])
    ax.set_title("each softmax head softened alone (symlog)", size=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
