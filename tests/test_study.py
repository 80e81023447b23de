"""The study engine (ssacli.study) on a fake arm that "trains" by counting steps in its folder: runs
are paired by seed, a finished run is read back without work, an interrupted one is resumed, a
parallel study gives the sequential one's results in plan order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ssacli.errors import UsageError
from ssacli.stats import paired_summary
from ssacli.study import StudyRun, by_seed, check_arms, execute, summarize, write_results

STEPS = 3


def value(label: str, seed: int) -> float:
    """The fake arm's metric: what a run of ``label`` with ``seed`` measures."""
    return {"a": 1.0, "b": 1.5}[label] * (seed + 1) + 0.25 * seed**2


def _progress(folder: Path) -> int:
    path = folder / "progress"
    return int(path.read_text()) if path.is_file() else 0


def _finished(run: StudyRun, folder: Path) -> bool:
    return _progress(folder) == run.job["steps"]


def _work(run: StudyRun, folder: Path) -> dict:
    """Resume from the folder's progress, take the missing steps (each logged), then evaluate."""
    folder.mkdir(parents=True, exist_ok=True)
    start = _progress(folder)
    for step in range(start + 1, run.job["steps"] + 1):
        with open(folder / "log", "a") as log:
            log.write(f"{step}\n")
        (folder / "progress").write_text(str(step))
        if step == run.job.get("crash_at"):
            raise KeyboardInterrupt  # stopped mid-training
    return {"label": run.label, "seed": run.seed, "resumed_from": start, "value": value(run.label, run.seed)}


def plan(seeds: dict[str, list[int]], **job) -> list[StudyRun]:
    return [
        StudyRun(f"{label}-s{seed}", label, seed, {"steps": STEPS, **job})
        for label, mine in seeds.items()
        for seed in mine
    ]


def steps_taken(out: Path, name: str) -> list[int]:
    log = out / "runs" / name / "log"
    return [int(line) for line in log.read_text().split()] if log.is_file() else []


def test_results_in_plan_order_paired_by_seed_against_the_reference(tmp_path):
    runs = plan({"a": [0, 1, 2], "b": [3, 1, 0]})  # b has no seed 2, a has no seed 3
    seen: list[str] = []
    results = execute(runs, tmp_path, _work, finished=_finished, on_result=lambda r, _: seen.append(r.name))
    assert [(r["label"], r["seed"]) for r in results] == [(r.label, r.seed) for r in runs]
    assert seen == [r.name for r in runs]
    assert json.loads((tmp_path / "runs" / "b-s3" / "eval.json").read_text()) == results[3]
    groups = by_seed(("m", r["label"], r["seed"], r["value"]) for r in results)
    aggregate, paired = summarize(groups, "a", fields=lambda key: {"metric": key})
    rows = {r["label"]: r for r in aggregate}
    assert rows["a"]["values"] == [value("a", s) for s in (0, 1, 2)] and rows["a"]["seed_ids"] == [0, 1, 2]
    assert rows["b"]["mean"] == pytest.approx(sum(value("b", s) for s in (3, 1, 0)) / 3)
    (row,) = paired
    assert (row["metric"], row["label"], row["reference"]) == ("m", "b", "a")
    # only the seeds both arms ran, each b - a of the same seed
    assert row["differences"] == pytest.approx([value("b", s) - value("a", s) for s in (0, 1)])
    expected = paired_summary({s: value("a", s) for s in (0, 1)}, {s: value("b", s) for s in (0, 1)})
    assert row["ci_low"] == expected["ci_low"] and row["permutation_p"] == expected["permutation_p"]


def test_a_finished_run_is_read_back_and_an_interrupted_one_resumed(tmp_path):
    runs = plan({"a": [0, 1]})
    first = execute(runs, tmp_path, _work, finished=_finished)
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/eval.json")}
    again = execute(runs, tmp_path, _work, finished=_finished)
    assert again == first
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/eval.json")}
    assert steps_taken(tmp_path, "a-s0") == [1, 2, 3]  # no step taken twice

    with pytest.raises(KeyboardInterrupt):
        execute(plan({"b": [0]}, crash_at=2), tmp_path, _work, finished=_finished)
    assert not (tmp_path / "runs" / "b-s0" / "eval.json").exists()
    (result,) = execute(plan({"b": [0]}), tmp_path, _work, finished=_finished)
    assert steps_taken(tmp_path, "b-s0") == [1, 2, 3] and result["resumed_from"] == 2


def test_an_evaluated_run_whose_training_is_not_finished_is_worked_on_again(tmp_path):
    """A plan with more steps than the run has: eval.json is stale, the run continues."""
    execute(plan({"a": [0]}), tmp_path, _work, finished=_finished)
    longer = [StudyRun("a-s0", "a", 0, {"steps": STEPS + 2})]
    (result,) = execute(longer, tmp_path, _work, finished=_finished)
    assert result["resumed_from"] == STEPS and steps_taken(tmp_path, "a-s0") == [1, 2, 3, 4, 5]
    assert json.loads((tmp_path / "runs" / "a-s0" / "eval.json").read_text()) == result


def test_parallel_jobs_give_the_sequential_results_in_plan_order(tmp_path):
    runs = plan({"a": [0, 1], "b": [0, 1]})
    parallel = execute(runs, tmp_path / "p", _work, finished=_finished, jobs=2)
    sequential = execute(runs, tmp_path / "s", _work, finished=_finished)
    assert parallel == sequential


def test_plans_are_checked_and_results_written(tmp_path):
    assert check_arms(["a", "b"], None) == "a" and check_arms(["a", "b"], "b") == "b"
    with pytest.raises(UsageError, match="unique"):
        check_arms(["a", "a"], None)
    with pytest.raises(UsageError, match="reference 'c'"):
        check_arms(["a", "b"], "c")
    with pytest.raises(UsageError, match="run names"):
        execute([StudyRun("x", "a", 0), StudyRun("x", "b", 0)], tmp_path, _work)
    written = write_results(tmp_path, {"p": 1}, [], [], [], wall_seconds=2.0)
    assert json.loads((tmp_path / "results.json").read_text()) == written
    assert list(written) == ["plan", "wall_seconds", "runs", "aggregate", "paired"]
