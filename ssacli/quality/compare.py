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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..defaults import (
    LM_SEQ_LEN,
)
from ..errors import UsageError
from ..models.kinds import ModelKind, different_kinds
from ..models.loading import LoadedModel, load_with
from ..models.options import LoadOptions
from ..setting import settings_from
from .builtin import BUILTIN_PAIRS, BUILTIN_PAIRS_NAME, BUILTIN_TEXTS_NAME, builtin_text
from .decision import conversion_decision, in_domain_key, longer_window
from .harness import check_harness_kind, check_tasks, paired_rows, run_plan
from .inputs import LM_KINDS, not_a_language_model, read_report_files
from .measures import icl_error_by_sigma, language_model_loss, minimal_pairs, output_kl
from .result import QualityReport
from .reuse import check_reusable, reusable_report, reused_before
from .rows import quality_rows
from .settings import ReportSettings
from .sides import conversion_record, describe


def compare_models(
    before: str | Path | LoadedModel,
    after: str | Path | LoadedModel,
    control: str | Path | LoadedModel | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    before_report: QualityReport | dict[str, Any] | str | Path | None = None,
    **settings: Any,
) -> QualityReport:
    """Every measure that applies to both models, and the probe comparison, as one report.
    ``settings`` are :func:`compare_models_with`'s two values by name: :class:`ReportSettings`' (what
    is measured, below) and LoadOptions' (MODEL references load with ``device`` … ``max_memory``).

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
    measured, load = settings_from("compare_models", settings, ReportSettings, LoadOptions)
    return compare_models_with(before, after, control, measured, load, progress=progress,
                               before_report=before_report)  # fmt: skip


@dataclass
class _Inputs:
    """What every side is measured on: the texts (a file's content read), the minimal-pair groups, the
    built-in measures chosen (``builtin``: {"texts": name, "pairs": name}) and the input files' names."""

    text_id: str | None
    text_ood: str | None
    groups: Any
    names: dict[str, str | None]
    text_builtin: str | None = None
    builtin: dict[str, str] = field(default_factory=dict)

    @property
    def any_text(self) -> bool:
        return any(x is not None for x in (self.text_id, self.text_ood, self.text_builtin, self.groups))


def compare_models_with(
    before: str | Path | LoadedModel,
    after: str | Path | LoadedModel,
    control: str | Path | LoadedModel | None,
    settings: ReportSettings,
    load: LoadOptions,
    *,
    progress: Callable[[str], None] | None = None,
    before_report: QualityReport | dict[str, Any] | str | Path | None = None,
) -> QualityReport:
    """:func:`compare_models` with its settings as values: what is measured (:class:`ReportSettings`)
    and how MODEL references load (:class:`~ssacli.models.options.LoadOptions`); ``ssacli report``
    builds both from its flags and calls this."""
    from ..diagnosis.probe_kinds import parse_probe

    started = time.perf_counter()
    say = progress or (lambda message: None)
    parsed = [parse_probe(p) for p in settings.probes] if settings.probes else None  # fail before loading
    probe_names = [str(p) for p in parsed] if parsed else "default"
    inputs = _Inputs(*_read_inputs(settings.text_id, settings.text_ood, settings.heldout_of, settings.pairs,
                                   settings.pairs_limit))  # fmt: skip
    earlier = reusable_report(before_report, inputs.names)
    plan = settings.lm_eval_plan
    if plan is not None:
        say(f"lm-eval: checking {', '.join(plan.tasks)}")
        check_tasks(plan, offline=load.offline)
    sides = ("before", "after") + (("control",) if control is not None else ())
    models = _load_sides(dict(zip(sides, (before, after, control))), load, say)
    notes = _choose_inputs(models, inputs, settings)
    measured: dict[str, dict[str, Any]] = {side: {} for side in sides}
    diagnosed = []
    for side, loaded in zip(sides, models):
        if side == "before" and earlier is not None:
            check_reusable(earlier, loaded.name, settings.reuse_key(probe_names, inputs.builtin),
                           inputs.text_id, inputs.text_ood, inputs.groups, inputs.text_builtin)  # fmt: skip
            measured["before"], reused = reused_before(earlier, loaded)
            diagnosed.append(reused)
            say(f"before: reused from an earlier report of {loaded.name}")
            continue
        measured[side] = _measure(side, loaded, inputs, settings, load, say, decide=control is not None)
        if side == "after" and conversion_record(loaded):  # a converted model: its KL to BEFORE now
            _measure_kl(models[0], loaded, inputs, settings, measured[side], say, side)
        say(f"{side}: attention probes")
        diagnosed.append(_probe(loaded, parsed, settings))
    if inputs.any_text and not _same_vocab(*models[:2]):
        notes.append("BEFORE and AFTER have different tokenizers: per-token losses do not compare")
    recorded = settings.recorded(probe_names, inputs.builtin, inputs.names)
    report = _assemble(models, measured, diagnosed, recorded, notes, lm_eval=settings.lm_eval_settings())
    report.elapsed_s = round(time.perf_counter() - started, 3)
    return report


def _load_sides(refs: dict[str, Any], load: LoadOptions, say: Callable[[str], None]) -> list[LoadedModel]:
    """BEFORE, AFTER and (when given) CONTROL loaded in that order, each refused as it loads unless whole
    (:func:`ssacli.models.integrity.require_whole`)."""
    models = []
    for side, ref in refs.items():
        if ref is None:
            continue
        say(f"loading {side}: {ref}")
        models.append(ref if isinstance(ref, LoadedModel) else load_with(str(ref), load))
    return models


def _choose_inputs(models: list[LoadedModel], inputs: _Inputs, settings: ReportSettings) -> list[str]:
    """Check the models compare on what was asked (one kind; a CONTROL with AFTER's vocabulary where text
    is measured; models the harness scores), pick the built-in measures into ``inputs``, and return the
    report's notes so far."""
    no_text = inputs.text_id is None and inputs.text_ood is None
    asked = dict(text=not no_text, pairs=inputs.groups is not None)
    _check_compatible(*models[:2], **asked)
    if len(models) > 2:
        _check_compatible(*models[1:], **asked, names=("AFTER", "CONTROL"))
    if settings.lm_eval_plan is not None:
        for loaded in models:
            check_harness_kind(loaded)
    notes = []
    if settings.builtin:
        inputs.builtin, notes = _builtin_defaults(models, no_text, inputs.groups is None)
    if "pairs" in inputs.builtin:
        inputs.groups = BUILTIN_PAIRS
    inputs.text_builtin = builtin_text() if "texts" in inputs.builtin else None
    if len(models) > 2 and inputs.any_text and not _same_vocab(models[1], models[2]):
        raise UsageError(
            f"CONTROL '{models[2].name}' has another vocabulary than AFTER '{models[1].name}': "
            "its per-token losses do not compare; give a control of the same model"
        )
    return notes


def _measure(side: str, loaded: LoadedModel, inputs: _Inputs, settings: ReportSettings, load: LoadOptions,
             say: Callable[[str], None], decide: bool = False) -> dict[str, Any]:  # fmt: skip
    """Every quality measure that applies to one side's model: ICL error, LM loss on each text,
    minimal pairs, lm-eval tasks; with ``decide`` (a CONTROL was given) also the in-domain text at a
    longer context where the model's positions allow (:func:`~ssacli.quality.decision.longer_window`)."""
    out: dict[str, Any] = {}
    if loaded.kind == ModelKind.ICL:
        say(f"{side}: ICL error by σ and outlier")
        out["icl"] = icl_error_by_sigma(
            loaded, sigmas=settings.sigmas, outliers=settings.outliers, length=settings.icl_length,
            prompts=settings.prompts, seed=settings.seed,
        )  # fmt: skip
    lm = dict(seq_len=settings.seq_len, max_tokens=settings.max_tokens, batch_size=settings.batch_size,
              seed=settings.seed)  # fmt: skip
    texts = (("lm_id", inputs.text_id), ("lm_ood", inputs.text_ood), ("lm_builtin", inputs.text_builtin))
    for key, text in texts:
        if text is not None:
            say(f"{side}: LM loss on {key.removeprefix('lm_')} text")
            out[key] = language_model_loss(loaded, text, **lm)
    home = in_domain_key(out)
    longer = longer_window(loaded.max_positions, settings.seq_len) if decide and home else None
    if longer is not None:  # the same text, windows twice as long: how quality holds with length
        say(f"{side}: LM loss at {longer} tokens")
        out[f"{home}_long"] = language_model_loss(loaded, dict(texts)[home], **{**lm, "seq_len": longer})
    if inputs.groups is not None:
        say(f"{side}: minimal pairs")
        out["pairs"] = minimal_pairs(
            loaded, inputs.groups, limit=settings.pairs_limit, batch_size=4 * settings.batch_size
        )
        if "pairs" in inputs.builtin:
            out["pairs"]["source"] = BUILTIN_PAIRS_NAME
    if settings.lm_eval_plan is not None:
        say(f"{side}: lm-eval {', '.join(settings.lm_eval_plan.tasks)}")
        out["lm_eval"] = run_plan(loaded, settings.lm_eval_plan, seed=settings.seed, offline=load.offline)
    return out


def _measure_kl(before: LoadedModel, loaded: LoadedModel, inputs: _Inputs, settings: ReportSettings,
                out: dict[str, Any], say: Callable[[str], None], side: str) -> None:  # fmt: skip
    """KL(BEFORE ‖ this side) per token on the in-domain text, measured now (the header's fidelity
    of the final model; ssacli.json's is the conversion's start): causal LMs with a text only."""
    home = in_domain_key(out)
    if home is None or before.kind != ModelKind.CAUSAL or loaded.kind != ModelKind.CAUSAL:
        return
    if not _same_vocab(before, loaded):
        return
    text = {"lm_id": inputs.text_id, "lm_builtin": inputs.text_builtin}[home]
    say(f"{side}: KL to BEFORE on {home.removeprefix('lm_')} text")
    kl = output_kl(before, loaded, text, seq_len=settings.seq_len, max_tokens=settings.max_tokens,
                   batch_size=settings.batch_size)  # fmt: skip
    out["kl_to_before"] = {**kl, "text": home}


def _probe(loaded: LoadedModel, parsed, settings: ReportSettings):
    """The diagnose probes on one side's model, with the report's seed and samples."""
    from ..diagnosis.run import diagnose

    seed, samples, random_ids = settings.seed, settings.samples, settings.random_ids
    return diagnose(loaded, parsed, seed=seed, samples=samples, random_ids=random_ids)


def _assemble(models: list[LoadedModel], measured: dict[str, dict[str, Any]], diagnosed: list, settings: dict,
              notes: list[str], lm_eval: dict[str, Any] | None) -> QualityReport:  # fmt: skip
    """The report of the measured sides: the quality rows, the probe comparison (and CONTROL's against
    AFTER), each side's conversion record, lm-eval's paired rows."""
    from ..diagnosis.comparison import compare_results
    from ..version import software_versions

    report = QualityReport(
        before=describe(models[0], diagnosed[0]),
        after=describe(models[1], diagnosed[1]),
        settings=settings,
        quality=quality_rows(measured["before"], measured["after"], measured.get("control")),
        measurements=measured,
        diagnose=compare_results(*diagnosed[:2]),
        notes=notes,
        conversion={side: conversion_record(m) for side, m in zip(measured, models)},
        versions=software_versions(),
        elapsed_s=0.0,  # the caller's clock
    )
    if len(models) > 2:
        report.control = describe(models[2], diagnosed[2])
        report.diagnose_control = compare_results(diagnosed[2], diagnosed[1])  # A CONTROL, B AFTER
        if "control" in measured and models[0].kind in LM_KINDS:
            seq_len = settings.get("seq_len") or LM_SEQ_LEN
            report.decision = conversion_decision(measured, diagnosed[1], diagnosed[2], seq_len)
    if lm_eval is not None:
        rows = paired_rows(measured["before"]["lm_eval"], measured["after"]["lm_eval"])
        report.lm_eval = {"settings": lm_eval, "rows": rows}
        if len(models) > 2:
            after_runs = measured["after"]["lm_eval"]
            report.lm_eval["control_rows"] = paired_rows(measured["control"]["lm_eval"], after_runs)
    return report


def _read_inputs(
    text_id, text_ood, heldout_of, pairs, pairs_limit: int | None
) -> tuple[str | None, str | None, Any, dict[str, str | None]]:
    """The texts and pairs to measure on (files read, every one before a model loads), and the names
    ``settings`` records for them: ``pairs`` (given as a file or folder), then ``text_id``,
    ``text_ood`` (a file's path, ``heldout:DATA``, or None for a text given as a string)."""
    texts, groups, names = read_report_files(text_id, text_ood, pairs, pairs_limit, heldout_of=heldout_of)
    if heldout_of is not None:
        from ..train.data import heldout_text

        texts["text_id"], names["text_id"] = heldout_text(heldout_of), f"heldout:{heldout_of}"
    return texts["text_id"], texts["text_ood"], groups, names


def _check_compatible(
    a: LoadedModel, b: LoadedModel, *, text: bool, pairs: bool, names: tuple[str, str] = ("BEFORE", "AFTER")
) -> None:
    if a.kind != b.kind:
        raise different_kinds(names, (a.name, b.name), (a.kind, b.kind))
    for option, asked in (("--text-id/--text-ood", text), ("--pairs", pairs)):
        if asked and a.kind not in LM_KINDS:
            raise not_a_language_model(option, a.name, a.kind)


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


__all__ = ["compare_models", "compare_models_with", "quality_rows"]
