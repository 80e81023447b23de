"""Does saturation predict failure? ICL v3 (issue 22, item 3; docs/results/icl.md).

    python studies/icl-v3/saturation.py runs/icl-v3-quant runs/icl-v3-linear \
        --out docs/results/icl-v3/saturation.json --figure docs/results/icl-v3/saturation.png

For every trained run of the sweeps (``OUT/runs/*/eval.json``, written by ``ssacli icl sweep``) it
runs ``ssacli.diagnose`` under the same shift the task error was measured at: ``embed-scale`` at the
sweep's σ levels (for an ICL model embed-scale multiplies the x values, which is the σ-shift of the
evaluation) and ``outlier`` at its planted values (one x value × v; the captured mass of that token
is diagnose's ``outlier_capture``). Then, per task and arm, it relates the model-mean collapse rate
(rows with max weight >= 0.9) to the task error at the same level:

* **pooled**: Spearman's ρ over every (seed, σ) pair, with a 95 % bootstrap interval that
  resamples seeds (a seed's levels travel together; they are one model);
* **within level**: at each σ, Spearman's ρ across seeds (does the model that collapses more err
  more, at the same shift?), averaged over the σ levels where both vary, bootstrapped the same way;
* for outliers, the same with ``outlier_capture`` against the error after the outlier.

The pooled ρ is confounded by σ itself (both rise with σ); the within-level ρ is the test of the
mechanism. Diagnoses are cached in ``OUT/runs/*/saturation.json`` (rerun: skipped).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import ssacli

SAMPLES = 16  # prompts per probe level (diagnose's ICL inputs: prompts of the model's task)
RESAMPLES = 2000


def diagnose_run(folder: Path, sigmas: list[float], outliers: list[float]) -> dict:
    cache = folder / "saturation.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    probes = [
        f"embed-scale:{','.join(f'{s:g}' for s in sigmas)}",
        f"outlier:1,{','.join(f'{v:g}' for v in outliers)}",
    ]
    result = ssacli.diagnose(str(folder), probes, samples=SAMPLES, device="cpu")
    out = {}
    for probe in result.probes:
        metrics = ("collapse_rate", "max_weight", "entropy")
        out[probe.name] = {
            "levels": list(probe.levels),
            "reached": probe.reached(),  # False: a norm divided the shift out before attention
            "absorbed_by": probe.absorbed_by(),
            **{m: [float(x) for x in probe.model_mean(m)] for m in metrics},
        }
        if probe.name == "outlier":
            out[probe.name]["outlier_capture"] = [float(x) for x in probe.model_mean("outlier_capture")]
    cache.write_text(json.dumps(out, indent=1))
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    return float(np.corrcoef(rx, ry)[0, 1])


def within_level(points: dict[int, list[tuple[float, float, float]]]) -> float | None:
    """Mean over levels of the across-seed Spearman ρ (levels where both quantities vary)."""
    levels = sorted({lv for rows in points.values() for lv, _, _ in rows})
    values = []
    for level in levels:
        pairs = [(s, e) for rows in points.values() for lv, s, e in rows if lv == level]
        rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
        if rho is not None:
            values.append(rho)
    return float(np.mean(values)) if values else None


def pooled(points: dict[int, list[tuple[float, float, float]]]) -> float | None:
    rows = [r for rs in points.values() for r in rs]
    return spearman([r[1] for r in rows], [r[2] for r in rows])


def with_interval(points: dict[int, list], statistic) -> dict:
    seeds = sorted(points)
    value = statistic(points)
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(RESAMPLES):
        pick = rng.choice(seeds, size=len(seeds), replace=True)
        resampled = {i: points[s] for i, s in enumerate(pick)}
        v = statistic(resampled)
        if v is not None:
            draws.append(v)
    low, high = np.percentile(draws, [2.5, 97.5]).tolist() if draws else (None, None)
    return {"rho": value, "ci_low": low, "ci_high": high, "seeds": len(seeds)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sweeps", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--figure")
    args = parser.parse_args()
    groups: dict[tuple[str, str], dict[str, dict[int, list]]] = {}
    for sweep in args.sweeps:
        for eval_file in sorted(Path(sweep).glob("runs/*/eval.json")):
            run = json.loads(eval_file.read_text())
            cells = run["cells"]
            sigmas = sorted({c["sigma"] for c in cells if c["outlier"] is None and c["length"] == 41})
            outliers = sorted({c["outlier"] for c in cells if c["outlier"] is not None})
            sat = diagnose_run(eval_file.parent, sigmas, outliers)
            error_key = "normalized_error" if run["task"] == "linear" else "error"
            by_sigma = {c["sigma"]: c[error_key] for c in cells if c["outlier"] is None and c["length"] == 41
                        and c.get("coef_sigma", 1.0) == 1.0}  # fmt: skip
            probe = sat["embed-scale"]
            shift = [(lv, col, by_sigma[lv]) for lv, col in zip(probe["levels"], probe["collapse_rate"])
                     if lv in by_sigma]  # fmt: skip
            after = {c["outlier"]: c["after_outlier"] for c in cells if c["outlier"] is not None}
            out_probe = sat["outlier"]
            capture = zip(out_probe["levels"], out_probe["outlier_capture"])
            planted = [(lv, cap, after[lv]) for lv, cap in capture if lv in after and after[lv] is not None]
            empty = {"sigma": {}, "outlier": {}, "reached": {}}
            group = groups.setdefault((run["task"], run["label"]), empty)
            group["reached"][run["seed"]] = {k: (v["reached"], v["absorbed_by"]) for k, v in sat.items()}
            group["sigma"][run["seed"]] = shift
            group["outlier"][run["seed"]] = planted
    summary = []
    for (task, label), group in sorted(groups.items()):
        row = {"task": task, "arm": label, "seeds": len(group["sigma"])}
        row["sigma_pooled"] = with_interval(group["sigma"], pooled)
        row["sigma_within_level"] = with_interval(group["sigma"], within_level)
        row["outlier_pooled"] = with_interval(group["outlier"], pooled)
        row["outlier_within_level"] = with_interval(group["outlier"], within_level)
        row["points"] = {"sigma": group["sigma"], "outlier": group["outlier"]}
        row["reached"] = group["reached"]
        summary.append(row)
        print(task, label, {k: (None if row[k]["rho"] is None else round(row[k]["rho"], 3),
                                row[k]["ci_low"] and round(row[k]["ci_low"], 3),
                                row[k]["ci_high"] and round(row[k]["ci_high"], 3))
                            for k in row if k.endswith(("pooled", "level"))})  # fmt: skip
    Path(args.out).write_text(json.dumps(summary, indent=1))
    if args.figure:
        figure(summary, Path(args.figure))


def figure(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in summary})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, row in enumerate(r for r in summary if r["task"] == task):
            xs = [p[1] for rows in row["points"]["sigma"].values() for p in rows]
            ys = [p[2] for rows in row["points"]["sigma"].values() for p in rows]
            rho = row["sigma_within_level"]["rho"]
            label = f"{row['arm']} (within-σ ρ {rho:.2f})" if rho is not None else row["arm"]
            ax.scatter(xs, ys, s=10, alpha=0.7, color=f"C{i}", label=label)
        ax.set_xlabel("collapse rate under embed-scale σ (diagnose)", fontsize=8)
        ax.set_ylabel("MSE/Var(y)" if task == "linear" else "error rate at the same σ", fontsize=8)
        ax.set_title(f"{task}: one point per seed and σ", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
