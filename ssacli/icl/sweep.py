"""A grid of ICL runs (tasks × scorers × seeds): train, evaluate, aggregate, plot.

A sweep is described by a plan (JSON, or built from command-line flags). Every run lives in its
own checkpoint folder under ``OUT/runs/``; a finished run is skipped and an interrupted one resumes,
so a sweep can be stopped and started again. Results go to ``OUT/results.json`` and figures to
``OUT/figures/``.

Runs of the same seed share initialization, training data and evaluation prompts across arms
(scorers), so results.json holds, besides the per-seed runs and the mean ± std ``aggregate``, a
``paired`` list: for every task, backbone, cell, metric and arm, the per-seed differences against
the plan's ``reference`` arm with a bootstrap CI and a sign test (:mod:`ssacli.stats`).

Metrics per cell (:func:`cell_metrics`): ``error`` (the headline: the prompt error rate, or
MSE/Var(y) for ``linear``), and where they apply ``after_outlier``, ``at_outlier``, ``rank_corr``
(higher is better) and ``sign_error`` (see :mod:`ssacli.icl.evaluate`).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..defaults import ICL_LENGTHS, ICL_POINTS, SCORER_LR
from ..errors import InputError, UsageError
from ..files import check_writable_folder, write_json
from ..models.checkpoint import ICL_FORMAT, read_meta
from ..models.icl import check_arch, load_icl
from ..models.icl_task import check_task
from ..stats import paired_summary
from .evaluate import cells_to_json, evaluate
from .train import TrainConfig, train


@dataclass
class ScorerEntry:
    label: str  # short name used in file names, tables and legends
    spec: str
    seeds: int = 3


@dataclass
class SweepPlan:
    tasks: list[str]
    scorers: list[ScorerEntry]
    steps: int = 3000
    lr: float = 1e-4
    scorer_lr: float = SCORER_LR  # the scorer's own optimizer group (ssacli.models.optim)
    batch_size: int = 64
    preset: str = "cpu"
    points_start: int = 11
    points_end: int = ICL_POINTS
    sigmas: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    lengths: list[int] = field(default_factory=lambda: [ICL_POINTS // 2 + 1, *ICL_LENGTHS])
    outliers: list[float] = field(default_factory=lambda: [10, 100, 1000])
    outlier_position: int = 3
    prompts: int = 500
    archs: list[str] = field(default_factory=lambda: ["gpt2"])  # backbones; every arm runs on each
    coef_sigmas: list[float] = field(default_factory=list)  # linear: σ of a, b (at σ_x = 1)
    reference: str | None = None  # arm the others are paired against (default: the first)

    @classmethod
    def from_specs(
        cls, tasks: list[str], specs: list[str], *, seeds: int = ScorerEntry.seeds, **settings: Any
    ) -> SweepPlan:
        """A plan of ``tasks`` × ``specs`` × ``seeds``, each arm labelled by :func:`scorer_label`;
        ``settings`` are the other fields (steps, lr, prompts, …)."""
        entries = [ScorerEntry(label=scorer_label(spec), spec=spec, seeds=seeds) for spec in specs]
        return cls(tasks=list(tasks), scorers=entries, **settings)

    @classmethod
    def from_json(cls, path: str | Path) -> SweepPlan:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise InputError(f"cannot read sweep plan {path}: {err}") from None
        try:
            data["scorers"] = [ScorerEntry(**s) for s in data["scorers"]]
            plan = cls(**{k: v for k, v in data.items() if not k.startswith("_")})
        except (KeyError, TypeError) as err:
            raise InputError(
                f"sweep plan {path} is malformed ({err}); see docs/results/icl-plan.json"
            ) from None
        plan.validate()
        return plan

    def validate(self) -> None:
        for task in self.tasks:
            check_task(task)
        for arch in self.archs:
            check_arch(arch)
        labels = [s.label for s in self.scorers]
        if len(set(labels)) != len(labels):
            raise UsageError(f"scorer labels must be unique, got {labels}")
        if self.reference is not None and self.reference not in labels:
            raise UsageError(f"reference '{self.reference}' is not one of the scorer labels {labels}")
        from ..scorers import make_scorer

        for entry in self.scorers:
            make_scorer(entry.spec)

    def runs(self) -> list[tuple[str, str, ScorerEntry, int]]:
        """(task, arch, arm, seed) of every run, seeds innermost."""
        return [
            (t, a, s, seed)
            for t in self.tasks
            for a in self.archs
            for s in self.scorers
            for seed in range(s.seeds)
        ]

    @property
    def reference_label(self) -> str:
        return self.reference or self.scorers[0].label


def scorer_label(spec: str) -> str:
    """An arm's label when only its spec is given, safe in file names: ssa:init=paper -> ssa-initpaper."""
    return spec.replace(":", "-").replace(",", "-").replace("=", "")


def run_name(task: str, label: str, seed: int, arch: str = "gpt2") -> str:
    """The run's folder name; gpt2 runs keep the name they had before backbones were an option."""
    return f"{task}-{label}-s{seed}" if arch == "gpt2" else f"{task}-{arch}-{label}-s{seed}"


def _one_run(args: tuple[dict, str, str, dict, int, str, str]) -> dict:
    """Train (or resume, or skip) and evaluate one run; executed in a worker process."""
    plan_dict, task, arch, entry_dict, seed, out, device = args
    plan = SweepPlan(**{**plan_dict, "scorers": []})
    entry = ScorerEntry(**entry_dict)
    folder = Path(out) / "runs" / run_name(task, entry.label, seed, arch)
    config = TrainConfig(
        task=task,
        scorer=entry.spec,
        steps=plan.steps,
        batch_size=plan.batch_size,
        lr=plan.lr,
        scorer_lr=plan.scorer_lr,
        seed=seed,
        preset=plan.preset,
        points_start=plan.points_start,
        points_end=plan.points_end,
        checkpoint_every=max(1, plan.steps // 4),
        arch=arch,
    )
    eval_file = folder / "eval.json"
    meta = read_meta(folder, ICL_FORMAT)
    done = meta is not None and meta.get("training", {}).get("step") == plan.steps
    if done and eval_file.is_file():
        return json.loads(eval_file.read_text())
    model = load_icl(folder, device) if done else train(config, folder, resume=True, device=device)
    began = time.perf_counter()
    # σ at the trained length, length at σ = 1, outliers at the trained length and σ = 1,
    # coefficient σ (linear) at the trained length and σ_x = 1.
    trained = (plan.points_end,)
    other_lengths = tuple(n for n in plan.lengths if n != plan.points_end)
    cells = evaluate(model, sigmas=tuple(plan.sigmas), lengths=trained, prompts=plan.prompts)
    cells += evaluate(model, sigmas=(1.0,), lengths=other_lengths, prompts=plan.prompts)
    outliers = tuple((v, plan.outlier_position) for v in plan.outliers)
    cells += evaluate(model, lengths=trained, outliers=outliers, prompts=plan.prompts)
    if task == "linear":
        for coef in plan.coef_sigmas:
            if coef != 1:
                cells += evaluate(model, lengths=trained, coef_sigma=coef, prompts=plan.prompts)
    result = {
        "task": task,
        "arch": arch,
        "label": entry.label,
        "spec": entry.spec,
        "seed": seed,
        "train_seconds": model.spec.training.get("seconds"),
        "final_loss": model.spec.training["history"][-1][1],
        "eval_seconds": round(time.perf_counter() - began, 1),
        **cells_to_json(model, cells),
    }
    write_json(result, eval_file)
    return result


def _worker_init() -> None:
    torch.set_num_threads(1)  # workers share the cores; one thread each avoids oversubscription


def run_sweep(
    plan: SweepPlan,
    out: str | Path,
    *,
    jobs: int = 1,
    device: str = "cpu",
    on_result: Callable[[dict], None] | None = None,
) -> dict:
    """Run every (task, arch, scorer, seed) of the plan, then aggregate, pair and plot.

    ``device`` (cpu, cuda, auto) is where each run trains and is evaluated; the results do not
    depend on it beyond floating-point noise (the data generators are CPU generators)."""
    plan.validate()
    out = Path(out)
    check_writable_folder(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    plan_dict = {k: v for k, v in asdict(plan).items() if k != "scorers"}
    work = [(plan_dict, t, a, asdict(s), seed, str(out), device) for t, a, s, seed in plan.runs()]
    began = time.perf_counter()
    results = []
    if jobs <= 1:
        for item in work:
            results.append(_one_run(item))
            if on_result:
                on_result(results[-1])
    else:
        with multiprocessing.get_context("spawn").Pool(jobs, initializer=_worker_init) as pool:
            for result in pool.imap_unordered(_one_run, work):
                results.append(result)
                if on_result:
                    on_result(result)
    order = {run_name(t, s.label, seed, a): i for i, (t, a, s, seed) in enumerate(plan.runs())}
    results.sort(key=lambda r: order[run_name(r["task"], r["label"], r["seed"], r.get("arch", "gpt2"))])
    summary = {
        "plan": asdict(plan),
        "wall_seconds": round(time.perf_counter() - began, 1),
        "device": device,
        "torch": torch.__version__,
        "runs": results,
        "aggregate": aggregate(results),
        "paired": paired(results, plan.reference_label),
    }
    write_json(summary, out / "results.json")
    from .plots import plot_sweep

    plot_sweep(summary, out / "figures")
    return summary


HIGHER_IS_BETTER = ("rank_corr",)


def cell_metrics(cell: dict) -> dict[str, float]:
    """The metrics of one evaluated cell (a dict from results.json), by name; absent ones left out.
    ``error`` is the headline: MSE/Var(y) for linear, the prompt error rate otherwise."""
    headline = cell["normalized_error"] if cell.get("normalized_error") is not None else cell["error"]
    values = {"error": headline}
    for name in ("after_outlier", "at_outlier", "rank_corr", "sign_error"):
        if cell.get(name) is not None:
            values[name] = cell[name]
    return values


def cell_key(run: dict, cell: dict) -> tuple:
    """(task, arch, sigma, length, outlier, coef_sigma): what identifies a cell across arms."""
    return (
        run["task"], run.get("arch", "gpt2"), cell["sigma"], cell["length"], cell["outlier"],
        cell.get("coef_sigma", 1.0),
    )  # fmt: skip


def _by_cell(results: list[dict]) -> dict[tuple, dict[str, dict[int, float]]]:
    """{(cell key..., metric): {label: {seed: value}}}"""
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    for run in results:
        for cell in run["cells"]:
            for metric, value in cell_metrics(cell).items():
                key = (*cell_key(run, cell), metric)
                groups.setdefault(key, {}).setdefault(run["label"], {})[run["seed"]] = value
    return groups


def _row(key: tuple) -> dict[str, Any]:
    task, arch, sigma, length, outlier, coef, metric = key
    return {
        "task": task, "arch": arch, "sigma": sigma, "length": length, "outlier": outlier,
        "coef_sigma": coef, "metric": metric,
    }  # fmt: skip


def aggregate(results: list[dict]) -> list[dict[str, Any]]:
    """Mean and (sample) std over seeds of every cell and metric, per task, backbone and arm."""
    rows = []
    for key, arms in _by_cell(results).items():
        for label, by_seed in arms.items():
            values = list(by_seed.values())
            mean = sum(values) / len(values)
            std = (
                math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
                if len(values) > 1
                else None
            )
            rows.append(
                {
                    **_row(key),
                    "label": label,
                    "mean": mean,
                    "std": std,
                    "seeds": len(values),
                    "values": values,
                    "seed_ids": list(by_seed),
                }
            )
    return rows


def paired(results: list[dict], reference: str) -> list[dict[str, Any]]:
    """Every arm against ``reference`` on the seeds both ran, per cell and metric: the differences
    arm - reference with a bootstrap CI and a sign test (:func:`ssacli.stats.paired_summary`).
    ``higher_is_better`` says how to read the sign."""
    rows = []
    for key, arms in _by_cell(results).items():
        if reference not in arms:
            continue
        for label, by_seed in arms.items():
            if label == reference:
                continue
            summary = paired_summary(arms[reference], by_seed)
            if not summary["seeds"]:
                continue
            rows.append(
                {
                    **_row(key),
                    "label": label,
                    "reference": reference,
                    "higher_is_better": key[-1] in HIGHER_IS_BETTER,
                    **summary,
                }
            )
    return rows
