"""BEFORE vs AFTER: :func:`compare_models` runs every quality measure that applies to two models
(e.g. a checkpoint and its ``ssacli convert`` output) and the diagnose probes on both, into one
:class:`~ssacli.quality.result.QualityReport` (JSON: schema ``ssacli-report``, version 1), with
:func:`quality_rows` as its table; optionally a third model, CONTROL (e.g. the softmax control
trained with AFTER's budget), is measured and probed beside them.

The measures themselves are in :mod:`ssacli.quality.measures`; ``ssacli report`` renders the report
(:mod:`ssacli.report.before_after`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..defaults import (
    BATCH_SIZE,
    DEVICE,
    DTYPE,
    ICL_OUTLIERS,
    ICL_POINTS,
    ICL_PROMPTS,
    ICL_SIGMAS,
    LM_MAX_TOKENS,
    LM_SEQ_LEN,
    PAIRS_LIMIT,
    SAMPLES,
    SEED,
)
from ..errors import InputError, UsageError
from ..models.device_map import MaxMemory
from ..models.identity import difference
from ..models.integrity import require_finite_weights
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, load_with
from ..models.options import LoadOptions
from .builtin import BUILTIN_PAIRS, BUILTIN_PAIRS_NAME, BUILTIN_TEXTS_NAME, builtin_text
from .harness import LMEvalPlan, check_harness_kind, check_tasks, paired_rows, run_plan
from .inputs import read_pairs, read_text_file
from .measures import LM_KINDS, icl_error_by_sigma, language_model_loss, minimal_pairs
from .result import REPORT_SCHEMA, QualityReport, read_report
from .rows import quality_rows


def compare_models(
    before: str | Path | LoadedModel, after: str | Path | LoadedModel,
    control: str | Path | LoadedModel | None = None, *,
    text_id: str | Path | None = None, text_ood: str | Path | None = None,
    heldout_of: str | Path | None = None,
    pairs: str | Path | Sequence[dict] | dict | None = None, pairs_limit: int | None = PAIRS_LIMIT,
    probes: Sequence[str] | None = None, seed: int = SEED, samples: int = SAMPLES,
    seq_len: int = LM_SEQ_LEN, max_tokens: int = LM_MAX_TOKENS, batch_size: int = BATCH_SIZE,
    sigmas: Sequence[float] = ICL_SIGMAS, outliers: Sequence[tuple[float, int]] = ICL_OUTLIERS,
    icl_length: int = ICL_POINTS, prompts: int = ICL_PROMPTS, device: str = DEVICE, dtype: str = DTYPE,
    allow_download: bool = False, allow_pickle: bool = False, trust_remote_code: bool = False,
    offline: bool = False, revision: str | None = None,
    device_map: str | None = None, max_memory: MaxMemory = None,
    progress: Callable[[str], None] | None = None,
    before_report: QualityReport | dict[str, Any] | str | Path | None = None,
    builtin: bool = True, lm_eval_plan: LMEvalPlan | None = None, random_ids: bool = False,
) -> QualityReport:  # fmt: skip
    """Every measure that applies to both models, and the probe comparison, as one report.
    MODEL references load with ``device`` … ``max_memory`` (:class:`~ssacli.models.options.LoadOptions`).

    ``text_id`` / ``text_ood``: texts for LM loss in and out of distribution, as strings or as the
    paths of UTF-8 files (a ``Path``: read here, and named in ``settings``); ``heldout_of``: a
    training ``--data`` whose held-out last tenth is ``text_id``; ``pairs``: a BLiMP-style file,
    folder (named in ``settings``) or records; ICL models get their error by σ and with outliers. With
    ``builtin`` (the default), language models that get neither text also get the perplexity of the
    built-in texts (``lm_builtin``), and without ``pairs`` the built-in minimal pairs
    (:mod:`ssacli.quality.builtin`); ``settings["builtin"]`` names what was used. Probes run
    on both models with the same ``seed`` (on random token ids with ``random_ids``, which a model
    without a tokenizer needs); ``report["diagnose"]`` is :func:`compare_results` of them. A model
    with non-finite weights is refused as it loads (BrokenModelError), before anything is measured.
    ``before_report``: an earlier report (a QualityReport, its JSON document, or the path of its
    ``--json`` file) of the same BEFORE with the same settings and input files, whose BEFORE
    measurements and probes are reused instead of measured again (a UsageError if anything differs,
    the inputs' names checked before a model loads).
    ``lm_eval_plan``: lm-evaluation-harness tasks run on both models with their scorers
    (:mod:`ssacli.quality.harness`; tasks and their data checked before a model loads), with
    ``report["lm_eval"]["rows"]`` their scores and paired differences (:func:`paired_rows`).
    ``control``: a third model (e.g. the softmax control that ``convert --control`` trained with
    AFTER's budget) measured and probed like the others on the same inputs: ``report.control``,
    ``measurements["control"]``, ``conversion["control"]``, each quality row's ``control`` and
    ``delta_control`` (AFTER − CONTROL), ``report.diagnose_control`` (:func:`compare_results` of
    CONTROL as A and AFTER as B) and ``lm_eval["control_rows"]`` (:func:`paired_rows` of CONTROL and
    AFTER: its ``before`` values are CONTROL's). A CONTROL of another kind than AFTER is an
    InputError, one with another vocabulary when text is measured a UsageError. Without it the
    report is the two-model one, key for key.
    """
    from ..diagnosis.comparison import compare_results
    from ..diagnosis.probes import parse_probe
    from ..diagnosis.run import diagnose, software_versions

    started = time.perf_counter()
    say = progress or (lambda message: None)
    parsed = [parse_probe(p) for p in probes] if probes else None  # bad specs fail before loading
    text_id, text_ood, groups, names = _read_inputs(text_id, text_ood, heldout_of, pairs, pairs_limit)
    earlier = _reusable(before_report, names)
    load = LoadOptions(
        device=device, dtype=dtype, allow_download=allow_download, allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code, device_map=device_map, max_memory=max_memory,
        offline=offline, revision=revision,
    )  # fmt: skip
    if lm_eval_plan is not None:
        say(f"lm-eval: checking {', '.join(lm_eval_plan.tasks)}")
        check_tasks(lm_eval_plan, offline=load.offline)
    lm_eval_settings = lm_eval_plan.as_dict() if lm_eval_plan is not None else None
    models = []
    sides = (("before", before), ("after", after)) + ((("control", control),) if control is not None else ())
    for side, ref in sides:
        say(f"loading {side}: {ref}")
        models.append(ref if isinstance(ref, LoadedModel) else load_with(str(ref), load))
        require_finite_weights(models[-1].model, models[-1].name)
    asked = dict(text=text_id is not None or text_ood is not None, pairs=groups is not None)
    _check_compatible(*models[:2], **asked)
    if control is not None:
        _check_compatible(*models[1:], **asked, names=("AFTER", "CONTROL"))
    if lm_eval_plan is not None:
        for loaded in models:
            check_harness_kind(loaded)
    defaults, notes = {}, []
    if builtin:
        defaults, notes = _builtin_defaults(models, text_id is None and text_ood is None, groups is None)
    if "pairs" in defaults:
        groups = BUILTIN_PAIRS
    text_builtin = builtin_text() if "texts" in defaults else None
    texts = text_id is not None or text_ood is not None or text_builtin is not None or groups is not None
    if control is not None and texts and not _same_vocab(models[1], models[2]):
        raise UsageError(
            f"CONTROL '{models[2].name}' has another vocabulary than AFTER '{models[1].name}': "
            "its per-token losses do not compare; give a control of the same model"
        )
    measured: dict[str, dict[str, Any]] = {side: {} for side, _ in sides}
    diagnosed = []
    for side, loaded in zip(measured, models):
        if side == "before" and earlier is not None:
            from ..diagnosis.result import DiagnoseResult

            probe_names = [str(p) for p in parsed] if parsed else "default"
            settings = dict(seed=seed, samples=samples, seq_len=seq_len, max_tokens=max_tokens,
                            pairs_limit=pairs_limit, probes=probe_names, builtin=defaults,
                            lm_eval=lm_eval_settings)  # fmt: skip
            check_reusable(earlier, loaded.name, settings, text_id, text_ood, groups, text_builtin)
            other = difference(earlier.get("before", {}).get("weights"), loaded.weights, "the report")
            if other is not None:  # the same name, other weights: its measurements are not BEFORE's
                raise UsageError(f"--reuse-before: {other}; measure BEFORE again (drop --reuse-before)")
            measured["before"] = earlier["measurements"]["before"]
            diagnosed.append(DiagnoseResult.from_dict(earlier["diagnose"]["a"]))
            say(f"before: reused from an earlier report of {loaded.name}")
            continue
        out = measured[side]
        if loaded.kind == ModelKind.ICL:
            say(f"{side}: ICL error by σ and outlier")
            out["icl"] = icl_error_by_sigma(
                loaded, sigmas=sigmas, outliers=outliers, length=icl_length, prompts=prompts, seed=seed
            )
        lm = dict(seq_len=seq_len, max_tokens=max_tokens, batch_size=batch_size, seed=seed)
        for key, text in (("lm_id", text_id), ("lm_ood", text_ood), ("lm_builtin", text_builtin)):
            if text is not None:
                say(f"{side}: LM loss on {key.removeprefix('lm_')} text")
                out[key] = language_model_loss(loaded, text, **lm)
        if groups is not None:
            say(f"{side}: minimal pairs")
            out["pairs"] = minimal_pairs(loaded, groups, limit=pairs_limit, batch_size=4 * batch_size)
            if "pairs" in defaults:
                out["pairs"]["source"] = BUILTIN_PAIRS_NAME
        if lm_eval_plan is not None:
            say(f"{side}: lm-eval {', '.join(lm_eval_plan.tasks)}")
            out["lm_eval"] = run_plan(loaded, lm_eval_plan, seed=seed, offline=load.offline)
        say(f"{side}: attention probes")
        diagnosed.append(diagnose(loaded, parsed, seed=seed, samples=samples, random_ids=random_ids))
    if texts and not _same_vocab(*models[:2]):
        notes.append("BEFORE and AFTER have different tokenizers: per-token losses do not compare")
    settings = dict(
        seed=seed,
        samples=samples,
        seq_len=seq_len,
        max_tokens=max_tokens,
        pairs_limit=pairs_limit,
        probes=[str(p) for p in parsed] if parsed else "default",
        icl_sigmas=list(sigmas),
        icl_outliers=[list(o) for o in outliers],
        icl_length=icl_length,
        icl_prompts=prompts,
        builtin=defaults,
        lm_eval=lm_eval_settings,
        **names,
    )  # fmt: skip
    report = QualityReport(
        before=_describe(models[0], diagnosed[0]),
        after=_describe(models[1], diagnosed[1]),
        settings=settings,
        quality=quality_rows(measured["before"], measured["after"], measured.get("control")),
        measurements=measured,
        diagnose=compare_results(*diagnosed[:2]),
        notes=notes,
        conversion={side: conversion_record(m) for side, m in zip(measured, models)},
        versions=software_versions(),
        elapsed_s=round(time.perf_counter() - started, 3),
    )
    if control is not None:
        report.control = _describe(models[2], diagnosed[2])
        report.diagnose_control = compare_results(diagnosed[2], diagnosed[1])  # A CONTROL, B AFTER
    if lm_eval_plan is not None:
        rows = paired_rows(measured["before"]["lm_eval"], measured["after"]["lm_eval"])
        report.lm_eval = {"settings": lm_eval_settings, "rows": rows}
        if control is not None:
            after_runs = measured["after"]["lm_eval"]
            report.lm_eval["control_rows"] = paired_rows(measured["control"]["lm_eval"], after_runs)
    return report


def _read_inputs(
    text_id, text_ood, heldout_of, pairs, pairs_limit: int | None
) -> tuple[str | None, str | None, Any, dict[str, str | None]]:
    """The texts and pairs to measure on (files read, every one before a model loads), and the names
    ``settings`` records for them: ``pairs`` (given as a file or folder), then ``text_id``,
    ``text_ood`` (a file's path, ``heldout:DATA``, or None for a text given as a string)."""
    if heldout_of is not None and text_id is not None:
        raise UsageError("give either --text-id or --heldout-of, not both")
    texts, names = {}, {}
    for key, value, option in (("text_id", text_id, "--text-id"), ("text_ood", text_ood, "--text-ood")):
        texts[key] = read_text_file(value, option) if isinstance(value, Path) else value
        names[key] = str(value) if isinstance(value, Path) else None
    if heldout_of is not None:
        from ..train.data import heldout_text

        texts["text_id"], names["text_id"] = heldout_text(heldout_of), f"heldout:{heldout_of}"
    named = isinstance(pairs, str | Path)
    groups = read_pairs(pairs, pairs_limit) if named else pairs
    return texts["text_id"], texts["text_ood"], groups, {**({"pairs": str(pairs)} if named else {}), **names}


def _reusable(report: QualityReport | dict[str, Any] | str | Path | None, names: dict[str, str | None]):
    """``before_report`` as its JSON document (read when a path), once the input files it was
    measured on are the ones given (the rest is :func:`check_reusable`'s, once BEFORE is loaded)."""
    if report is None:
        return None
    if isinstance(report, QualityReport):
        report = report.to_dict()
    elif isinstance(report, str | Path):
        report = read_report(report)
    recorded = report.get("settings", {})
    for key in ("text_id", "text_ood", "pairs"):
        if recorded.get(key) != names.get(key):
            raise UsageError(
                f"--reuse-before: the report's {key} is {recorded.get(key)!r}, not {names.get(key)}"
            )
    return report


def check_reusable(
    report: dict[str, Any], name: str, settings: dict[str, Any], text_id, text_ood, groups,
    text_builtin=None,
) -> None:  # fmt: skip
    """UsageError unless ``report`` measured BEFORE ``name`` with the same settings and inputs."""
    if report.get("schema") != REPORT_SCHEMA or report.get("before", {}).get("model") != name:
        raise UsageError(f"--reuse-before: the report is not one of BEFORE {name}")
    recorded = report.get("settings", {})
    differ = [k for k, v in settings.items() if recorded.get(k) != v]
    measured = report.get("measurements", {}).get("before", {})
    given_inputs = (("lm_id", text_id), ("lm_ood", text_ood), ("lm_builtin", text_builtin), ("pairs", groups))
    for key, given in given_inputs:
        if (given is not None) != (key in measured):
            differ.append(key)
    if differ:
        raise UsageError(f"--reuse-before: the report was measured with other settings ({', '.join(differ)})")


def conversion_record(loaded: LoadedModel) -> dict[str, Any]:
    """What ssacli.json says about how a folder was made: its conversion fidelity (with the m chosen
    per layer) and, for fine-tuned folders, the training trajectory (one record per evaluation:
    loss, held-out loss, KL to the source model, b and n per layer). Empty for other models."""
    from ..models.checkpoint import read_meta

    meta = read_meta(loaded.path) if loaded.path is not None and loaded.kind != ModelKind.ICL else None
    if not meta:
        return {}
    training = meta.get("training") or {}
    record = {"source": meta.get("source"), "fidelity": meta.get("fidelity")}
    recipe = meta.get("recipe")
    if recipe:  # a recipe conversion (ssacli.train.recipe): its stages are the trajectory
        from ..train.recipe import recipe_trajectory

        record["trajectory"] = recipe_trajectory(recipe)
        record["recipe"] = {k: recipe.get(k) for k in ("config", "final", "seconds", "snapshot", "heldout")}
        if recipe.get("control"):  # a softmax control (recipe_facts says so); an SSA arm's record as it was
            record["recipe"]["control"] = True
    if training:
        record["trajectory"] = training.get("trajectory") or []
        keys = ("step", "steps", "seconds", "tokens", "tokens_per_s")
        keys += ("heldout_start", "heldout_end", "worsened")  # worsened: held-out loss ended above its start
        record["training"] = {k: training.get(k) for k in keys}
        record["training"]["config"] = training.get("config")
        if training.get("monitor"):  # --monitor-every: saturation measured during the run
            record["monitor"] = training["monitor"]
        best = training.get("best")
        if best:  # where the run kept its best evaluated checkpoint (a fine-tune that worsened)
            record["training"]["best"] = {**best, "path": str(Path(loaded.path) / best["folder"])}
    return record


def _check_compatible(
    a: LoadedModel, b: LoadedModel, *, text: bool, pairs: bool, names: tuple[str, str] = ("BEFORE", "AFTER")
) -> None:
    if a.kind != b.kind:
        raise InputError(
            f"{names[0]} '{a.name}' is a {a.kind} model and {names[1]} '{b.name}' a {b.kind} one; "
            "compare models of one kind"
        )
    for option, asked in (("--text-id/--text-ood", text), ("--pairs", pairs)):
        if asked and a.kind not in LM_KINDS:
            raise UsageError(f"{option} needs causal or masked language models; '{a.name}' is {a.kind}")


def _builtin_defaults(
    models: Sequence[LoadedModel], texts: bool, pairs: bool
) -> tuple[dict[str, str], list[str]]:
    """Which built-in measures apply, ({"texts": name, "pairs": name}, notes): those the user gave no
    data for, on language models whose tokenizers can score text. A language model without one gets
    a note, not an error: the user asked for nothing."""
    if not (texts or pairs) or any(m.kind not in LM_KINDS for m in models):
        return {}, []

    def scores_text(m: LoadedModel) -> bool:
        return m.tokenizer is not None and (
            m.kind != ModelKind.MASKED or m.tokenizer.mask_token_id is not None
        )

    unable = [m.name for m in models if not scores_text(m)]
    if unable:
        names = " and ".join(unable)
        return {}, [f"no built-in quality measures: {names} has no tokenizer that can score text"]
    chosen = {}
    if texts:
        chosen["texts"] = BUILTIN_TEXTS_NAME
    if pairs:
        chosen["pairs"] = BUILTIN_PAIRS_NAME
    return chosen, []


def _same_vocab(a: LoadedModel, b: LoadedModel) -> bool:
    if a.tokenizer is None or b.tokenizer is None:
        return a.tokenizer is b.tokenizer
    return a.tokenizer.get_vocab() == b.tokenizer.get_vocab()


def _describe(loaded: LoadedModel, result) -> dict[str, Any]:
    return {"model": loaded.name, "weights": loaded.weights, "family": loaded.family, "kind": loaded.kind,
            "scorer": result.scorer}  # fmt: skip


__all__ = ["compare_models", "quality_rows"]
