"""``ssacli.diagnose``: run the probes over a model and reduce every attention row as it passes.

(This module is named ``diagnosis`` so that importing it does not shadow the function.)

It holds the run: checking the options and routing the model, then three steps in this order, each
returning one value: plan (:func:`~ssacli.diagnosis.plan.plan_run`, in :mod:`ssacli.diagnosis.plan`:
a :class:`~ssacli.diagnosis.plan.RunPlan`, each probe level's inputs), execute (:func:`_execute`:
the forwards, level by level, each level's :class:`~ssacli.diagnosis.recorder.Recorder` reduced to a
:class:`LevelMeasure`) and aggregate (:func:`_assemble`: a
:class:`~ssacli.diagnosis.probe_result.ProbeResult` per probe, built once from its levels, in the
:class:`~ssacli.diagnosis.result.DiagnoseResult`). One forward pass under a probe, and the recorder
that reduces its attention, are in :mod:`ssacli.diagnosis.forward`.

Two routes to the weights (:mod:`ssacli.diagnosis.routes`: ssacli's attention function, or a
family's own eager attention), one reduction (:mod:`ssacli.diagnosis.metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from ..attention.interface import CONFIG_SPEC_ATTR
from ..defaults import DEFAULT_MODEL
from ..errors import UnsupportedModelError, UsageError
from ..models.icl_task import TOKENS_PER_POINT
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, as_loaded
from ..models.options import LoadOptions
from ..setting import settings_from
from ..version import software_versions
from .forward import OutputReference, forward_batch
from .generation import generate
from .metrics import LAYER_METRICS, METRICS
from .outputs import reference_index
from .plan import RunPlan, describe_inputs, plan_run
from .positions import PositionProfiles, run_bins
from .probe_kinds import ActsOn, Probe, default_probes, parse_probe, scorer_insensitivity
from .probe_result import ProbeResult
from .recorder import Recorder
from .result import DiagnoseResult
from .routes import Route, absorber, choose_route, route_through_ssacli, route_unaudited_reason
from .row_metrics import PromptStats, position_profiles
from .settings import DiagnoseSettings
from .shift import with_shift

Progress = Callable[[str, int, int], None]  # (what, done, total)


def diagnose(
    model: str | Path | nn.Module | LoadedModel = DEFAULT_MODEL,
    probes: Sequence[str | Probe] | None = None,
    *,
    tokenizer: Any = None,
    progress: Progress | None = None,
    **settings: Any,
) -> DiagnoseResult:
    """Probe ``model`` and return per probe level × layer × head saturation metrics.

    ``model``: a path, ``builtin:NAME``, a Hub id (``org/name``, ``org/name@REV``), a transformers
    model or an ICL model (``tokenizer``: an in-memory model's); ``result.weights`` records which
    weights (Hub commit or content hash). ``probes``: specs such as ``"embed-scale:1,4,16"`` (default:
    every probe that applies). ``progress(what, done, total)`` is called as the forwards run.
    The other keywords are :func:`diagnose_with`'s two values, by name:
    :class:`~ssacli.diagnosis.settings.DiagnoseSettings`' (``scorer``: re-score the model's attention
    with this spec first, e.g. ``"ssa:init=faithful"``; inputs: the built-in texts, ``text`` (a
    string), ``random_ids``, or ``inputs`` (token-id lists of any lengths; batches are padded and
    padding is excluded from every metric); ``shift``: a shifted corpus (a string; ``shift_name``
    names it in reports): adds the ``shift`` probe, the reference text's documents against the
    corpus's, matched in length, with each document's loss and collapse
    (:mod:`ssacli.diagnosis.shift`); ``samples``, ``length``, ``batch_size``, ``seed``; ``tau``,
    ``top_k``, ``block_size``; ``stats``: how each attention call's weights become metrics —
    ``"eager"`` reduces blocks of weights, ``"fused"`` reads per-row running statistics of one blocked
    pass (softmax-of-a-transform scorers: softmax, temperature, SSA, SSMax, sink, softmax1; no
    [rows, keys] tile) and refuses calls it cannot serve, ``"auto"`` takes fused wherever it can;
    ``sink_k``: the first k tokens of the sink and position metrics (sink_share, sink_boost;
    ``DiagnoseResult.position_profiles()``: ssacli.diagnosis.positions); a family the all-family
    audit does not cover is measured and marked (``DiagnoseResult.unaudited``), with ``strict`` it is
    refused instead (UnsupportedModelError); ``generate``: also greedy-generate this many tokens after
    each (unshifted) prompt and measure every decoding step's attention against the KV cache
    (``DiagnoseResult.generation``, :mod:`ssacli.diagnosis.generation`), checked against a full
    recomputation without cache) and :class:`~ssacli.models.options.LoadOptions`' (``device`` …
    ``max_memory``: how a MODEL reference is loaded; ``device_map``: across devices and the disk).
    """
    values = settings_from("diagnose", {"probes": probes, **settings}, DiagnoseSettings, LoadOptions)
    return diagnose_with(model, *values, tokenizer=tokenizer, progress=progress)


def diagnose_with(
    model: str | Path | nn.Module | LoadedModel,
    settings: DiagnoseSettings | None = None,
    load: LoadOptions | None = None,
    *,
    tokenizer: Any = None,
    progress: Progress | None = None,
) -> DiagnoseResult:
    """:func:`diagnose` with its settings as values: what it probes with and how it reduces
    (:class:`~ssacli.diagnosis.settings.DiagnoseSettings`; None: the defaults) and how a MODEL
    reference loads (:class:`~ssacli.models.options.LoadOptions`); ``ssacli diagnose`` builds both
    from its options."""
    settings, load = settings or DiagnoseSettings(), load or LoadOptions()
    probes, scorer, strict = settings.probes, settings.scorer, settings.strict
    started = time.perf_counter()
    probe_list = [p if isinstance(p, Probe) else parse_probe(p) for p in (probes or default_probes())]
    names = [p.name for p in probe_list]
    if len(set(names)) != len(names):
        raise UsageError("each probe may be given once; put all its levels in one --probe NAME:L1,L2")
    probe_list = with_shift(probe_list, settings)
    loaded = as_loaded(model, tokenizer, load)
    root = loaded.attention_root
    route = choose_route(root, loaded.family, scorer)
    unaudited = route_unaudited_reason(getattr(root.config, "model_type", loaded.family), route)
    if unaudited is not None and strict:
        raise UnsupportedModelError(f"{unaudited}; --strict refuses it (drop --strict to measure it, marked)")
    if loaded.kind != ModelKind.ICL and settings.inputs is None and not settings.random_ids:
        loaded.require_tokenizer("probing with text")  # never random ids the user did not ask for
    training = loaded.model.training
    loaded.model.eval()
    undo = route_through_ssacli(root, scorer) if route is Route.SSACLI else None
    try:
        return _run(loaded, probe_list, route, settings, started, progress, unaudited)
    finally:
        if undo is not None:
            undo()
        loaded.model.train(training)


def _run(
    loaded: LoadedModel,
    probes: list[Probe],
    route: Route,
    settings: DiagnoseSettings,
    started: float,
    progress: Progress | None,
    unaudited: str | None,
) -> DiagnoseResult:
    """Plan every probe level's inputs (a :class:`RunPlan`), execute them (:class:`Executed`: a
    :class:`LevelMeasure` per level), generate (``settings.generate``) and assemble the result."""
    steps = settings.generate
    plan = plan_run(loaded, probes, route, settings, steps)
    executed = _execute(loaded, route, plan, settings, progress)
    generation = None
    if steps is not None:  # the probes' prompts, unshifted, shortened to leave room for the tokens
        source = plan.source
        prompts = source.sequences(settings.samples, plan.prompt_length) if source else settings.inputs
        generation = generate(
            loaded, route, plan.layers, plan.heads, [list(p) for p in prompts], steps, tau=settings.tau,
            top_k=settings.top_k, block_size=settings.block_size, stats=settings.stats,
            batch_size=settings.batch_size,
        )  # fmt: skip
    return _assemble(loaded, route, plan, executed, settings, started, generation, unaudited)


# ---- execute: the forwards of each probe level, reduced as they pass ----------------------------


@dataclass
class LevelMeasure:
    """One probe level's forwards, reduced: per-head means [layer, head], rows counted [layer], layer
    metrics [layer], the level's extras (mean LM loss, output KL, tokens), where it overflowed, each
    prompt's collapse [prompt, layer, head], per-input values and, at the reference level, where
    attention lands. A level that did not run is None in its probe's list."""

    metrics: dict[str, np.ndarray]
    rows: np.ndarray
    layer_metrics: dict[str, np.ndarray]
    extras: dict[str, float | None]
    overflow: dict[str, Any] | None
    prompts: np.ndarray | None = None
    per_input: dict[str, list[float]] = field(default_factory=dict)
    positions: PositionProfiles | None = None


@dataclass
class ProbeRun:
    """One probe's levels as they ran: a :class:`LevelMeasure` per level (None where it did not run)
    and why it was skipped or limited."""

    probe: Probe
    levels: list[LevelMeasure | None]
    note: str | None


@dataclass
class Executed:
    """What the forwards measured: one run per probe, and what the run learned on the way."""

    probes: list[ProbeRun]
    calls: dict[str, int]  # attention calls measured by each path ("fused", "eager"), over every probe
    norms_before: dict[int, list[str]]  # per layer: the norms that ran before it (structural)


def _execute(
    loaded: LoadedModel, route: Route, plan: RunPlan, settings: DiagnoseSettings, progress: Progress | None
) -> Executed:
    total, done = plan.total_batches, 0
    runs = []
    calls = {"fused": 0, "eager": 0}
    norms_before: dict[int, list[str]] = {}
    for probe, levels in plan.probes:
        measured: list[LevelMeasure | None] = [None] * len(probe.levels)
        note = None
        # Probes that keep the tokens (they shift embeddings, keys or logits) compare every level's
        # outputs with the first level's; ICL models predict points, not distributions.
        # The reference is the unshifted (neutral) level when it was asked for, else the first; it
        # runs first so that every other level can be compared with it.
        keeps_inputs = probe.kind.acts_on in (ActsOn.EMBEDDINGS, ActsOn.KEYS, ActsOn.LOGITS)
        first = reference_index(probe.name, probe.levels)
        compares = keeps_inputs and loaded.kind != ModelKind.ICL
        reference = OutputReference(probe.levels[first]) if compares else None
        # one prompt per sample; the length probe's longer inputs cut at the base length, so that
        # prompt j is the same tokens at every level (its samples shrink as the length grows)
        lengthens = probe.kind.acts_on is ActsOn.INPUT_LENGTH
        window = plan.length * (TOKENS_PER_POINT if plan.icl else 1) if lengthens else None
        for li in sorted(range(len(probe.levels)), key=lambda i: i != first):
            level = probe.levels[li]
            batches, why = levels[level]
            if batches is None:
                note = why
                continue
            note = note or why
            recorder = Recorder(
                plan.layer_of, tau=settings.tau, top_k=settings.top_k, block_size=settings.block_size,
                causal=loaded.kind == ModelKind.CAUSAL, stats=settings.stats,
                positions=run_bins(plan.length, settings.sink_k),  # where attention lands
                prompts=PromptStats(window),  # each prompt's collapse: the verdict's noise
            )  # fmt: skip
            totals: dict[str, list[float]] = {}
            outputs = []
            for bi, batch in enumerate(batches):
                output = forward_batch(
                    loaded, route, probe, level, batch, recorder, plan.layers, reference, bi
                )
                for key, (value, count) in output.sums.items():
                    acc = totals.setdefault(key, [0.0, 0.0])
                    acc[0] += value
                    acc[1] += count
                outputs.append(output.per_input)
                done += 1
                if progress is not None:
                    progress(f"{probe.name} {level:g}", done, total)
            for path, count in recorder.calls.items():
                calls[path] += count
            norms_before = norms_before or recorder.norms_before
            measured[li] = _measure_level(
                probe, level, li == first, batches, recorder, totals, outputs, plan, lengthens
            )
        runs.append(ProbeRun(probe, measured, note))
    return Executed(runs, calls, norms_before)


def _measure_level(
    probe: Probe, level: float, at_reference: bool, batches: list, recorder: Recorder,
    totals: dict[str, list[float]], outputs: list[dict[str, list[float]]], plan: RunPlan, lengthens: bool,
) -> LevelMeasure:  # fmt: skip
    """One level's recorder reduced to its :class:`LevelMeasure`: the means of its sums; an overflowed
    level keeps only where it overflowed (no finite-looking numbers from an overflowed forward)."""
    layers, heads = len(plan.layers), max(plan.heads)
    metrics = {name: np.full((layers, heads), np.nan) for name in METRICS}
    rows = np.zeros(layers, dtype=np.int64)
    layer_metrics = {name: np.full(layers, np.nan) for name in LAYER_METRICS}
    extras: dict[str, float | None] = {}
    if probe.kind.acts_on in (ActsOn.INPUT_LENGTH, ActsOn.INPUT_CORPUS):
        extras["tokens"] = float(np.mean([float(b.valid.sum(1).float().mean()) for b in batches]))
    if recorder.overflow.first is not None:
        where = dict(recorder.overflow.first)
        if where["layer"] is not None and where["layer"] < layers:
            where["module"] = plan.layers[where["layer"]][0]
        return LevelMeasure(metrics, rows, layer_metrics, extras, where)
    for key, (value, count) in totals.items():
        extras[key] = value / count if count else None
    for layer, stats in recorder.stats.items():
        means = stats.means()
        for name in METRICS:
            metrics[name][layer, : stats.num_heads] = means[name]
        rows[layer] = stats.rows
    for layer, stats in recorder.layers.items():
        for name, value in stats.means().items():
            layer_metrics[name][layer] = value
    # each input's own value, in input order, where every batch gave one (the length probe's longer
    # inputs are cut into prompts elsewhere: one loss per input would not be one per prompt)
    per_input: dict[str, list[float]] = {}
    for key in ("output_kl",) if lengthens else ("loss", "output_kl"):
        if outputs and all(key in values for values in outputs):
            per_input[key] = [v for values in outputs for v in values[key]]
    return LevelMeasure(
        metrics, rows, layer_metrics, extras, None,
        prompts=None if recorder.prompts is None else recorder.prompts.rates(layers, heads),
        per_input=per_input,
        # where attention lands, at the reference (unshifted) level
        positions=position_profiles(probe.name, level, recorder, metrics) if at_reference else None,
    )  # fmt: skip


# ---- aggregate: each probe's levels into its result, the probes into the run's ------------------


def _probe_result(run: ProbeRun, plan: RunPlan, absorbers: list[str | None]) -> ProbeResult:
    """A probe's :class:`ProbeResult`: its levels' measures as [level, layer, head] arrays (NaN where
    a level did not run), per-level extras and per-input values in the order the levels ran."""
    probe, count = run.probe, len(run.probe.levels)
    layers, heads = len(plan.layers), max(plan.heads)
    metrics = {name: np.full((count, layers, heads), np.nan) for name in METRICS}
    rows = np.zeros((count, layers), dtype=np.int64)
    layer_metrics = {name: np.full((count, layers), np.nan) for name in LAYER_METRICS}
    extras: dict[str, list[float | None]] = {}
    per_input: dict[str, list[list[float] | None]] = {}
    first = reference_index(probe.name, probe.levels)
    for li in sorted(range(count), key=lambda i: i != first):
        measure = run.levels[li]
        if measure is None:
            continue
        for name in METRICS:
            metrics[name][li] = measure.metrics[name]
        rows[li] = measure.rows
        for name in LAYER_METRICS:
            layer_metrics[name][li] = measure.layer_metrics[name]
        for key, value in measure.extras.items():
            extras.setdefault(key, [None] * count)[li] = value
        for key, values in measure.per_input.items():
            per_input.setdefault(key, [None] * count)[li] = values
    result = ProbeResult(
        probe.name, [float(v) for v in probe.levels], metrics, rows, extras, run.note,
        layer_metrics=layer_metrics, overflow=[m.overflow if m else None for m in run.levels],
        insensitive=scorer_insensitivity(probe.kind, plan.scorers), absorbers=absorbers,
        positions=run.levels[first].positions if run.levels[first] else None, per_input=per_input,
    )  # fmt: skip
    # each prompt's collapse over the heads not collapsed at the first level: read off the result
    return replace(result, prompt_collapse=result.prompt_collapse_of([m and m.prompts for m in run.levels]))


def _assemble(
    loaded: LoadedModel,
    route: Route,
    plan: RunPlan,
    executed: Executed,
    settings: DiagnoseSettings,
    started: float,
    generation: Any,
    unaudited: str | None,
) -> DiagnoseResult:
    root = loaded.attention_root
    layers = plan.layers
    # Where a probe that did not arrive was absorbed: each layer's normalization, in forward order.
    absorbers = [absorber(executed.norms_before.get(i, []), name) for i, (name, _) in enumerate(layers)]
    return DiagnoseResult(
        model=loaded.name,
        weights=loaded.weights,
        family=loaded.family,
        scorer=getattr(root.config, CONFIG_SPEC_ATTR, None) or "softmax",
        route=route,
        layers=[name for name, _ in layers],
        heads=plan.heads,
        probes=[_probe_result(run, plan, absorbers) for run in executed.probes],
        settings={
            **settings.recorded(),
            "length": plan.length,
            **({"length_asked": plan.length_asked} if plan.length_asked is not None else {}),
            "length_unit": "points" if plan.icl else "tokens",
            "inputs": describe_inputs(loaded, plan.source, settings),
            **({"shift": plan.shift.description} if plan.shift is not None else {}),
            # uniform loss: log V
            "vocab_size": loaded.vocab_size if loaded.kind == ModelKind.CAUSAL else None,
            "device": str(loaded.device),
            **loaded.placement,
            "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
            # --stats as asked, and how many attention calls each path measured (auto: fused where
            # the call allows it)
            "stats": settings.stats,
            "stats_calls": executed.calls,
        },
        versions=software_versions(),
        # to the millisecond, as the JSON keeps it: a report rendered from the saved result then
        # reads exactly as the one rendered from this one (unrounded, 0.15004 s prints "0.2 s" and
        # its saved 0.150 "0.1 s")
        elapsed_s=round(time.perf_counter() - started, 3),
        generation=generation,
        unaudited=unaudited,
    )
