"""``ssacli.diagnose``: run the probes over a model and reduce every attention row as it passes.

(This module is named ``diagnosis`` so that importing it does not shadow the function.)

It holds the run: checking the options, routing the model, planning each probe level's inputs,
looping over them and assembling the :class:`~ssacli.diagnosis.result.DiagnoseResult`. One forward pass
under a probe, and the :class:`~ssacli.diagnosis.forward.Recorder` that reduces its attention, are in
:mod:`ssacli.diagnosis.forward`.

Two routes to the weights (:mod:`ssacli.diagnosis.routes`: ssacli's attention function, or a
family's own eager attention), one reduction (:mod:`ssacli.diagnosis.metrics`).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import defaults
from ..attention.interface import CONFIG_SPEC_ATTR, apply_scorer, reattach, scorers_of
from ..defaults import DEFAULT_MODEL
from ..errors import UnsupportedModelError, UsageError
from ..models.device_map import MaxMemory
from ..models.icl_task import TOKENS_PER_POINT
from ..models.integrity import require_finite_weights
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, as_loaded
from ..models.options import LoadOptions
from ..scorers import make_scorer
from ..version import __version__
from .forward import OutputReference, Recorder, forward_batch
from .generation import check_generate, generate
from .metrics import LAYER_METRICS, METRICS
from .outputs import reference_index
from .probe_result import ProbeResult
from .probes import (
    PROBES,
    ActsOn,
    Probe,
    ProbeBatch,
    TokenSource,
    default_probes,
    icl_batches,
    numeric_sequences,
    pad_sequences,
    parse_probe,
    pick_targets,
    scorer_insensitivity,
)
from .result import DiagnoseResult
from .routes import Route, absorber, attention_layers, choose_route, layer_heads, route_unaudited_reason
from .settings import DiagnoseSettings

Progress = Callable[[str, int, int], None]  # (what, done, total)


def diagnose(
    model: str | Path | nn.Module | LoadedModel = DEFAULT_MODEL,
    probes: Sequence[str | Probe] | None = None,
    *,
    scorer: str | None = None,
    text: str | None = None,
    random_ids: bool = False,
    inputs: Sequence[Sequence[int]] | None = None,
    tokenizer: Any = None,
    samples: int = defaults.SAMPLES,
    length: int | None = None,
    batch_size: int = defaults.BATCH_SIZE,
    seed: int = defaults.SEED,
    tau: float = defaults.TAU,
    top_k: int = defaults.TOP_K,
    block_size: int = defaults.BLOCK_ROWS,
    stats: str = defaults.STATS,
    device: str = defaults.DEVICE,
    dtype: str = defaults.DTYPE,
    allow_download: bool = False,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    device_map: str | None = None,
    max_memory: MaxMemory = None,
    offline: bool = False,
    revision: str | None = None,
    strict: bool = False,
    generate: int | None = None,
    progress: Progress | None = None,
) -> DiagnoseResult:
    """Probe ``model`` and return per probe level × layer × head saturation metrics.

    ``model``: a path, ``builtin:NAME``, a Hub id (``org/name``, ``org/name@REV``), a transformers
    model or an ICL model; ``result.weights`` records which weights (Hub commit or content hash).
    ``probes``: specs such as ``"embed-scale:1,4,16"`` (default: every probe that applies).
    ``scorer``: re-score the model's attention with this spec first (e.g. ``"ssa:init=faithful"``).
    Inputs: the built-in texts, ``text`` (a string), ``random_ids``, or ``inputs`` (token-id lists of
    any lengths; batches are padded and padding is excluded from every metric).
    ``device`` … ``max_memory`` say how a MODEL reference is loaded
    (:class:`~ssacli.models.options.LoadOptions`; ``device_map``: across devices and the disk).
    A family the all-family audit does not cover is measured and marked
    (``DiagnoseResult.unaudited``); with ``strict`` it is refused instead (UnsupportedModelError).
    ``stats``: how each attention call's weights become metrics —
    ``"eager"`` reduces blocks of weights, ``"fused"`` reads per-row running statistics of one blocked
    pass (softmax-of-a-transform scorers: softmax, temperature, SSA, SSMax, sink, softmax1; no
    [rows, keys] tile) and refuses calls it cannot serve, ``"auto"`` takes fused wherever it can.
    ``generate``: also greedy-generate this many tokens after each (unshifted) prompt and measure
    every decoding step's attention against the KV cache (``DiagnoseResult.generation``,
    :mod:`ssacli.diagnosis.generation`), checked against a full recomputation without cache.
    """
    settings = DiagnoseSettings(
        text=text, random_ids=random_ids, inputs=inputs, samples=samples, length=length,
        batch_size=batch_size, seed=seed, tau=tau, top_k=top_k, block_size=block_size, stats=stats,
    )  # fmt: skip
    load = LoadOptions(
        device=device, dtype=dtype, allow_download=allow_download, allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code, device_map=device_map, max_memory=max_memory,
        offline=offline, revision=revision,
    )  # fmt: skip
    return diagnose_with(model, probes, settings, load, scorer=scorer, tokenizer=tokenizer, strict=strict,
                         generate=generate, progress=progress)  # fmt: skip


def diagnose_with(
    model: str | Path | nn.Module | LoadedModel,
    probes: Sequence[str | Probe] | None,
    settings: DiagnoseSettings,
    load: LoadOptions,
    *,
    scorer: str | None = None,
    tokenizer: Any = None,
    strict: bool = False,
    generate: int | None = None,
    progress: Progress | None = None,
) -> DiagnoseResult:
    """:func:`diagnose` with its settings as values: what it probes with and how it reduces
    (:class:`~ssacli.diagnosis.settings.DiagnoseSettings`) and how a MODEL reference loads
    (:class:`~ssacli.models.options.LoadOptions`); ``ssacli diagnose`` builds both from its flags."""
    started = time.perf_counter()
    probe_list = [p if isinstance(p, Probe) else parse_probe(p) for p in (probes or default_probes())]
    names = [p.name for p in probe_list]
    if len(set(names)) != len(names):
        raise UsageError("each probe may be given once; put all its levels in one --probe NAME:L1,L2")
    loaded = as_loaded(model, tokenizer, load)
    root = loaded.attention_root
    route = choose_route(root, loaded.family, scorer)
    unaudited = route_unaudited_reason(getattr(root.config, "model_type", loaded.family), route)
    if unaudited is not None and strict:
        raise UnsupportedModelError(f"{unaudited}; --strict refuses it (drop --strict to measure it, marked)")
    if loaded.kind != ModelKind.ICL and settings.inputs is None and not settings.random_ids:
        loaded.require_tokenizer("probing with text")  # never random ids the user did not ask for
    require_finite_weights(loaded.model, loaded.name)  # not "overflow at every level"
    training = loaded.model.training
    loaded.model.eval()
    undo = _prepare_scorer(root, scorer) if route is Route.SSACLI else None
    try:
        result = _run(loaded, probe_list, route, settings, started, progress, generate)
        result.unaudited = unaudited
        return result
    finally:
        if undo is not None:
            undo()
        loaded.model.train(training)


def _prepare_scorer(root: nn.Module, scorer: str | None) -> Callable[[], None] | None:
    """Route the model through ssacli's attention function; returns how to put it back."""
    before = scorers_of(root)
    if before and scorer is None:
        return None  # already scored (an ICL or converted model): measure it as it is
    spec_before = getattr(root.config, CONFIG_SPEC_ATTR, None)
    if scorer is None and spec_before and make_scorer(spec_before).needs_calibration:
        # A converted folder loaded by plain transformers: its config names the scorer, but the m
        # chosen per layer lives in the folder's scorer file, which that load does not read.
        raise UsageError(
            f"this model's config names scorer '{spec_before}', whose values per layer were saved in "
            "its folder; diagnose the folder itself (ssacli diagnose DIR, or ssacli.load(DIR)) so they "
            "load, or pass scorer= to measure another"
        )
    apply_scorer(root, scorer or spec_before or "softmax")
    return lambda: reattach(root, before, spec_before)


def _run(
    loaded: LoadedModel,
    probes: list[Probe],
    route: Route,
    settings: DiagnoseSettings,
    started: float,
    progress,
    steps: int | None = None,
) -> DiagnoseResult:
    root = loaded.attention_root
    layers = attention_layers(root, route)
    layer_of = {id(m): i for i, (_, m) in enumerate(layers)}
    heads = [layer_heads(m, root, route) for _, m in layers]
    icl = loaded.kind == ModelKind.ICL
    length = settings.base_length(icl)
    cap = _position_cap(loaded)
    asked = None
    if cap and length > cap:  # said in one line of every report (settings.length_asked), not a title
        asked, length = length, cap
    source = None
    if not icl and settings.inputs is None:
        vocab = getattr(root.config, "vocab_size", None) or 2
        source = TokenSource(
            loaded.tokenizer,
            text=settings.text,
            random_ids=settings.random_ids,
            vocab_size=vocab,
            seed=settings.seed,
        )
    prompt_length = None if steps is None else check_generate(loaded, route, steps, length)
    probes = [_fit_length_levels(p, loaded, length) for p in probes]
    scorers = list(scorers_of(root).values()) if route is Route.SSACLI else []
    plans = [(p, _plan(p, loaded, route, source, length, settings)) for p in probes]
    total = sum(len(batches) for _, plan in plans for batches, _ in plan.values() if batches)
    done = 0
    results = []
    calls = {"fused": 0, "eager": 0}  # attention calls measured by each path, over every probe
    norms_before: dict[int, list[str]] = {}  # per layer: the norms that ran before it (structural)
    for probe, plan in plans:
        metrics = {name: np.full((len(probe.levels), len(layers), max(heads)), np.nan) for name in METRICS}
        rows = np.zeros((len(probe.levels), len(layers)), dtype=np.int64)
        layer_metrics = {name: np.full((len(probe.levels), len(layers)), np.nan) for name in LAYER_METRICS}
        overflow: list[dict | None] = [None] * len(probe.levels)
        extras: dict[str, list[float | None]] = {}
        note = None
        # Probes that keep the tokens (they shift embeddings, keys or logits) compare every level's
        # outputs with the first level's; ICL models predict points, not distributions.
        # The reference is the unshifted (neutral) level when it was asked for, else the first; it
        # runs first so that every other level can be compared with it.
        keeps_inputs = probe.kind.acts_on in (ActsOn.EMBEDDINGS, ActsOn.KEYS, ActsOn.LOGITS)
        reference = OutputReference() if keeps_inputs and loaded.kind != ModelKind.ICL else None
        first = reference_index(probe.name, probe.levels)
        for li in sorted(range(len(probe.levels)), key=lambda i: i != first):
            level = probe.levels[li]
            batches, why = plan[level]
            if batches is None:
                note = why
                continue
            note = note or why
            if probe.kind.acts_on is ActsOn.INPUT_LENGTH:
                real = [float(b.valid.sum(1).float().mean()) for b in batches]
                extras.setdefault("tokens", [None] * len(probe.levels))[li] = float(np.mean(real))
            recorder = Recorder(
                layer_of, tau=settings.tau, top_k=settings.top_k, block_size=settings.block_size,
                causal=loaded.kind == ModelKind.CAUSAL, stats=settings.stats,
            )  # fmt: skip
            totals: dict[str, list[float]] = {}
            if reference is not None:
                reference.recording = li == first
            for bi, batch in enumerate(batches):
                for key, (value, count) in forward_batch(
                    loaded, route, probe, level, batch, recorder, layers, reference, bi
                ).items():
                    acc = totals.setdefault(key, [0.0, 0.0])
                    acc[0] += value
                    acc[1] += count
                done += 1
                if progress is not None:
                    progress(f"{probe.name} {level:g}", done, total)
            for path, count in recorder.calls.items():
                calls[path] += count
            norms_before = norms_before or recorder.norms_before
            if recorder.overflow.first is not None:  # no finite-looking numbers from an overflowed forward
                where = dict(recorder.overflow.first)
                if where["layer"] is not None and where["layer"] < len(layers):
                    where["module"] = layers[where["layer"]][0]
                overflow[li] = where
                continue
            for key, (value, count) in totals.items():
                extras.setdefault(key, [None] * len(probe.levels))[li] = value / count if count else None
            for layer, stats in recorder.stats.items():
                means = stats.means()
                for name in METRICS:
                    metrics[name][li, layer, : stats.num_heads] = means[name]
                rows[li, layer] = stats.rows
            for layer, stats in recorder.layers.items():
                for name, value in stats.means().items():
                    layer_metrics[name][li, layer] = value
        results.append(
            ProbeResult(
                probe.name, [float(v) for v in probe.levels], metrics, rows, extras, note,
                layer_metrics=layer_metrics, overflow=overflow,
                insensitive=scorer_insensitivity(probe.kind, scorers),
            )
        )  # fmt: skip
    # Where a probe that did not arrive was absorbed: each layer's normalization, in forward order.
    absorbers = [absorber(norms_before.get(i, []), name) for i, (name, _) in enumerate(layers)]
    for result in results:
        result.absorbers = absorbers
    generation = None
    if steps is not None:  # the probes' prompts, unshifted, shortened to leave room for the tokens
        prompts = source.sequences(settings.samples, prompt_length) if source else settings.inputs
        generation = generate(
            loaded, route, layers, heads, [list(p) for p in prompts], steps, tau=settings.tau,
            top_k=settings.top_k, block_size=settings.block_size, stats=settings.stats,
            batch_size=settings.batch_size,
        )  # fmt: skip
    return DiagnoseResult(
        model=loaded.name,
        weights=loaded.weights,
        family=loaded.family,
        scorer=getattr(root.config, CONFIG_SPEC_ATTR, None) or "softmax",
        route=route,
        layers=[name for name, _ in layers],
        heads=heads,
        probes=results,
        settings={
            **settings.recorded(),
            "length": length,
            **({"length_asked": asked} if asked is not None else {}),
            "length_unit": "points" if icl else "tokens",
            "inputs": _describe_inputs(loaded, source, settings),
            "vocab_size": _vocab_size(root)
            if loaded.kind == ModelKind.CAUSAL
            else None,  # uniform loss: log V
            "device": str(loaded.device),
            **_placement(loaded.model),
            "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
            # --stats as asked, and how many attention calls each path measured (auto: fused where
            # the call allows it)
            "stats": settings.stats,
            "stats_calls": calls,
        },
        versions=software_versions(),
        # to the millisecond, as the JSON keeps it: a report rendered from the saved result then
        # reads exactly as the one rendered from this one (0.15004 s printed "0.2 s", its saved 0.150
        # "0.1 s": tests/report/test_render.py failed so, once in a while)
        elapsed_s=round(time.perf_counter() - started, 3),
        generation=generation,
    )


def _placement(model: nn.Module) -> dict[str, Any]:
    """``device_map``: where accelerate put each block, for a model loaded with a device map."""
    placed = getattr(model, "hf_device_map", None)
    return {"device_map": dict(placed)} if placed else {}


def _vocab_size(root: nn.Module) -> int | None:
    config = getattr(root, "config", None)
    size = getattr(getattr(config, "get_text_config", lambda: config)(), "vocab_size", None)
    return size if isinstance(size, int) and size > 1 else None


def _fit_length_levels(probe: Probe, loaded: LoadedModel, length: int) -> Probe:
    """The length probe's default levels double the base length up to the model's maximum
    positions (ICL: points): keep those that fit, and the maximum itself as the last level."""
    kind = probe.kind
    if kind.acts_on is not ActsOn.INPUT_LENGTH or probe.levels != PROBES[probe.name].defaults:
        return probe
    cap = _position_cap(loaded)
    if not cap:
        return probe
    levels = [m for m in probe.levels if length * m <= cap]
    if cap // length > (levels[-1] if levels else 0) and cap // length >= 1:
        levels.append(float(cap // length))
    return Probe(probe.name, tuple(levels or (1.0,)))


def _plan(
    probe: Probe, loaded: LoadedModel, route: Route, source, length: int, settings: DiagnoseSettings
) -> dict:
    """level -> (batches or None, note): the inputs each level runs on, or why it cannot run."""
    kind = probe.kind
    skip = None
    if kind.needs_route and route is not Route.SSACLI:
        skip = f"needs ssacli's attention function; family '{loaded.family}' runs on the eager fallback"
    elif kind.needs_tokenizer and loaded.tokenizer is None:
        skip = (
            "needs a tokenizer (the model folder has none)"
            if loaded.kind != ModelKind.ICL
            else "not for ICL models"
        )
    elif kind.acts_on is ActsOn.INPUT_LENGTH and settings.inputs is not None:
        skip = "not run on explicit inputs (their lengths are given)"
    if skip:
        return {level: (None, skip) for level in probe.levels}
    cap = _position_cap(loaded)
    unit = "points" if loaded.kind == ModelKind.ICL else "positions"
    plan, note = {}, None
    for level in probe.levels:
        size = int(length * level) if kind.acts_on is ActsOn.INPUT_LENGTH else length
        if cap and size > cap:
            size, note = cap, f"inputs capped at the model's {cap} {unit}"
        level_settings = settings
        if kind.acts_on is ActsOn.INPUT_LENGTH and size > length:  # about the same tokens per level
            level_settings = replace(settings, samples=max(1, math.ceil(settings.samples * length / size)))
        batches = _inputs(probe, level, loaded, source, size, level_settings)
        if cap and any(b.input_ids is not None and b.input_ids.shape[1] > cap for b in batches):
            batches = [_truncate(b, cap) for b in batches]
            note = f"inputs truncated to the model's {cap} {unit}"
        if kind.has_target:
            pick_targets(batches, settings.seed)
        plan[level] = (batches, note)
    return plan


def _position_cap(loaded: LoadedModel) -> int | None:
    """The longest input the model's position table covers (ICL: in points); None: no limit known."""
    cap = loaded.max_positions
    if cap and loaded.kind == ModelKind.ICL:
        cap //= TOKENS_PER_POINT
    return cap


def _truncate(batch: ProbeBatch, cap: int) -> ProbeBatch:
    """Keep the first ``cap`` tokens (batches are right-padded, so real tokens come first)."""
    return ProbeBatch(input_ids=batch.input_ids[:, :cap], attention_mask=batch.attention_mask[:, :cap])


def _inputs(
    probe: Probe, level: float, loaded: LoadedModel, source, size: int, settings: DiagnoseSettings
) -> list[ProbeBatch]:
    samples, batch_size, seed = settings.samples, settings.batch_size, settings.seed
    if loaded.kind == ModelKind.ICL:
        return icl_batches(loaded.model.spec.task, samples, size, batch_size, seed)
    pad = loaded.pad_id
    side = "right"  # one forward, no generation: real tokens keep positions 0..n-1 and key 0 (the sink)
    if probe.kind.acts_on is ActsOn.INPUT_TEXT:
        return pad_sequences(
            numeric_sequences(loaded.tokenizer, int(level), samples, seed), pad, batch_size, side
        )
    if settings.inputs is not None:
        return pad_sequences([list(s) for s in settings.inputs], pad, batch_size, side)
    return pad_sequences(source.sequences(samples, size), pad, batch_size, side)


def _describe_inputs(loaded: LoadedModel, source, settings: DiagnoseSettings) -> str:
    if loaded.kind == ModelKind.ICL:
        return f"icl:{loaded.model.spec.task} prompts (seed {settings.seed})"
    if settings.inputs is not None:
        return f"{len(settings.inputs)} given sequences"
    return source.description


def software_versions() -> dict[str, str]:
    """The versions a result was made with (ssacli, torch, transformers, python): every result and
    report records them, for reproduction."""
    import transformers

    return {
        "ssacli": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
