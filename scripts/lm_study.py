"""The language-model study (issue 16, part 2): tiny decoders trained from scratch with `ssacli train`,
paired by seed across scorers, evaluated and aggregated with the paired statistics of ssacli.stats.

    python scripts/lm_study.py --plan docs/results/lm-plan.json --out runs/lm-study --jobs 2
    python scripts/lm_study.py --plan docs/results/lm-plan.json --out runs/lm-study --report docs/results/lm

Per arm (scorer) and seed, in OUT/runs/{label}-s{seed}/:

1. train: `ssacli train --size OUT/model-config.json --data PLAN.data --scorer SPEC --seed SEED …`
   (the plan's `model` is written as the config; same steps, batch, tokens and tokenizer for every
   arm: the tokenizer depends only on the data and the vocabulary size). Resumable: a finished run
   (its training record at the plan's steps) is skipped, an interrupted one continues (--resume).
2. evaluate (eval.json): perplexity of the in-distribution text (`id_text`) and the out-of-
   distribution text (`ood_text`) at the training context and at each multiple in `contexts`
   (windows longer than the trained positions: RoPE models run them, that is the length-shift
   test), the BLiMP paradigms in `blimp` (accuracy per paradigm and their mean), and `ssacli
   diagnose` of the model (diagnose.json; its collapse summary per probe). Skipped when eval.json is
   there.
3. aggregate (results.json): every metric per run, mean ± std per arm, and each arm against the
   plan's `reference` paired by seed (per-seed differences, bootstrap 95 % CI, sign-flip
   permutation test, paired t-test, sign test; ssacli.stats).

`--report DIR` also writes DIR/tables.md and the figures (after the runs; finished ones are skipped);
`--report DIR --from-results FILE` renders a results.json already written, without running
anything (its pairs are recomputed from its runs, so files written before a test existed render
with it).
Paths in the plan are relative to the current directory (the repository root for the committed
plan, which reads ../shared/data).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ssacli.stats import ALPHA, holm, paired_summary, verdict

LOWER_IS_BETTER_PREFIXES = ("ppl", "nll", "collapse")


def load_plan(path: Path) -> dict[str, Any]:
    plan = json.loads(path.read_text())
    labels = [a["label"] for a in plan["arms"]]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"arm labels must be unique: {labels}")
    plan.setdefault("reference", labels[0])
    plan.setdefault("contexts", [1, 2, 4])
    plan.setdefault("max_tokens", 32768)
    plan.setdefault("blimp_limit", None)
    plan.setdefault("diagnose", True)
    plan.setdefault("diagnose_args", ["--samples", "4"])
    return plan


def runs(plan: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    return [(arm, seed) for seed in range(plan["seeds"]) for arm in plan["arms"]]


def run_name(label: str, seed: int) -> str:
    return f"{label}-s{seed}"


def ssacli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ssacli", *args]


def child_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def finished_steps(folder: Path) -> int | None:
    try:
        meta = json.loads((folder / "ssacli.json").read_text())
    except (OSError, ValueError):
        return None
    return (meta.get("training") or {}).get("step")


def train_run(plan, arm, seed, out: Path, device: str, threads: int) -> float:
    folder = out / "runs" / run_name(arm["label"], seed)
    if finished_steps(folder) == plan["steps"]:
        return 0.0
    args = [
        "train", "--data", plan["data"], "--out", str(folder), "--size", str(out / "model-config.json"),
        "--scorer", arm["spec"], "--steps", str(plan["steps"]), "--lr", str(plan["lr"]),
        "--batch-size", str(plan["batch_size"]), "--seq-len", str(plan["seq_len"]),
        "--vocab-size", str(plan["vocab_size"]), "--seed", str(seed), "--device", device,
        "--checkpoint-every", str(max(1, plan["steps"] // 4)), "--quiet",
    ]  # fmt: skip
    if plan.get("attention"):  # eager is faster than the blocked SSA kernel at 128 tokens on CPU
        args += ["--attention", plan["attention"]]
    if plan.get("warmup") is not None:
        args += ["--warmup", str(plan["warmup"])]
    if folder.exists():
        args.append("--resume")
    began = time.perf_counter()
    subprocess.run(ssacli_cmd(*args), check=True, env=child_env(threads))
    return time.perf_counter() - began


def eval_run(plan_path: Path, out: Path, name: str, device: str, threads: int) -> None:
    """In a child process: evaluating in threads of this one would share one interpreter."""
    cmd = [sys.executable, __file__, "--plan", str(plan_path), "--out", str(out), "--eval-run", name,
           "--device", device]  # fmt: skip
    subprocess.run(cmd, check=True, env=child_env(threads))


def evaluate_folder(plan: dict[str, Any], folder: Path, device: str) -> dict[str, Any]:
    """eval.json of one trained run (called in the child process)."""
    import torch

    import ssacli
    from ssacli.quality.measures import language_model_loss, minimal_pairs

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    began = time.perf_counter()
    loaded = ssacli.load_model(str(folder), device=device)
    trained = plan["seq_len"]
    # max_positions=None lets windows run past the trained context (length extrapolation)
    free = replace(loaded, max_positions=None)
    result: dict[str, Any] = {"perplexity": {}, "trained_context": trained}
    texts = {"id": plan["id_text"], "ood": plan["ood_text"]}
    for key, path in texts.items():
        text = Path(path).read_text(encoding="utf-8")
        for factor in plan["contexts"]:
            loss = language_model_loss(free, text, seq_len=factor * trained, max_tokens=plan["max_tokens"])
            result["perplexity"][f"{key}@{factor}x"] = {
                "nll": loss["nll"], "perplexity": loss["perplexity"], "tokens": loss["tokens"],
                "seq_len": loss["seq_len"],
            }  # fmt: skip
    if plan.get("blimp"):
        pairs = minimal_pairs(loaded, plan["blimp"], limit=plan["blimp_limit"])
        result["blimp"] = {
            "files": {k: v["accuracy"] for k, v in pairs["files"].items()},
            "mean_file_accuracy": pairs["mean_file_accuracy"],
            "pairs": pairs["pairs"],
        }
    if plan.get("diagnose"):
        target = folder / "diagnose.json"
        cmd = ssacli_cmd("diagnose", str(folder), "--json", str(target), "--device", device,
                         *plan["diagnose_args"])  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        result["diagnose"] = (
            diagnose_summary(json.loads(target.read_text()))
            if done.returncode == 0 and target.is_file()
            else {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
        )
    result["eval_seconds"] = round(time.perf_counter() - began, 1)
    return result


def diagnose_summary(data: dict[str, Any]) -> dict[str, Any]:
    """Per probe: its collapse point (the first level where the model counts as collapsed, None when
    it never does) and the whole model's collapse rate (share of attention rows whose largest weight
    is >= tau) at the probe's last, harshest level."""
    summary = {}
    for probe in data.get("probes", []):
        if probe.get("skipped"):
            continue
        digest = probe.get("summary") or {}
        row: dict[str, Any] = {"levels": probe.get("levels"), "collapse_point": digest.get("collapse_point")}
        rates = (digest.get("model") or {}).get("collapse_rate")
        if not rates:  # older schema: per-layer, per-head rates of each level
            rate = (probe.get("metrics") or {}).get("collapse_rate") or [[]]
            flat = [v for v in _flatten(rate[-1]) if isinstance(v, int | float) and math.isfinite(v)]
            rates = [sum(flat) / len(flat)] if flat else None
        row["collapse_rate_last"] = rates[-1] if rates else None
        summary[probe.get("name", "?")] = row
    return summary


def _flatten(value):
    if isinstance(value, list):
        for item in value:
            yield from _flatten(item)
    else:
        yield value


def run_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    """The flat metrics of one eval.json that the study compares (names ≙ table rows)."""
    values = {}
    for key, row in evaluation["perplexity"].items():
        if row["perplexity"] is not None:
            values[f"ppl {key}"] = row["perplexity"]
    blimp = evaluation.get("blimp")
    if blimp:
        values["blimp mean"] = blimp["mean_file_accuracy"]
        for name, accuracy in blimp["files"].items():
            values[f"blimp {name}"] = accuracy
    for probe, row in (evaluation.get("diagnose") or {}).items():
        if isinstance(row, dict) and isinstance(row.get("collapse_rate_last"), int | float):
            values[f"collapse {probe}"] = row["collapse_rate_last"]
    return values


def aggregate(plan: dict[str, Any], out: Path, wall_seconds: float | None) -> dict[str, Any]:
    per_run = []
    for arm, seed in runs(plan):
        folder = out / "runs" / run_name(arm["label"], seed)
        evaluation = json.loads((folder / "eval.json").read_text())
        training = json.loads((folder / "ssacli.json").read_text()).get("training", {})
        per_run.append({"label": arm["label"], "spec": arm["spec"], "seed": seed,
                        "metrics": run_metrics(evaluation), "train_seconds": training.get("seconds"),
                        "eval_seconds": evaluation["eval_seconds"]})  # fmt: skip
    summary_rows, paired_rows = summarize(plan, per_run)
    results = {"plan": plan, "wall_seconds": wall_seconds, "runs": per_run, "aggregate": summary_rows,
               "paired": paired_rows}  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def summarize(plan: dict[str, Any], per_run: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """Mean ± std per metric and arm, and every arm against the plan's reference paired by seed."""
    by_metric: dict[str, dict[str, dict[int, float]]] = {}
    for run in per_run:
        for name, value in run["metrics"].items():
            by_metric.setdefault(name, {}).setdefault(run["label"], {})[run["seed"]] = value
    summary_rows, paired_rows = [], []
    reference = plan["reference"]
    for name, arms in by_metric.items():
        lower = name.startswith(LOWER_IS_BETTER_PREFIXES)
        for label, values in arms.items():
            v = list(values.values())
            mean = sum(v) / len(v)
            std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
            summary_rows.append({"metric": name, "label": label, "mean": mean, "std": std, "values": v})
            if label != reference and reference in arms:
                paired = paired_summary(arms[reference], values)
                word = verdict(paired, lower_is_better=lower)
                paired_rows.append({"metric": name, "label": label, "reference": reference,
                                    "lower_is_better": lower, "verdict": word, **paired})  # fmt: skip
    return summary_rows, paired_rows


def run_study(plan_path: Path, out: Path, *, jobs: int, device: str) -> dict[str, Any]:
    plan = load_plan(plan_path)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "model-config.json"
    if not config.is_file():
        config.write_text(json.dumps(plan["model"], indent=1) + "\n")
    threads = 1 if jobs > 1 else max(1, os.cpu_count() or 1)
    began = time.perf_counter()

    def one(item):
        arm, seed = item
        name = run_name(arm["label"], seed)
        seconds = train_run(plan, arm, seed, out, device, threads)
        if not (out / "runs" / name / "eval.json").is_file():
            eval_run(plan_path, out, name, device, threads)
        print(f"{name}: done (trained {seconds:.0f} s this call)", flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, runs(plan)))
    return aggregate(plan, out, round(time.perf_counter() - began, 1))


# ---- report ------------------------------------------------------------------------------------------


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


def report(results: dict[str, Any], folder: Path) -> Path:
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
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tables.md").write_text("\n".join(lines) + "\n")
    plot_context(results, folder / "lm-context.png")
    plot_paired(results, folder / "lm-paired.png")
    return folder / "tables.md"


def plot_paired(results: dict[str, Any], path: Path) -> None:
    """Every paired difference (arm − reference): a dot per seed and the mean with its bootstrap 95 %
    CI, one panel per metric family (perplexities, BLiMP, diagnose), one colour per arm."""
    from matplotlib.figure import Figure

    from ssacli.icl.plots import save_figure

    groups = list(dict.fromkeys(r["metric"].split()[0] for r in results["paired"]))
    fig = Figure(
        figsize=(
            5 * len(groups),
            0.5
            + 0.45 * max(sum(1 for r in results["paired"] if r["metric"].split()[0] == g) for g in groups),
        )
    )
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    arms = list(dict.fromkeys(r["label"] for r in results["paired"]))
    for ax, group in zip(axes, groups):
        rows = [r for r in results["paired"] if r["metric"].split()[0] == group]
        names = list(dict.fromkeys(r["metric"] for r in rows))
        for r in rows:
            k = arms.index(r["label"])
            y = names.index(r["metric"]) + (k - (len(arms) - 1) / 2) * 0.25
            color = f"C{k}"
            ax.scatter(r["differences"], [y] * len(r["differences"]), s=10, color=color, alpha=0.5)
            if r["ci_low"] is not None:
                ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=color, lw=2)
            ax.scatter(
                [r["mean_difference"]],
                [y],
                marker="D",
                s=25,
                color=color,
                label=f"{r['label']} − {r['reference']}" if r["metric"] == names[0] else None,
            )
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{group}: paired difference (dots: seeds; bar: 95 % CI)")
        ax.grid(alpha=0.3, axis="x")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


def plot_context(results: dict[str, Any], path: Path) -> None:
    """Perplexity against the evaluation context (× the trained one), ID and OOD: a thin line per
    seed, a thick one for the mean, one colour per arm."""
    from matplotlib.figure import Figure

    from ssacli.icl.plots import save_figure

    plan = results["plan"]
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    for ax, key in zip(axes, ("id", "ood")):
        for arm in plan["arms"]:
            mine = [r for r in results["runs"] if r["label"] == arm["label"]]
            xs = plan["contexts"]
            series = [[r["metrics"].get(f"ppl {key}@{f}x", float("nan")) for f in xs] for r in mine]
            mean = [sum(col) / len(col) for col in zip(*series)]
            line = ax.plot(xs, mean, marker="o", lw=2, label=arm["label"])[0]
            for s in series:
                ax.plot(xs, s, color=line.get_color(), lw=0.6, alpha=0.4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation context (× trained)")
        ax.set_ylabel(f"perplexity ({key})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--report", type=Path, help="write tables.md and figures here from results.json")
    parser.add_argument(
        "--from-results", type=Path, help="with --report: render this results.json, run nothing"
    )
    parser.add_argument("--eval-run", help=argparse.SUPPRESS)  # internal: evaluate one run
    args = parser.parse_args(argv)
    if not args.from_results and (args.plan is None or args.out is None):
        raise SystemExit("--plan and --out are needed (unless --report DIR --from-results FILE)")
    if args.eval_run:
        plan = load_plan(args.plan)
        folder = args.out / "runs" / args.eval_run
        result = evaluate_folder(plan, folder, args.device)
        (folder / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
        return
    if args.from_results:
        if not args.report:
            raise SystemExit("--from-results needs --report DIR")
        print(f"wrote {report(json.loads(args.from_results.read_text()), args.report)}")
        return
    results = run_study(args.plan, args.out, jobs=args.jobs, device=args.device)  # finished runs: skipped
    if args.report:
        print(f"wrote {report(results, args.report)}")


if __name__ == "__main__":
    main()
