"""Tables of ICL v3 (docs/results/icl.md, v3): paired differences with Holm over each task's family,
per-seed errors, and every run's learned b and n with convergence.

    python studies/icl-v3/tables.py runs/icl-v3-quant runs/icl-v3-linear --out docs/results/icl-v3

Reads each sweep's results.json (``ssacli icl sweep``) and each run's ssacli.json (its training
record: the learned scorer per layer and whether it converged, |Δ| < 1 % over the last 10 % of
steps); writes ``tables.md`` and ``learned.json``. The primary endpoint (named in
plan-quant.json before the runs) is reported first and outside the family: every, error at σ = 8,
ssa-gpt2 − softmax; every other paired row of a task is one family, Holm-adjusted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ssacli.stats import holm, verdict

PRIMARY = {"task": "every", "label": "ssa-gpt2", "sigma": 8, "length": 41, "outlier": None, "metric": "error"}


def cell_name(row: dict) -> str:
    metric = "" if row["metric"] == "error" else f" ({row['metric']})"
    if row["outlier"] is not None:
        return f"outlier {row['outlier']:g}{metric}"
    if row.get("coef_sigma", 1) not in (None, 1, 1.0):
        return f"coef σ={row['coef_sigma']:g}{metric}"
    if row["length"] != 41:
        return f"length {row['length']}{metric}"
    return f"σ={row['sigma']:g}{metric}"


def is_primary(row: dict) -> bool:
    return all(row.get(k) == v for k, v in PRIMARY.items())


def fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


def paired_table(rows: list[dict]) -> list[str]:
    family = [r for r in rows if not is_primary(r)]
    adjusted = holm([r["permutation_p"] for r in family])
    holm_of = {id(r): p for r, p in zip(family, adjusted)}
    lines = ["| arm − softmax | cell | mean [95 % CI] | arm lower / higher | sign-flip p | t-test p | Holm p "
             "| verdict |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (not is_primary(r), r["label"])):
        p_holm = None if is_primary(r) else holm_of[id(r)]
        decide = r["permutation_p"] if is_primary(r) else p_holm
        name = cell_name(r) + (" **(primary)**" if is_primary(r) else "")
        perm = "–" if r["permutation_p"] is None else f"{r['permutation_p']:.3g}"
        t = "–" if r["t_test_p"] is None else f"{r['t_test_p']:.3g}"
        holm_text = "–" if p_holm is None else f"{p_holm:.3g}"
        lines.append(
            f"| {r['label']} | {name} | {fmt(r['mean_difference'])} "
            f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}] | "
            f"{r['b_lower']} / {r['b_higher']} | {perm} | {t} | {holm_text} | "
            f"{verdict(r, lower_is_better=not r['higher_is_better'], p=decide)} |"
        )
    return lines


def per_seed(results: dict, task: str) -> list[str]:
    runs = [r for r in results["runs"] if r["task"] == task]
    metric = "normalized_error" if task == "linear" else "error"
    plain = [c for r in runs for c in r["cells"] if c["outlier"] is None and c["length"] == 41]
    sigmas = sorted({c["sigma"] for c in plain if c.get("coef_sigma", 1) == 1})
    lines = [
        "| arm | seed | " + " | ".join(f"σ={s:g}" for s in sigmas) + " |",
        "|---|---|" + "---|" * len(sigmas),
    ]
    for r in sorted(runs, key=lambda r: (r["label"] != "softmax", r["label"], r["seed"])):
        by = {c["sigma"]: c[metric] for c in r["cells"] if c["outlier"] is None and c["length"] == 41
              and c.get("coef_sigma", 1) == 1}  # fmt: skip
        lines.append(f"| {r['label']} | {r['seed']} | " + " | ".join(f"{by[s]:.3f}" for s in sigmas) + " |")
    return lines


def learned(sweep: Path) -> list[dict]:
    out = []
    for meta in sorted(sweep.glob("runs/*/ssacli.json")):
        training = json.loads(meta.read_text()).get("training", {})
        scorer = training.get("scorer") or {}
        if not scorer.get("learned"):
            continue
        out.append({"run": meta.parent.name, "values": scorer.get("values"),
                    "converged": scorer.get("converged"),
                    "moved_in_window": scorer.get("moved_in_window")})  # fmt: skip
    return out


def learned_table(rows: list[dict]) -> list[str]:
    lines = ["| run | b per layer | n per layer | converged (b, n) |", "|---|---|---|---|"]
    for r in rows:
        values, conv = r["values"], r["converged"] or {}
        b = ", ".join(f"{x:.3f}" for x in values.get("b", []))
        n = ", ".join(f"{x:.3f}" for x in values.get("n", []))
        flags = " / ".join(
            f"{k}: {sum(bool(c) for c in v)}/{len(v)}" for k, v in conv.items() if v is not None
        )
        lines.append(f"| {r['run']} | {b} | {n} | {flags or '–'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sweeps", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lines = ["# ICL v3: tables", "", f"Regenerate: `python studies/icl-v3/tables.py {' '.join(args.sweeps)} "
             f"--out {args.out}`.", ""]  # fmt: skip
    every_learned = {}
    for sweep in map(Path, args.sweeps):
        results_file = sweep / "results.json"
        if not results_file.is_file():
            continue
        results = json.loads(results_file.read_text())
        plan = results["plan"]
        for task in plan["tasks"]:
            rows = [r for r in results["paired"] if r["task"] == task]
            lines += [f"## {task}: {plan['steps']} steps, {len(results['runs']) // len(plan['tasks'])} runs, "
                      f"wall {results['wall_seconds'] / 60:.1f} min ({results['device']})", "",
                      "### Paired differences (8 seeds)", "", *paired_table(rows), "",
                      f"### Per seed ({'MSE/Var(y)' if task == 'linear' else 'error rate'}, trained length)",
                      "",
                      *per_seed(results, task), ""]  # fmt: skip
        rows = learned(sweep)
        every_learned[str(sweep)] = rows
        lines += [f"### Learned scorer per run ({sweep.name})", "", *learned_table(rows), ""]
    out = Path(args.out)
    (out / "tables.md").write_text("\n".join(lines))
    (out / "learned.json").write_text(json.dumps(every_learned, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
