"""The engine of the paired studies (``ssacli icl sweep`` in :mod:`ssacli.icl.sweep`, the
language-model study in :mod:`ssacli.quality.lm_study`): what both do besides training and
evaluating their own models.

* A plan is a list of :class:`StudyRun`: an arm (label) and a seed each, plus the runner's own
  ``job``. Seed s of every arm shares initialization, data and evaluation inputs (the runner passes
  the seed on), so arms are compared seed by seed against the plan's reference arm.
* :func:`execute`: one folder per run, ``OUT/runs/NAME``. A run whose ``eval.json`` is there (and
  that the runner's ``finished`` accepts) is read back, not run; any other is handed to the
  runner's ``work``, which resumes whatever the folder holds, and its result becomes ``eval.json``.
  So a study can be stopped and started again. ``jobs > 1`` runs them in spawned processes, one
  thread each.
* :func:`by_seed`, :func:`summarize`: mean ± std per arm and every arm against the reference on the
  seeds both ran (:func:`ssacli.stats.paired_summary`: per-seed differences, bootstrap CI, tests).
* :func:`write_results`: ``OUT/results.json`` with the plan, the runs and both summaries.

It imports neither torch nor a stage: the runners bring the work (a layer of its own, below the
stages that run studies and above train, whose runs they start).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError
from .files import confined, plain_name, write_json
from .stats import paired_summary

RESULT = "eval.json"  # a run's evaluation, in its folder; its presence marks the run evaluated


@dataclass(frozen=True)
class StudyRun:
    name: str  # the run's folder under OUT/runs/
    label: str  # its arm
    seed: int
    job: Any = None  # what the runner needs to train and evaluate it (picklable: it may go to a worker)


def check_arms(labels: list[str], reference: str | None) -> str:
    """The reference arm (``reference``, or the first label when None), once the labels are unique
    and the reference is one of them."""
    if len(set(labels)) != len(labels):
        raise UsageError(f"arm labels must be unique, got {labels}")
    for label in labels:  # labels name the runs' folders
        plain_name(label, "arm label", "the study's --out")
    if reference is not None and reference not in labels:
        raise UsageError(f"reference '{reference}' is not one of the arm labels {labels}")
    return reference or labels[0]


Work = Callable[[StudyRun, Path], dict]
Finished = Callable[[StudyRun, Path], bool]


def execute(
    runs: list[StudyRun],
    out: str | Path,
    work: Work,
    *,
    finished: Finished | None = None,
    jobs: int = 1,
    on_result: Callable[[StudyRun, dict], None] | None = None,
) -> list[dict]:
    """The result of every run, in the order of ``runs``.

    ``work(run, folder)`` trains (resuming what ``folder`` holds) and evaluates one run and returns
    its result, which is written to ``folder/eval.json``. A run whose ``eval.json`` exists, and for
    which ``finished(run, folder)`` (when given) holds, is not worked on again: its ``eval.json`` is
    its result. ``jobs > 1``: that many spawned worker processes (``work`` and ``finished`` must be
    module-level functions, ``job`` picklable), each limited to one thread, since the runs share
    the cores. ``on_result(run, result)`` is called as each run finishes (read back or worked on)."""
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise UsageError(f"run names must be unique, got {names}")
    by_name = {run.name: run for run in runs}
    items = [(work, finished, run, confined(Path(out) / "runs", run.name, "run", out)) for run in runs]
    results: dict[str, dict] = {}

    def collect(name: str, result: dict) -> None:
        results[name] = result
        if on_result:
            on_result(by_name[name], result)

    if jobs <= 1:
        for item in items:
            collect(*_one(item))
    else:
        with multiprocessing.get_context("spawn").Pool(jobs, initializer=_one_thread) as pool:
            for name, result in pool.imap_unordered(_one, items):
                collect(name, result)
    return [results[name] for name in names]


def _one(item: tuple[Work, Finished | None, StudyRun, Path]) -> tuple[str, dict]:
    work, finished, run, folder = item
    saved = folder / RESULT
    if saved.is_file() and (finished is None or finished(run, folder)):
        return run.name, json.loads(saved.read_text())
    result = work(run, folder)
    write_json(result, saved)
    return run.name, result


def _one_thread() -> None:
    """A worker's initializer, before it imports torch: one thread, for torch and for the processes
    it starts (they inherit the environment)."""
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def by_seed(values: Iterable[tuple[Any, str, int, float]]) -> dict[Any, dict[str, dict[int, float]]]:
    """(key, arm, seed, value) -> {key: {arm: {seed: value}}}, in first-seen order; a key is what
    identifies a measurement across arms (a metric, or a cell and a metric)."""
    groups: dict[Any, dict[str, dict[int, float]]] = {}
    for key, label, seed, value in values:
        groups.setdefault(key, {}).setdefault(label, {})[seed] = value
    return groups


def spread(values: Mapping[int, float]) -> dict[str, Any]:
    """Mean and sample std (None for one seed) of one arm's values, by seed."""
    v = list(values.values())
    mean = sum(v) / len(v)
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
    return {"mean": mean, "std": std, "seeds": len(v), "values": v, "seed_ids": list(values)}


def summarize(
    groups: Mapping[Any, Mapping[str, Mapping[int, float]]],
    reference: str,
    *,
    fields: Callable[[Any], dict[str, Any]],
    judge: Callable[[Any, dict[str, Any]], dict[str, Any]] = lambda key, summary: {},
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(aggregate, paired) rows of :func:`by_seed` groups: per key and arm, ``fields(key)`` and its
    :func:`spread`; per key and arm other than ``reference``, the arm against the reference on the
    seeds both ran (skipped when they share none), with ``judge(key, summary)`` (how to read it)
    before the :func:`ssacli.stats.paired_summary` fields."""
    aggregate, paired = [], []
    for key, arms in groups.items():
        for label, values in arms.items():
            aggregate.append({**fields(key), "label": label, **spread(values)})
            if label == reference or reference not in arms:
                continue
            summary = paired_summary(arms[reference], values)
            if summary["seeds"]:
                paired.append(
                    {**fields(key), "label": label, "reference": reference, **judge(key, summary), **summary}
                )
    return aggregate, paired


def write_results(
    out: str | Path, plan: Any, runs: list[dict], aggregate: list, paired: list, **about: Any
) -> dict[str, Any]:
    """``OUT/results.json``: the plan, ``about`` (wall time, device, …), the runs and the summaries."""
    results = {"plan": plan, **about, "runs": runs, "aggregate": aggregate, "paired": paired}
    write_json(results, Path(out) / "results.json")
    return results
