"""The language-model study: tiny decoders trained from scratch as `ssacli train` trains them,
paired by seed across scorers, evaluated and aggregated on the study engine (:mod:`ssacli.study`).
``studies/lm/run.py`` is its command line; :mod:`ssacli.report.lm_study` renders its tables.

Per arm (scorer) and seed, in OUT/runs/{label}-s{seed}/:

1. train (:func:`train_run`): :func:`ssacli.train.runs.train_from_scratch` in this process, what
   `ssacli train --size OUT/model-config.json --data PLAN.data --scorer SPEC --seed SEED …` runs (the
   plan's `model` is written as the config; same steps, batch, tokens and tokenizer for every arm:
   the tokenizer depends only on the data and the vocabulary size). A finished run (its training
   record at the plan's steps) is not trained again, an interrupted one continues (resume).
2. evaluate (:func:`evaluate_folder`, eval.json): perplexity of the in-distribution text (`id_text`)
   and the out-of-distribution text (`ood_text`) at the training context and at each multiple in
   `contexts` (windows longer than the trained positions: RoPE models run them, that is the
   length-shift test), the BLiMP paradigms in `blimp` (accuracy per paradigm and their mean), and
   :func:`ssacli.diagnose` of the model with the plan's `diagnose_args` (the options of `ssacli
   diagnose` that :data:`DIAGNOSE_OPTIONS` names; diagnose.json, its collapse summary per probe).
3. aggregate (:func:`summarize`, results.json): every metric per run (:func:`run_metrics`), mean ±
   std per arm, and each arm against the plan's `reference` paired by seed.

What the engine does for it: skip a run whose eval.json is there and whose training is finished,
run the rest (``jobs`` in parallel), write results.json. Paths in the plan are relative to the
current directory.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..diagnosis.run import diagnose
from ..errors import SsacliError, UsageError
from ..files import write_json, write_text
from ..models.checkpoint import training_record
from ..models.loading import load_model
from ..stats import verdict
from ..study import StudyRun, by_seed, check_arms, execute, write_results
from ..study import summarize as summarize_groups
from ..train.runs import train_from_scratch
from .measures import language_model_loss, minimal_pairs

LOWER_IS_BETTER_PREFIXES = ("ppl", "nll", "collapse")


def load_plan(path: Path) -> dict[str, Any]:
    """The plan in ``path`` with its defaults filled in (they are part of results.json's plan)."""
    plan = json.loads(Path(path).read_text())
    plan["reference"] = check_arms([a["label"] for a in plan["arms"]], plan.get("reference"))
    plan.setdefault("contexts", [1, 2, 4])
    plan.setdefault("max_tokens", 32768)
    plan.setdefault("blimp_limit", None)
    plan.setdefault("diagnose", True)
    plan.setdefault("diagnose_args", ["--samples", "4"])
    diagnose_options(plan["diagnose_args"])  # a bad one is refused before any run trains
    return plan


def runs(plan: dict[str, Any], device: str = "cpu") -> list[StudyRun]:
    """Every (arm, seed), seeds outermost: a seed's arms finish close together."""
    return [
        StudyRun(run_name(arm["label"], seed), arm["label"], seed, (plan, arm, device))
        for seed in range(plan["seeds"])
        for arm in plan["arms"]
    ]


def run_name(label: str, seed: int) -> str:
    return f"{label}-s{seed}"


def finished_steps(folder: Path) -> int | None:
    return (training_record(folder) or {}).get("step")


def _trained(run: StudyRun, folder: Path) -> bool:
    return finished_steps(folder) == run.job[0]["steps"]


def train_run(plan: dict[str, Any], arm: dict[str, Any], seed: int, folder: Path, device: str) -> float:
    """Train (or continue) one run as `ssacli train` does; the seconds it took (0 when it was done)."""
    if finished_steps(folder) == plan["steps"]:
        return 0.0
    options: dict[str, Any] = {}
    if plan.get("attention"):  # eager is faster than the blocked SSA kernel at 128 tokens on CPU
        options["attention"] = plan["attention"]
    if plan.get("warmup") is not None:
        options["warmup"] = plan["warmup"]
    began = time.perf_counter()
    train_from_scratch(
        plan["data"], folder, size=str(folder.parent.parent / "model-config.json"), scorer=arm["spec"],
        steps=plan["steps"], lr=plan["lr"], batch_size=plan["batch_size"], seq_len=plan["seq_len"],
        vocab_size=plan["vocab_size"], seed=seed, device=device, resume=folder.exists(),
        checkpoint_every=max(1, plan["steps"] // 4), **options,
    )  # fmt: skip
    return time.perf_counter() - began


# The options of `ssacli diagnose` a plan's diagnose_args may hold: flag -> (keyword, how it parses).
DIAGNOSE_OPTIONS = {"--samples": ("samples", int), "--length": ("length", int), "--probe": ("probes", str),
                    "--seed": ("seed", int), "--batch-size": ("batch_size", int)}  # fmt: skip


def diagnose_options(args: list[str]) -> dict[str, Any]:
    """diagnose's keywords from a plan's ``diagnose_args`` (``--probe`` may repeat); another flag is a
    UsageError, so a plan cannot ask for something the study would silently not do."""
    options: dict[str, Any] = {}
    if len(args) % 2:
        raise UsageError(f"diagnose_args {args}: each option takes one value")
    for flag, value in zip(args[::2], args[1::2]):
        if flag not in DIAGNOSE_OPTIONS:
            raise UsageError(f"diagnose_args: {flag} is not one of {', '.join(DIAGNOSE_OPTIONS)}")
        key, parse = DIAGNOSE_OPTIONS[flag]
        if key == "probes":
            options.setdefault("probes", []).append(value)
        else:
            options[key] = parse(value)
    return options


def _work(run: StudyRun, folder: Path) -> dict[str, Any]:
    """Train and evaluate one run (in a worker process when the study runs jobs in parallel)."""
    plan, arm, device = run.job
    seconds = train_run(plan, arm, run.seed, folder, device)
    if seconds:
        print(f"{run.name}: trained {seconds:.0f} s this call", flush=True)
    return evaluate_folder(plan, folder, device)


def evaluate_folder(plan: dict[str, Any], folder: Path, device: str) -> dict[str, Any]:
    """The eval.json of one trained run."""
    began = time.perf_counter()
    loaded = load_model(str(folder), device=device)
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
        try:
            diagnosed = diagnose(loaded, device=device, **diagnose_options(plan["diagnose_args"]))
        except SsacliError as err:  # recorded in the run's evaluation, as a failed `ssacli diagnose` was
            result["diagnose"] = {"error": [str(err)]}
        else:
            text = diagnosed.to_json()
            write_text(text, folder / "diagnose.json")
            result["diagnose"] = diagnose_summary(json.loads(text))
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


def summarize(plan: dict[str, Any], per_run: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """Mean ± std per metric and arm, and every arm against the plan's reference paired by seed."""
    groups = by_seed(
        (name, run["label"], run["seed"], value) for run in per_run for name, value in run["metrics"].items()
    )

    def judge(name: str, paired: dict[str, Any]) -> dict[str, Any]:
        lower = name.startswith(LOWER_IS_BETTER_PREFIXES)
        return {"lower_is_better": lower, "verdict": verdict(paired, lower_is_better=lower)}

    return summarize_groups(groups, plan["reference"], fields=lambda name: {"metric": name}, judge=judge)


def run_study(plan_path: Path, out: Path, *, jobs: int = 1, device: str = "cpu") -> dict[str, Any]:
    """Train, evaluate and aggregate every run of the plan (finished ones are read back); the
    results, also written to OUT/results.json."""
    plan = load_plan(plan_path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "model-config.json"
    if not config.is_file():
        write_json(plan["model"], config)
    began = time.perf_counter()
    study = runs(plan, device)
    evaluations = execute(
        study, out, _work, finished=_trained, jobs=jobs,
        on_result=lambda run, _: print(f"{run.name}: done", flush=True),
    )  # fmt: skip
    per_run = []
    for run, evaluation in zip(study, evaluations):
        training = training_record(out / "runs" / run.name) or {}
        per_run.append({"label": run.label, "spec": run.job[1]["spec"], "seed": run.seed,
                        "metrics": run_metrics(evaluation), "train_seconds": training.get("seconds"),
                        "eval_seconds": evaluation["eval_seconds"]})  # fmt: skip
    aggregate, paired = summarize(plan, per_run)
    wall_seconds = round(time.perf_counter() - began, 1)
    return write_results(out, plan, per_run, aggregate, paired, wall_seconds=wall_seconds)
