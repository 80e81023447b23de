"""A grid of ICL runs (tasks × backbones × scorers × seeds): train, evaluate, aggregate, pair.

A sweep is described by a plan (JSON, or built from command-line flags). It runs on the study engine
(:mod:`ssacli.study`): every run lives in its own checkpoint folder under ``OUT/runs/``; a finished
run is skipped and an interrupted one resumes, so a sweep can be stopped and started again. Results
go to ``OUT/results.json``; the figures (``OUT/figures/`` for ``ssacli icl sweep``) are drawn by
:func:`ssacli.report.plots.plot_sweep`, a layer above this one.

Runs of the same seed share initialization, training data and evaluation prompts across arms
(scorers), so results.json holds, besides the per-seed runs and the mean ± std ``aggregate``, a
``paired`` list: for every task, backbone, cell, metric and arm, the per-seed differences against
the plan's ``reference`` arm with a bootstrap CI and a sign test (:mod:`ssacli.stats`).

What is the ICL's own here: the plan's tasks, backbones and evaluation grid, training and evaluating
one run, and the cells (:func:`cell_metrics`, :func:`cell_key`). Metrics per cell: ``error`` (the
headline: the prompt error rate, or MSE/Var(y) for ``linear``), and where they apply
``after_outlier``, ``at_outlier``, ``rank_corr`` (higher is better) and ``sign_error`` (see
:mod:`ssacli.icl.evaluate`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..defaults import (
    ICL_BATCH_SIZE,
    ICL_LENGTHS,
    ICL_LR,
    ICL_POINTS,
    ICL_POINTS_START,
    ICL_PRESET,
    ICL_PROMPTS,
    ICL_SWEEP_SEEDS,
    ICL_SWEEP_STEPS,
    SCORER_LR,
)
from ..errors import InputError
from ..files import check_writable_folder
from ..models.checkpoint import ICL_FORMAT, read_meta
from ..models.icl import check_arch, load_icl
from ..models.icl_task import check_task
from ..study import StudyRun, by_seed, check_arms, execute, summarize, write_results
from .evaluate import cells_to_json, evaluate
from .train import TrainConfig, train


@dataclass
class ScorerEntry:
    label: str  # short name used in file names, tables and legends
    spec: str
    seeds: int = ICL_SWEEP_SEEDS


@dataclass
class SweepPlan:
    tasks: list[str]
    scorers: list[ScorerEntry]
    steps: int = ICL_SWEEP_STEPS
    lr: float = ICL_LR
    scorer_lr: float = SCORER_LR  # the scorer's own optimizer group (ssacli.models.optim)
    batch_size: int = ICL_BATCH_SIZE
    preset: str = ICL_PRESET
    points_start: int = ICL_POINTS_START
    points_end: int = ICL_POINTS
    sigmas: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    lengths: list[int] = field(default_factory=lambda: [ICL_POINTS // 2 + 1, *ICL_LENGTHS])
    outliers: list[float] = field(default_factory=lambda: [10, 100, 1000])
    outlier_position: int = 3
    prompts: int = ICL_PROMPTS
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
        check_arms([s.label for s in self.scorers], self.reference)
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


def _trained(run: StudyRun, folder: Path) -> bool:
    """Whether the run's checkpoint holds its whole training (the plan's steps)."""
    meta = read_meta(folder, ICL_FORMAT)
    return meta is not None and meta.get("training", {}).get("step") == run.job[0]["steps"]


def _work(run: StudyRun, folder: Path) -> dict:
    """Train (or resume, or load the trained) model of one run and evaluate it; in a worker process
    when the sweep runs jobs in parallel."""
    plan_dict, task, arch, entry_dict, device = run.job
    plan = SweepPlan(**{**plan_dict, "scorers": []})
    entry = ScorerEntry(**entry_dict)
    config = TrainConfig(
        task=task,
        scorer=entry.spec,
        steps=plan.steps,
        batch_size=plan.batch_size,
        lr=plan.lr,
        scorer_lr=plan.scorer_lr,
        seed=run.seed,
        preset=plan.preset,
        points_start=plan.points_start,
        points_end=plan.points_end,
        checkpoint_every=max(1, plan.steps // 4),
        arch=arch,
    )
    done = _trained(run, folder)
    advice = "the same sweep again (finished runs are skipped; this one resumes from its checkpoint)"
    model = load_icl(folder, device) if done else train(config, folder, resume=True, device=device,
                                                        resume_advice=advice)  # fmt: skip
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
    return {
        "task": task,
        "arch": arch,
        "label": entry.label,
        "spec": entry.spec,
        "seed": run.seed,
        "train_seconds": model.spec.training.get("seconds"),
        "final_loss": model.spec.training["history"][-1][1],
        "eval_seconds": round(time.perf_counter() - began, 1),
        **cells_to_json(model, cells),
    }


def run_sweep(
    plan: SweepPlan,
    out: str | Path,
    *,
    jobs: int = 1,
    device: str = "cpu",
    on_result: Callable[[dict], None] | None = None,
) -> dict:
    """Run every (task, arch, scorer, seed) of the plan (finished runs are read back, interrupted
    ones resumed), then aggregate and pair; the summary is also ``OUT/results.json``.

    ``device`` (cpu, cuda, auto) is where each run trains and is evaluated; the results do not
    depend on it beyond floating-point noise (the data generators are CPU generators)."""
    plan.validate()
    out = Path(out)
    check_writable_folder(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    plan_dict = {k: v for k, v in asdict(plan).items() if k != "scorers"}
    runs = [
        StudyRun(run_name(t, s.label, seed, a), s.label, seed, (plan_dict, t, a, asdict(s), device))
        for t, a, s, seed in plan.runs()
    ]
    began = time.perf_counter()
    report = (lambda run, result: on_result(result)) if on_result else None
    results = execute(runs, out, _work, finished=_trained, jobs=jobs, on_result=report)
    wall_seconds = round(time.perf_counter() - began, 1)
    return write_results(
        out, asdict(plan), results, aggregate(results), paired(results, plan.reference_label),
        wall_seconds=wall_seconds, device=device, torch=torch.__version__,
    )  # fmt: skip


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
    return by_seed(
        ((*cell_key(run, cell), metric), run["label"], run["seed"], value)
        for run in results
        for cell in run["cells"]
        for metric, value in cell_metrics(cell).items()
    )


def _row(key: tuple) -> dict[str, Any]:
    task, arch, sigma, length, outlier, coef, metric = key
    return {
        "task": task, "arch": arch, "sigma": sigma, "length": length, "outlier": outlier,
        "coef_sigma": coef, "metric": metric,
    }  # fmt: skip


def _judge(key: tuple, summary: dict) -> dict[str, Any]:
    return {"higher_is_better": key[-1] in HIGHER_IS_BETTER}


def aggregate(results: list[dict]) -> list[dict[str, Any]]:
    """Mean and (sample) std over seeds of every cell and metric, per task, backbone and arm."""
    return summarize(_by_cell(results), "", fields=_row)[0]


def paired(results: list[dict], reference: str) -> list[dict[str, Any]]:
    """Every arm against ``reference`` on the seeds both ran, per cell and metric: the differences
    arm - reference with a bootstrap CI and a sign test (:func:`ssacli.stats.paired_summary`).
    ``higher_is_better`` says how to read the sign."""
    return summarize(_by_cell(results), reference, fields=_row, judge=_judge)[1]
