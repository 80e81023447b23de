"""Benchmarks through lm-evaluation-harness (the optional extra ``ssacli[eval]``).

:func:`lm_eval` runs lm-eval tasks on one model, *as loaded*: the model object itself goes to
``lm_eval.models.huggingface.HFLM(pretrained=model, tokenizer=...)``, so its forward runs whatever
scorer ssacli attached (transformers calls ssacli's registered attention function for every layer)
and no task is re-implemented here. ``lm_eval.simple_evaluate(..., log_samples=True)`` returns the
scores with lm-eval's own standard errors and every item's responses; the per-item values are kept
(``items``) so that :func:`paired_rows` can give BEFORE and AFTER's paired difference with a
per-item paired standard error (same items, so the noise shared by both models cancels).

A task's data is downloaded when not cached, as datasets does, unless ``offline`` (``--offline``):
then the Hub and datasets are put in offline mode for the run (environment and the libraries' flags,
restored afterwards), so a task whose data is not cached fails at once with a line naming the task,
never a download (``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1`` in the environment say the same
to the libraries themselves). A task is a registered lm-eval name (``arc_easy``), or the path of a
task YAML (for instance
``dataset_path: json`` over local files); when every task is a YAML path, lm-eval's index of its
built-in tasks is not built (seconds saved).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError
from ..models.kinds import ModelKind
from ..stats import ALPHA, paired_differences, paired_t_test
from .settings import LMEvalPlan

EXTRA = 'pip install "ssacli[eval]"'
HARNESS_KINDS = ("causal", "seq2seq")  # the model kinds HFLM scores
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
MEAN_TOLERANCE = 1e-9  # a score is a mean over items when it equals their mean this closely


def parse_tasks(tasks: str | Sequence[str]) -> tuple[str, ...]:
    """``"arc_easy,hellaswag"`` or a sequence of names -> a tuple of task specs (UsageError if none)."""
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    parsed = tuple(dict.fromkeys(str(t).strip() for t in items if str(t).strip()))
    if not parsed:
        raise UsageError("--lm-eval takes task names or task YAML files, comma-separated, e.g. arc_easy")
    return parsed


def require_harness() -> None:
    """UsageError (exit 2) when lm-evaluation-harness is not installed; imports nothing."""
    if find_spec("lm_eval") is None:
        raise UsageError(f"--lm-eval needs lm-evaluation-harness, which is not installed: {EXTRA}")


def _is_yaml_path(task: str) -> bool:
    return task.endswith((".yaml", ".yml")) and Path(task).expanduser().is_file()


def task_label(task: str) -> str:
    """How errors name a task: ``'name'``, or for a YAML path ``'name' (path)`` with the name from
    its ``task:`` line (read as text: lm-eval YAMLs may hold tags a plain YAML reader refuses)."""
    if not _is_yaml_path(task):
        return f"'{task}'"
    text = Path(task).expanduser().read_text(errors="replace")
    found = re.search(r"^task:\s*['\"]?([^'\"\s#]+)", text, re.M)
    return f"'{found.group(1)}' ({task})" if found else f"'{task}'"


def _task_manager(plan: LMEvalPlan):
    from lm_eval.tasks import TaskManager

    builtin = plan.include_path is not None or not all(_is_yaml_path(t) for t in plan.tasks)
    return TaskManager(include_path=plan.include_path, include_defaults=builtin)


def check_tasks(plan: LMEvalPlan, *, offline: bool = False, verbose: bool = False) -> None:
    """Load every task (and so its data) once, before any model: a UsageError naming an unknown
    task, an InputError naming a task whose data cannot be had (offline: not in the cache)."""
    require_harness()
    if plan.include_path is not None and not Path(plan.include_path).is_dir():
        raise InputError(f"--lm-eval-include {plan.include_path}: not a folder of task YAML files")
    with harness_environment(offline=offline, verbose=verbose):
        manager = _task_manager(plan)
        for task in plan.tasks:
            try:
                manager.load([task])
            except KeyError:
                raise UsageError(
                    f"unknown lm-eval task {task_label(task)}: not a registered task, group or tag, nor a "
                    "task YAML file; list them with `lm-eval ls tasks`"
                ) from None
            except Exception as err:  # datasets raises ConnectionError, FileNotFoundError, …
                reason = " ".join(str(err).split()) or type(err).__name__
                fix = (
                    "cannot be had offline: {}; cache it once without --offline (network), or give a "
                    "task YAML over local files" if offline
                    else "could not be loaded: {}; check the network (or run with --offline and the data "
                    "cached), its dataset_path and data_files"
                )  # fmt: skip
                raise InputError(f"lm-eval task {task_label(task)}: its data {fix.format(reason)}") from None


@contextlib.contextmanager
def harness_environment(*, offline: bool, verbose: bool) -> Iterator[None]:
    """Offline mode for the Hub and datasets with ``offline`` (the environment variables,
    and the flags huggingface_hub and datasets read from them at import), and unless ``verbose``
    lm-eval's log lines and progress bars kept off the terminal; all restored on exit."""
    saved_env = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}
    if offline:
        os.environ.update({name: "1" for name in OFFLINE_VARIABLES})
    import datasets.config
    import huggingface_hub.constants

    flags = [(huggingface_hub.constants, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
             (datasets.config, "HF_DATASETS_OFFLINE")]  # fmt: skip
    saved_flags = [getattr(owner, name) for owner, name in flags]
    logger = logging.getLogger("lm_eval")
    saved_level = logger.level
    try:
        if offline:
            for owner, name in flags:
                setattr(owner, name, True)
        with contextlib.ExitStack() as stack:
            if not verbose:
                logger.setLevel(logging.ERROR)
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))  # tqdm bars
                stack.enter_context(_quiet_stderr_descriptor())  # `git describe`'s "fatal: not a git …"
            yield
    finally:
        logger.setLevel(saved_level)
        for (owner, name), value in zip(flags, saved_flags):
            setattr(owner, name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _quiet_stderr_descriptor() -> Iterator[None]:
    """File descriptor 2 to the null device: lm-eval runs `git describe` for its record, whose
    "fatal: not a git repository" outside a repository would otherwise reach the terminal."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def lm_eval(
    model, tasks: str | Sequence[str], *, num_fewshot: int | None = None, limit: int | None = None,
    include_path: str | Path | None = None, batch_size: int = 8, seed: int = 0, verbose: bool = False,
    **load: Any,
) -> dict[str, Any]:  # fmt: skip
    """Run lm-evaluation-harness ``tasks`` on ``model`` (a MODEL reference or a LoadedModel) with
    its scorer; JSON-ready: per task its scores with lm-eval's standard errors and every item
    (``doc_id``, ``target``, ``loglikelihoods`` of its requests, per-item metric values).

    ``load``: how a MODEL reference loads, :class:`~ssacli.models.options.LoadOptions`' fields by name.
    The tasks are checked (and their data loaded: downloaded unless ``offline``) before the model
    loads. ``seed`` seeds lm-eval's random, numpy, torch and few-shot generators."""
    from ..models.loading import LoadedModel, load_with
    from ..models.options import LoadOptions
    from ..setting import settings_from

    (options,) = settings_from("lm_eval", load, LoadOptions)
    plan = LMEvalPlan(parse_tasks(tasks), num_fewshot, limit,
                      None if include_path is None else str(include_path), batch_size)  # fmt: skip
    check_tasks(plan, offline=options.offline, verbose=verbose)
    if not isinstance(model, LoadedModel):
        model = load_with(str(model), options)
    return run_plan(model, plan, seed=seed, offline=options.offline, verbose=verbose)


def check_harness_kind(loaded) -> None:
    """UsageError unless lm-eval's HFLM can score this kind of model."""
    if loaded.kind not in HARNESS_KINDS or loaded.tokenizer is None:
        what = f"a {loaded.kind} model" if loaded.tokenizer is not None else "a model without a tokenizer"
        raise UsageError(
            f"--lm-eval scores causal (or seq2seq) language models with a tokenizer; '{loaded.name}' "
            f"is {what}"
        )


def run_plan(loaded, plan: LMEvalPlan, *, seed: int = 0, offline: bool = False,
             verbose: bool = False) -> dict[str, Any]:  # fmt: skip
    """One model's lm-eval run (tasks already checked by :func:`check_tasks`)."""
    check_harness_kind(loaded)
    with harness_environment(offline=offline, verbose=verbose):
        import lm_eval as harness
        from lm_eval.models.huggingface import HFLM

        model = loaded.model
        # a copy: HFLM may give the tokenizer a pad token, and ssacli's own measures use the original
        backend = "seq2seq" if loaded.kind == ModelKind.SEQ2SEQ else "causal"
        wrapped = HFLM(
            pretrained=model, tokenizer=copy.deepcopy(loaded.tokenizer), batch_size=plan.batch_size,
            max_length=loaded.max_positions, backend=backend,
        )  # fmt: skip
        implementation = model.config._attn_implementation  # what transformers dispatches to, at run time
        results = harness.simple_evaluate(
            model=wrapped, tasks=list(plan.tasks), task_manager=_task_manager(plan),
            num_fewshot=plan.num_fewshot, limit=plan.limit, log_samples=True, random_seed=seed,
            numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
        )  # fmt: skip
    tasks = {}
    for name, scores in results["results"].items():
        samples = results.get("samples", {}).get(name) or []
        tasks[name] = {
            "alias": scores.get("alias", name),
            "num_fewshot": results.get("n-shot", {}).get(name),
            "metrics": _metrics(scores, results.get("higher_is_better", {}).get(name) or {}),
            "items": _items(samples),
        }
    return {
        "model": loaded.name,
        "attn_implementation": implementation,
        "scorer": getattr(model.config, "ssacli_scorer", None) or "softmax",
        "lm_eval_version": getattr(harness, "__version__", None) or results.get("lm_eval_version"),
        "settings": plan.as_dict(),
        "tasks": tasks,
    }


def _label(metric: str, filter_name: str) -> str:
    return metric if filter_name == "none" else f"{metric},{filter_name}"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _metrics(scores: dict[str, Any], higher: dict[str, bool]) -> dict[str, dict[str, Any]]:
    """lm-eval's ``"acc,none"`` / ``"acc_stderr,none"`` keys -> {label: value, stderr, better}."""
    out = {}
    for key, value in scores.items():
        metric, sep, filter_name = key.partition(",")
        if not sep or metric.endswith("_stderr") or _number(value) is None:
            continue
        out[_label(metric, filter_name)] = {
            "value": float(value),
            "stderr": _number(scores.get(f"{metric}_stderr,{filter_name}")),  # "N/A" -> None
            "better": "lower" if higher.get(metric) is False else "higher",
        }
    return out


def _loglikelihoods(responses) -> list[float] | None:
    """The log-likelihood of each request of an item ((ll, is_greedy) pairs or rolling floats);
    None for generated text."""
    values = []
    for response in responses or []:
        head = response[0] if isinstance(response, list | tuple) and response else response
        if _number(head) is None:
            return None
        values.append(float(head))
    return values


def _items(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per document (lm-eval logs a sample per document and filter)."""
    items: dict[Any, dict[str, Any]] = {}
    for sample in samples:
        doc = sample["doc_id"]
        target = sample.get("target")
        item = items.setdefault(doc, {
            "doc_id": doc,
            "target": target if isinstance(target, int | float | str) or target is None else str(target),
            "loglikelihoods": _loglikelihoods(sample.get("filtered_resps")),
            "metrics": {},
        })  # fmt: skip
        for metric in sample.get("metrics", []):
            value = _number(sample.get(metric))
            if value is not None:
                item["metrics"][_label(metric, sample.get("filter", "none"))] = value
    return list(items.values())


def paired_rows(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Per task and metric both runs have: BEFORE and AFTER with lm-eval's standard errors, Δ = AFTER
    − BEFORE and, where the score is a mean over items, the per-item paired standard error
    sd(d) / √n of the differences d on the same items and the paired t-test's p; otherwise
    ``paired_stderr`` is None and ``note`` says why."""
    rows = []
    for task, a_task in before.get("tasks", {}).items():
        b_task = after.get("tasks", {}).get(task)
        if b_task is None:
            continue
        for label, a in a_task["metrics"].items():
            b = b_task["metrics"].get(label)
            if b is None:
                continue
            a_items = {i["doc_id"]: i["metrics"][label] for i in a_task["items"] if label in i["metrics"]}
            b_items = {i["doc_id"]: i["metrics"][label] for i in b_task["items"] if label in i["metrics"]}
            diffs = list(paired_differences(a_items, b_items).values())
            row = {"task": task, "metric": label, "before": a["value"], "before_stderr": a["stderr"],
                   "after": b["value"], "after_stderr": b["stderr"], "delta": b["value"] - a["value"],
                   "paired_stderr": None, "p": None, "n": len(diffs), "better": a["better"],
                   "note": None}  # fmt: skip
            if not diffs or len(diffs) != len(a_items) or len(diffs) != len(b_items):
                row["note"] = "no per-item values on the same items"
            elif not (_is_mean(a["value"], a_items) and _is_mean(b["value"], b_items)):
                row["note"] = "the score is not a mean over items (no per-item paired error)"
            elif len(diffs) < 2:
                row["note"] = "one item: no paired error"
            else:
                if not any(diffs):
                    row["note"] = "every item has the same value on both (nothing to test)"
                mean = sum(diffs) / len(diffs)
                variance = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
                row["paired_stderr"] = math.sqrt(variance / len(diffs))
                row["p"] = paired_t_test(diffs)
            rows.append(row)
    return rows


def _is_mean(value: float, items: dict[Any, float]) -> bool:
    mean = sum(items.values()) / len(items)
    return abs(mean - value) <= MEAN_TOLERANCE * max(1.0, abs(value))


def row_verdict(row: dict[str, Any]) -> str:
    """ "better" / "worse" for AFTER when the paired test's p <= ALPHA, else ""."""
    p, delta = row.get("p"), row.get("delta")
    if p is None or p > ALPHA or not delta:
        return ""
    return "better" if (delta > 0) == (row["better"] == "higher") else "worse"


__all__ = [
    "EXTRA",
    "HARNESS_KINDS",
    "LMEvalPlan",
    "check_harness_kind",
    "check_tasks",
    "harness_environment",
    "lm_eval",
    "paired_rows",
    "parse_tasks",
    "require_harness",
    "row_verdict",
    "run_plan",
]
