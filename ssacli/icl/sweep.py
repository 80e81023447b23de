"""A grid of ICL runs (tasks × scorers × seeds): train, evaluate, aggregate, plot.

A sweep is described by a plan (JSON, or built from command-line flags). Every run lives in its
own checkpoint folder under ``OUT/runs/``; a finished run is skipped and an interrupted one resumes,
so a sweep can be stopped and started again. Results go to ``OUT/results.json`` and figures to
``OUT/figures/``.
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

from ..errors import InputError, UsageError
from ..files import write_json
from ..models.checkpoint import ICL_FORMAT, read_meta
from ..models.icl import load_icl
from .evaluate import cells_to_json, evaluate
from .tasks import check_task
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
    batch_size: int = 64
    preset: str = "cpu"
    points_start: int = 11
    points_end: int = 41
    sigmas: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    lengths: list[int] = field(default_factory=lambda: [21, 41, 81, 161])
    outliers: list[float] = field(default_factory=lambda: [10, 100, 1000])
    outlier_position: int = 3
    prompts: int = 500

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
        labels = [s.label for s in self.scorers]
        if len(set(labels)) != len(labels):
            raise UsageError(f"scorer labels must be unique, got {labels}")
        from ..scorers import make_scorer

        for entry in self.scorers:
            make_scorer(entry.spec)

    def runs(self) -> list[tuple[str, ScorerEntry, int]]:
        return [(t, s, seed) for t in self.tasks for s in self.scorers for seed in range(s.seeds)]


def run_name(task: str, label: str, seed: int) -> str:
    return f"{task}-{label}-s{seed}"


def _one_run(args: tuple[dict, str, dict, int, str]) -> dict:
    """Train (or resume, or skip) and evaluate one run; executed in a worker process."""
    plan_dict, task, entry_dict, seed, out = args
    plan = SweepPlan(**{**plan_dict, "scorers": []})
    entry = ScorerEntry(**entry_dict)
    folder = Path(out) / "runs" / run_name(task, entry.label, seed)
    config = TrainConfig(
        task=task,
        scorer=entry.spec,
        steps=plan.steps,
        batch_size=plan.batch_size,
        lr=plan.lr,
        seed=seed,
        preset=plan.preset,
        points_start=plan.points_start,
        points_end=plan.points_end,
        checkpoint_every=max(1, plan.steps // 4),
    )
    eval_file = folder / "eval.json"
    meta = read_meta(folder, ICL_FORMAT)
    done = meta is not None and meta.get("training", {}).get("step") == plan.steps
    if done and eval_file.is_file():
        return json.loads(eval_file.read_text())
    model = load_icl(folder) if done else train(config, folder, resume=True, device="cpu")
    began = time.perf_counter()
    # σ at the trained length, length at σ = 1, outliers at the trained length and σ = 1.
    trained = (plan.points_end,)
    other_lengths = tuple(n for n in plan.lengths if n != plan.points_end)
    cells = evaluate(model, sigmas=tuple(plan.sigmas), lengths=trained, prompts=plan.prompts)
    cells += evaluate(model, sigmas=(1.0,), lengths=other_lengths, prompts=plan.prompts)
    outliers = tuple((v, plan.outlier_position) for v in plan.outliers)
    cells += evaluate(model, lengths=trained, outliers=outliers, prompts=plan.prompts)
    result = {
        "task": task,
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
    plan: SweepPlan, out: str | Path, *, jobs: int = 1, on_result: Callable[[dict], None] | None = None
) -> dict:
    """Run every (task, scorer, seed) of the plan, then aggregate and plot. Returns the results."""
    plan.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan_dict = {k: v for k, v in asdict(plan).items() if k != "scorers"}
    work = [(plan_dict, t, asdict(s), seed, str(out)) for t, s, seed in plan.runs()]
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
    order = {run_name(t, s.label, seed): i for i, (t, s, seed) in enumerate(plan.runs())}
    results.sort(key=lambda r: order[run_name(r["task"], r["label"], r["seed"])])
    summary = {
        "plan": asdict(plan),
        "wall_seconds": round(time.perf_counter() - began, 1),
        "torch": torch.__version__,
        "runs": results,
        "aggregate": aggregate(results),
    }
    write_json(summary, out / "results.json")
    from .plots import plot_sweep

    plot_sweep(summary, out / "figures")
    return summary


def aggregate(results: list[dict]) -> list[dict[str, Any]]:
    """Mean and (sample) std over seeds of every cell, per task and scorer label."""
    groups: dict[tuple, list[float]] = {}
    for run in results:
        for cell in run["cells"]:
            value = cell["normalized_error"] if cell["normalized_error"] is not None else cell["error"]
            key = (run["task"], run["label"], cell["sigma"], cell["length"], cell["outlier"])
            groups.setdefault(key, []).append(value)
    rows = []
    for (task, label, sigma, length, outlier), values in groups.items():
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
        rows.append(
            {
                "task": task,
                "label": label,
                "sigma": sigma,
                "length": length,
                "outlier": outlier,
                "mean": mean,
                "std": std,
                "seeds": len(values),
                "values": values,
            }
        )
    return rows
