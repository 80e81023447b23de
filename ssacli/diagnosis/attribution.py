"""Attribution by attention-pattern patching: how much of a shift's output damage the attention
patterns of chosen heads carry (docs/diagnose.md, "Attribution by attention-pattern patching").

For a probe that keeps the tokens (``key-scale``, ``logit-scale``, ``dominant-key``, ``embed-scale``,
``outlier``: prompt j is the same tokens at every level), three kinds of forward run on the plan
diagnose would run (:func:`~ssacli.diagnosis.plan.plan_run`, the same prompts, the same probe):

1. the unshifted level, whose every attention call's weights [b, h, q, k] are kept
   (:class:`PatternRecorder`, ``capture``);
2. the shifted level;
3. the shifted level with the unshifted weights put back into the heads of a set S, everything else
   left shifted (:meth:`PatternRecorder.patch`, through :meth:`ssacli.attention.forward.Observer.patch`,
   before the weights multiply the values).

Per prompt, the damage is the next-token loss of (2) minus that of (1), and the damage S removes is
(2) minus (3). Heads are chosen on one half of the prompts (top k by their rise in collapse, heads
already collapsed unshifted left out) and measured on the other half, both ways; the null is random
layer-matched k-sets; the ceiling patches every head. Patching needs the weights: every call runs on
the eager blocks of ssacli's route (no fused kernel), and the unshifted weights of every layer are
held for the run (samples × heads × length² floats per layer).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import defaults
from ..errors import UnsupportedModelError, UsageError
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, as_loaded
from ..models.options import LoadOptions
from ..setting import settings_from
from ..stats import bootstrap_ci, spearman_ci
from .attribution_result import (
    Attribution,
    AttributionSettings,
    Head,
    SetAttribution,
    check_probe,
    check_prompts,
    not_causal,
    unshifted,
)
from .forward import forward_batch
from .patching import PatternRecorder, prompt_losses
from .plan import plan_run
from .probe_kinds import ActsOn, Probe
from .probe_result import COLLAPSE_SHARE
from .routes import Route, choose_route, route_through_ssacli
from .settings import DiagnoseSettings


def attribute(
    model: str | Path | nn.Module | LoadedModel,
    probe: str | Probe = defaults.ATTRIBUTE_PROBE,
    *,
    tokenizer: Any = None,
    **settings: Any,
) -> Attribution:
    """Attribute ``probe``'s output damage at ``level`` (default: its last level other than the
    unshifted one, which must be among its levels) to attention patterns by patching.

    Without ``heads``: the top ``k`` heads by collapse rise are chosen on half A of the prompts and
    measured on half B, and the reverse; each set against ``null`` random layer-matched k-sets and,
    with ``per_head``, each of its heads alone. With ``heads`` (``[(layer, head), …]``): that set,
    measured on every prompt. With ``ceiling``: every head patched (what attention patterns carry at
    all; on a probe that acts only inside attention, all of the damage). The prompts are diagnose's
    (``text``, ``inputs``, ``samples``, ``length``, ``seed``); intervals bootstrap ``resamples``
    times. Causal LMs on ssacli's route only; the damage is the next-token loss increase (nats per
    token) over the unshifted run. With ``remedy`` (temperatures T), each measured set's heads are
    also tempered at the shifted level (weights^(1/T), renormalized: a temperature on softmax heads),
    a dose–response of the remedy, never part of the attribution; refused under ``logit-scale``,
    which T = α undoes exactly. The keywords are :func:`attribute_with`'s three values, by name:
    :class:`AttributionSettings`' (``level``, ``heads``, ``k``, ``null``, ``per_head``, ``ceiling``,
    ``resamples``, ``remedy``), :class:`DiagnoseSettings`' inputs (``text``, ``inputs``,
    ``samples``, here ``defaults.ATTRIBUTE_SAMPLES`` unless given, ``length``, ``batch_size``,
    ``seed``, ``tau``) and
    :class:`~ssacli.models.options.LoadOptions`' (``device`` …)."""
    settings.setdefault("samples", defaults.ATTRIBUTE_SAMPLES)
    values = settings_from("attribute", settings, AttributionSettings, DiagnoseSettings, LoadOptions)
    return attribute_with(model, probe, *values, tokenizer=tokenizer)


def attribute_with(
    model: str | Path | nn.Module | LoadedModel,
    probe: str | Probe,
    settings: AttributionSettings,
    inputs: DiagnoseSettings,
    load: LoadOptions = LoadOptions(),
    *,
    tokenizer: Any = None,
) -> Attribution:
    """:func:`attribute` with its settings as values: what it patches and measures
    (:class:`AttributionSettings`), the prompts (diagnose's :class:`DiagnoseSettings`: the same
    inputs a diagnose with them runs; its ``stats`` and ``strict`` are ignored, patching runs the
    eager blocks, and its ``probes``, ``scorer`` and ``generate`` are refused) and
    how a MODEL reference loads."""
    started = time.perf_counter()
    probe, shifted_level = check_probe(probe, settings.level, settings.remedy)  # before the model loads
    diagnose_only = [name for name in ("probes", "scorer", "generate") if getattr(inputs, name) is not None]
    if diagnose_only:  # diagnose's own settings: attribution takes one probe and the model's own scorer
        raise UsageError(f"attribution takes its probe as an argument and patches the model as it is: "
                         f"drop {', '.join(diagnose_only)}= from its DiagnoseSettings")  # fmt: skip
    kind = probe.kind
    check_prompts(kind, inputs.inputs is not None, inputs.random_ids)
    base = unshifted(kind)
    loaded = as_loaded(model, tokenizer, load)
    if loaded.kind != ModelKind.CAUSAL:
        raise not_causal(loaded.kind.value)
    root = loaded.attention_root
    if choose_route(root, loaded.family, None) is not Route.SSACLI:
        raise UnsupportedModelError(
            f"attribution patches weights inside ssacli's attention function; family '{loaded.family}' "
            "runs on the eager fallback"
        )
    if inputs.inputs is None and not inputs.random_ids:
        loaded.require_tokenizer("probing with text")
    training = loaded.model.training
    loaded.model.eval()
    undo = route_through_ssacli(root, None)
    try:
        levels = Probe(probe.name, (base, shifted_level))
        plan = plan_run(loaded, [levels], Route.SSACLI, inputs, None)
        _check_sets(settings, plan, base)
        result = _Runs(loaded, plan, probe, shifted_level, inputs.tau).attribute(settings, inputs.seed)
    finally:
        if undo is not None:
            undo()
        loaded.model.train(training)
    result.model = loaded.name
    result.settings = {**inputs.recorded(), "length": plan.length, **asdict(settings)}
    result.elapsed_s = round(time.perf_counter() - started, 3)
    return result


class _Runs:
    """The forwards of one attribution: the unshifted and shifted levels once, then patched sets."""

    def __init__(self, loaded: LoadedModel, plan, probe: Probe, level: float, tau: float):
        self.loaded, self.plan, self.probe, self.level = loaded, plan, probe, level
        levels = plan.probes[0][1]
        batches = levels[unshifted(probe.kind)][0]
        self.shifted_batches = levels[level][0]
        self.heads = plan.heads
        # length: each long row is consecutive base prompts of plan.length tokens (patching.py)
        self.window = plan.length if probe.kind.acts_on is ActsOn.INPUT_LENGTH else None
        recorder = partial(PatternRecorder, plan.layer_of, tau=tau, top_k=defaults.TOP_K)
        reference = recorder(mode="capture")
        self.loss_reference = self._losses(unshifted(probe.kind), reference, batches, None)
        n = len(self.loss_reference)
        measured = recorder(mode="measure", window=self.window)
        self.loss_shifted = self._losses(level, measured, self.shifted_batches, self.window)[:n]
        if measured.overflow.first is not None or not np.isfinite(self.loss_shifted).all():
            raise UsageError(
                f"{probe.name} at {level:g} overflows this model ({measured.overflow.first}); "
                "attribute a lower level"
            )
        if len(self.loss_shifted) < n:  # capped: fewer base prompts fit the longest inputs
            raise UsageError(f"{probe.name} at {level:g} holds fewer prompts than its base level; lower it")
        layers, width = len(plan.layers), max(plan.heads)
        self.rates_reference = reference.prompts.rates(layers, width)
        self.rates_shifted = measured.prompts.rates(layers, width)[:n]
        self.damage = self.loss_shifted - self.loss_reference
        self.patcher = recorder(mode="patch", window=self.window)
        self.patcher.kept = reference.kept
        self.temperer = recorder(mode="temper", window=self.window)
        self.patcher.where = [
            (b, r) for b, batch in enumerate(batches) for r in range(batch.input_ids.shape[0])
        ]

    def _losses(
        self,
        level: float,
        recorder: PatternRecorder,
        batches,
        window: int | None,
        only: set[int] | None = None,
    ) -> np.ndarray:
        """Per prompt (batch, row, then window): the mean next-token loss at ``level`` (NaN for the
        prompts of batches skipped because ``only`` holds none of theirs)."""
        out, start, sequence = [], 0, 0
        for index, batch in enumerate(batches):
            rows, width = batch.input_ids.shape
            count = rows * (width // window if window else 1)
            recorder.first_sequence, sequence = sequence, sequence + rows
            if only is not None and not only.intersection(range(start, start + count)):
                out.append(np.full(count, np.nan))
                start += count
                continue
            layers = self.plan.layers
            output = forward_batch(
                self.loaded, Route.SSACLI, self.probe, level, batch, recorder, layers, index=index
            )
            device = self.loaded.device
            ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
            losses = prompt_losses(output.logits, ids, mask, window)
            out.append(losses.double().cpu().numpy())
            start += count
        return np.concatenate(out)

    def removed(self, heads: list[Head], prompts: list[int], temperature: float | None = None) -> np.ndarray:
        """Per prompt of ``prompts``: the damage patching ``heads`` removes (with ``temperature``:
        the damage tempering them removes, the remedy)."""
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        recorder = self.patcher if temperature is None else self.temperer
        recorder.patched = {layer: torch.tensor(sorted(h)) for layer, h in by_layer.items()}
        recorder.temperature = 1.0 if temperature is None else temperature
        patched = self._losses(self.level, recorder, self.shifted_batches, self.window, set(prompts))
        return (self.loss_shifted - patched[: len(self.loss_shifted)])[prompts]

    def choose(self, prompts: list[int], k: int) -> tuple[list[Head], np.ndarray]:
        """The top ``k`` heads by collapse rise over ``prompts`` (heads whose collapse rate reaches
        COLLAPSE_SHARE unshifted left out, as diagnose's fresh collapse rate leaves them out)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a head no prompt counted a row for: NaN
            before = np.nanmean(self.rates_reference[prompts], axis=0)
            rise = np.nanmean(self.rates_shifted[prompts], axis=0) - before
        rise = np.where(np.isfinite(before) & (before >= COLLAPSE_SHARE), np.nan, rise)
        order = np.argsort(-np.nan_to_num(rise, nan=-np.inf).ravel(), kind="stable")
        width = rise.shape[1]
        return [(int(i // width), int(i % width)) for i in order[:k]], rise

    def fresh_collapse(self) -> tuple[np.ndarray, np.ndarray]:
        """Per prompt, unshifted and shifted: the collapse rate over the heads not collapsed
        unshifted (over every prompt, as :meth:`choose` leaves them out), each head's rows equal in
        number, so the mean of the heads' rates is the pooled share of rows."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            before = np.nanmean(self.rates_reference, axis=0)
            fresh = ~(np.isfinite(before) & (before >= COLLAPSE_SHARE))
            return (np.nanmean(np.where(fresh, self.rates_reference, np.nan), axis=(1, 2)),
                    np.nanmean(np.where(fresh, self.rates_shifted, np.nan), axis=(1, 2)))  # fmt: skip

    def measure(
        self,
        heads: list[Head],
        chosen_on,
        prompts: list[int],
        null: int,
        per_head: bool,
        rng: np.random.Generator,
        resamples: int,
        seed: int,
        remedy: tuple[float, ...] = (),
    ) -> SetAttribution:
        removed = self.removed(heads, prompts)
        damage = self.damage[prompts]
        damage_interval = bootstrap_ci(damage, resamples=resamples, seed=seed)
        mean, dmean = float(removed.mean()), float(damage.mean())
        clears = damage_interval is not None and (damage_interval[0] > 0 or damage_interval[1] < 0)
        one = SetAttribution(
            heads=heads,
            chosen_on=chosen_on,
            measured_on=prompts,
            removed=removed.tolist(),
            mean=mean,
            interval=bootstrap_ci(removed, resamples=resamples, seed=seed),
            damage=dmean,
            damage_interval=damage_interval,
            share=mean / dmean if clears else None,
        )
        if null:
            one.null = [
                float(self.removed(_matched(heads, self.heads, rng), prompts).mean()) for _ in range(null)
            ]
            values = np.asarray(one.null)
            one.percentile = float(100 * ((values < mean).mean() + 0.5 * (values == mean).mean()))
        for temperature in remedy:
            tempered = self.removed(heads, prompts, temperature)
            one.remedy.append({
                "temperature": temperature, "removed": float(tempered.mean()),
                "interval": bootstrap_ci(tempered, resamples=resamples, seed=seed),
            })  # fmt: skip
        if per_head and len(heads) > 1:
            one.per_head = {
                f"L{layer}H{h}": float(self.removed([(layer, h)], prompts).mean()) for layer, h in heads
            }
        return one

    def attribute(self, settings: AttributionSettings, seed: int) -> Attribution:
        heads, k, null, per_head = settings.heads, settings.k, settings.null, settings.per_head
        resamples, remedy = settings.resamples, settings.remedy
        n = len(self.damage)
        every = list(range(n))
        rng = np.random.default_rng(seed)
        _, rise = self.choose(every, k)
        if heads is not None:
            sets = [self.measure(list(heads), None, every, null, per_head, rng, resamples, seed, remedy)]
        else:
            a, b = every[: n // 2], every[n // 2 :]
            sets = []
            for chosen_on, measured_on in ((a, b), (b, a)):
                chosen, _ = self.choose(chosen_on, k)
                sets.append(
                    self.measure(chosen, chosen_on, measured_on, null, per_head, rng, resamples, seed, remedy)
                )
        collapse_reference, collapse_shifted = self.fresh_collapse()
        change = collapse_shifted - collapse_reference
        rho, interval = spearman_ci(change, self.damage, resamples=resamples, seed=seed)
        association = None if rho is None else {
            "rho": rho, "interval": None if interval is None else list(interval), "prompts": n,
        }  # fmt: skip
        all_heads = [(layer, h) for layer, count in enumerate(self.heads) for h in range(count)]
        whole = (
            self.measure(all_heads, None, every, 0, False, rng, resamples, seed) if settings.ceiling else None
        )
        return Attribution(
            model="",
            probe=self.probe.name,
            level=self.level,
            reference_level=unshifted(self.probe.kind),
            k=k,
            layers=[name for name, _ in self.plan.layers],
            heads=self.heads,
            loss_reference=self.loss_reference.tolist(),
            loss_shifted=self.loss_shifted.tolist(),
            damage=self.damage.tolist(),
            damage_interval=bootstrap_ci(self.damage, resamples=resamples, seed=seed),
            rise=rise.tolist(),
            sets=sets,
            ceiling=whole,
            elapsed_s=0.0,
            settings={},
            collapse_reference=collapse_reference.tolist(),
            collapse_shifted=collapse_shifted.tolist(),
            association=association,
        )


def _matched(heads: list[Head], per_layer: list[int], rng: np.random.Generator) -> list[Head]:
    """A random set with as many heads in each layer as ``heads`` has."""
    counts: dict[int, int] = {}
    for layer, _ in heads:
        counts[layer] = counts.get(layer, 0) + 1
    return [
        (layer, int(h)) for layer, c in counts.items() for h in rng.choice(per_layer[layer], c, replace=False)
    ]


def _check_sets(settings: AttributionSettings, plan, base: float) -> None:
    """The head sets asked for fit the model and the prompts (before any forward)."""
    per_layer = plan.heads
    for layer, head in settings.heads or ():
        if not (0 <= layer < len(per_layer) and 0 <= head < per_layer[layer]):
            raise UsageError(
                f"head ({layer}, {head}) is not in this model ({len(per_layer)} layers, {per_layer} heads); "
                "give (layer, head) pairs counted from 0"
            )
    if settings.heads is None:
        n = sum(batch.input_ids.shape[0] for batch in plan.probes[0][1][base][0])
        if n < 4:
            raise UsageError(f"choosing heads on half the prompts needs at least 4 prompts, got {n}")
        if settings.k > sum(per_layer):
            raise UsageError(f"k must be at most the model's {sum(per_layer)} heads, got {settings.k}")


__all__ = ["Attribution", "AttributionSettings", "SetAttribution", "attribute", "attribute_with"]
