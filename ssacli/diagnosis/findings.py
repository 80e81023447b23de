"""Findings: the plain-language statements a diagnose report opens with, computed from a result.

Each finding is a dict: ``kind`` (a stable machine-readable type), ``text`` (one sentence), and the
numbers behind it (``probe``, ``level``, ``layers``, ``value``, …). Terminal, HTML and JSON show the
same list (``DiagnoseResult.findings``), most important first: JSON and HTML all of it, the terminal
the first ``--findings`` (defaults.FINDINGS) and a count of the rest; what changed between two runs is
:func:`ssacli.diagnosis.comparison.comparison_findings`, written with the helpers here.

Kinds: ``degenerate``, ``sink_heads`` (first-token heads; the kind keeps its JSON name),
``collapsed_at_baseline``, ``overflow``, ``insensitive``,
``absorbed``, ``collapse``, ``outputs_broke``, ``no_collapse`` (its ``verdict``: robust, degenerate
or unmeasured; :mod:`ssacli.diagnosis.outputs` decides), ``fading``, ``massive_activations``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..defaults import SINK_EPS
from .outputs import (
    ERROR_HELD_RATIO,
    OUTPUT_KL_HELD,
    ROBUST_COLLAPSE,
    degenerate,
    level_loss,
    level_output_kl,
    outputs_broke_at,
    partly_collapsed_at,
    reference_index,
    robust_index,
)
from .probe_kinds import ActsOn
from .probe_result import COLLAPSE_SHARE, ProbeResult, nanmean

MASSIVE_MAGNITUDE = 100.0  # Sun et al. 2024: activations above ~100 and ~1000x the median
MASSIVE_RATIO = 1000.0


def level_text(probe: ProbeResult, level: float) -> str:
    """A level as the probe writes it: "×4", "σ=8", "3 digits"."""
    symbol = probe.kind.symbol if probe.kind is not None else ""
    if symbol in ("×",):
        return f"×{level:g}"
    if symbol == "digits":
        return f"{level:g} digits"
    if symbol == "corpus":  # the shift probe: level 0 is the reference text, 1 the shifted corpus
        return "the shifted corpus" if level else "the reference"
    return f"{symbol}={level:g}" if symbol else f"{level:g}"


def span(layers: list[int]) -> str:
    """[1, 2, 3, 7] -> "1–3, 7"."""
    if not layers:
        return "–"
    layers = sorted(set(layers))
    parts, start, prev = [], layers[0], layers[0]
    for layer in [*layers[1:], None]:
        if layer is not None and layer == prev + 1:
            prev = layer
            continue
        parts.append(f"{start}" if start == prev else f"{start}–{prev}")
        if layer is not None:
            start = prev = layer
    return ", ".join(parts)


def baseline_probe(probes: Sequence[ProbeResult]) -> ProbeResult | None:
    """A probe whose first level is its neutral one (the unshifted model), else any measured one."""
    live = [p for p in probes if not p.skipped and not p.overflowed(0)]
    for probe in live:
        kind = probe.kind
        if kind is not None and kind.neutral is not None and probe.levels[0] == kind.neutral:
            return probe
    return live[0] if live else None


def findings(
    probes: Sequence[ProbeResult], heads: Sequence[int], vocab_size: int | None = None
) -> list[dict[str, Any]]:
    """The findings of one result: its probes, the heads per layer and (causal LMs) the vocabulary
    size, against which a baseline loss reads degenerate (:func:`ssacli.diagnosis.outputs.degenerate`)."""
    out: list[dict[str, Any]] = []
    total_heads = int(sum(heads))
    base = baseline_probe(probes)
    broken = degenerate(probes, vocab_size, base)
    if broken is not None:
        out.append({"kind": "degenerate", **broken, "text": f"degenerate, not robust: {broken['text']}"})
    if base is not None and {"sink_rate", "collapse_rate"} <= set(base.metrics):
        sinks = base.metrics["sink_rate"][0]
        count = int(np.nansum(sinks))
        layers = sorted({int(layer) for layer, _ in zip(*np.nonzero(sinks == 1))})
        # Two measures of "sink", two names (one name would let a BERT read "37 of 72 heads are attention
        # sinks" here and "12 sink" in the head classes). This one is Gu et al.'s count: a head whose mean
        # weight on the first token exceeds SINK_EPS (0.3), whatever else it does; a head can be one and
        # local too. The head class "sink" (ssacli.diagnosis.positions) is a head that parks at least
        # half its mass on the first k tokens, the first class that holds in a partition: what the head
        # mostly does. Both are right for what they answer (how many heads lean on token 0; what each
        # head is), so neither replaces the other: this one is "first-token heads" in every text.
        text = f"{count} of {total_heads} heads are first-token heads at baseline (mean weight on the " + (
            f"first token > {SINK_EPS:g}, Gu et al.; layers {span(layers)})" if layers
            else f"first token > {SINK_EPS:g}, Gu et al.)"
        )  # fmt: skip
        out.append({"kind": "sink_heads", "text": text, "probe": base.name, "level": base.levels[0],
                    "value": count, "of": total_heads, "layers": layers, "eps": SINK_EPS})  # fmt: skip
        collapsed = base.baseline_collapsed_heads()
        if collapsed:
            shown = ", ".join(f"L{layer}H{head}" for layer, head in collapsed[:6])
            more = f" and {len(collapsed) - 6} more" if len(collapsed) > 6 else ""
            out.append({
                "kind": "collapsed_at_baseline",
                "text": f"{len(collapsed)} of {total_heads} heads are collapsed before any shift "
                        f"(≥ τ on one key in half their rows): {shown}{more}",
                "probe": base.name, "value": len(collapsed), "heads": [list(h) for h in collapsed],
            })  # fmt: skip
    out.extend(_baseline_collapse(probes))
    for probe in probes:
        if probe.skipped or not {"collapse_rate", "max_weight", "entropy"} <= set(probe.metrics):
            continue
        out.extend(_probe_findings(probe, broken))
    massive = _massive(base)
    if massive is not None:
        out.append(massive)
    rank = {kind: i for i, kind in enumerate(FINDING_ORDER)}
    out.sort(key=lambda f: rank.get(f["kind"], len(rank)))
    return out


# Most important first, which is what the terminal keeps when it lists only some (--findings): a
# measurement that means nothing (degenerate, overflow), then what saturates, then what is wrong with
# the model before any shift; a probe that cannot test this model (absorbed; insensitive: n/a by
# construction, true of any model) says nothing about the model itself, and every verdict line says it
# again, so it comes after the model's own facts (before them, on a report of 8 lines with many probes,
# it would push out the heads collapsed at baseline and the massive activations).
FINDING_ORDER = ("degenerate", "overflow", "collapse", "outputs_broke", "collapsed_at_baseline",
                 "baseline_collapse", "sink_heads", "massive_activations", "absorbed", "fading",
                 "insensitive", "no_collapse")  # fmt: skip


def _baseline_collapse(probes: Sequence[ProbeResult]) -> list[dict[str, Any]]:
    """Where more than ROBUST_COLLAPSE of the fresh rows collapse at a probe's unshifted level: that
    level of collapse is the model's own, before any shift, and every verdict reads its probe's change
    from it (:func:`ssacli.diagnosis.outputs.collapse_change`), never the level itself. One finding per
    distinct unshifted input (probes that share the same unshifted prompts read the same rate)."""
    seen: dict[float, dict[str, Any]] = {}
    for probe in probes:
        if probe.skipped or "collapse_rate" not in probe.metrics:
            continue
        ref = reference_index(probe.name, probe.levels)
        rate = float(probe.fresh_collapse_rate()[ref])
        if not (math.isfinite(rate) and rate > ROBUST_COLLAPSE):
            continue
        at = f"{probe.name} at {level_text(probe, probe.levels[ref])}"
        found = seen.setdefault(round(rate, 6), {"kind": "baseline_collapse", "value": rate, "probes": []})
        found["probes"].append(probe.name)
        found.setdefault("at", []).append(at)
    for found in seen.values():
        where = ", ".join(found.pop("at"))
        found["text"] = (f"{found['value']:.1%} of the rows collapse before any shift ({where}; heads not "
                         "collapsed at baseline): each verdict reads its probe's change from this level, "
                         "not the level itself")  # fmt: skip
    return list(seen.values())


def _probe_findings(probe: ProbeResult, broken: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    out = []
    flow = probe.first_overflow()
    if flow is not None:
        level, where = flow
        at = f"layer {where['layer']}" if where.get("layer") is not None else where.get("where", "?")
        out.append({
            "kind": "overflow", "probe": probe.name, "level": level, "layer": where.get("layer"),
            "where": where.get("where"),
            "text": f"{probe.name} overflowed at {level_text(probe, level)} (first non-finite value in "
                    f"{at}: {where.get('where')}); those levels are reported as overflow, not measured",
        })  # fmt: skip
    if probe.insensitive:
        out.append(
            {
                "kind": "insensitive",
                "probe": probe.name,
                "reason": probe.insensitive,
                "text": f"{probe.name}: n/a, insensitive by construction ({probe.insensitive})",
            }
        )
        return out
    ratios = probe.reach_model()
    finite = [(lv, r) for lv, r in zip(probe.levels, ratios) if r is not None and math.isfinite(r)]
    if probe.reached() is False:
        out.append(absorbed_finding(probe))
        broke = outputs_broke_at(probe)
        if broke is not None:  # the shift missed attention, yet the model's outputs broke
            at = level_text(probe, probe.levels[broke])
            out.append({
                "kind": "outputs_broke", "verdict": "outputs broke", "probe": probe.name,
                "level": probe.levels[broke], "output_kl": level_output_kl(probe)[broke],
                "text": f"{probe.name}: outputs broke from {at} ({_broke_how(probe, broke)}) "
                        f"{residual_text(probe)}",
            })  # fmt: skip
        return out
    point = probe.collapse_point()
    fresh = probe.fresh_collapse_rate()
    if point is not None:
        index = probe.levels.index(point)
        rates = probe.metrics["collapse_rate"].copy()
        rates[:, probe.baseline_collapsed()] = np.nan
        layer_rates = nanmean(rates, axis=2) if rates.size else rates
        # the layers that collapse there: their own rate reaches the share that marks the point
        first_layers = [int(i) for i in np.nonzero(np.nan_to_num(layer_rates[index]) >= COLLAPSE_SHARE)[0]]
        if not first_layers:
            first_layers = [int(np.nanargmax(np.nan_to_num(layer_rates[index], nan=-1)))]
        reach = _reach_text(probe, index)
        out.append({
            "kind": "collapse", "probe": probe.name, "level": point, "layers": first_layers,
            "value": float(fresh[index]),
            "text": f"{probe.name} {level_text(probe, point)} collapses {fresh[index]:.0%} of the rows of "
                    f"heads not collapsed at baseline; layers {span(first_layers)} first{reach}",
        })  # fmt: skip
    elif probe.kind is not None and probe.kind.magnitude and finite and not probe.overflowed(1):
        last = len(probe.levels) - 1
        while last > 0 and probe.overflowed(last):
            last -= 1
        peak = float(probe.model_mean("max_weight")[last])
        little = (f"collapses at most {np.nan_to_num(fresh[last]):.0%} of the rows up to "
                  f"{level_text(probe, probe.levels[last])} (max weight {peak:.2f}"
                  f"{_reach_text(probe, last, plain=True)})")  # fmt: skip
        out.append(_held_finding(probe, last, little, float(fresh[last]), broken))
    fading = probe.fading()
    if fading is not None:
        slopes = np.array([np.nan if v is None else v for v in fading["entropy_layers"]], dtype=float)
        if np.isfinite(slopes).any():
            worst = float(np.nanmin(slopes))
            # name the fastest-fading layers only when they fade at the precision shown (-0.000 is noise)
            fading_layers = round(worst, 3) < 0
            layers = [int(i) for i in np.nonzero(slopes <= worst * 0.75)[0]] if fading_layers else []
            mean = float(np.nanmean(slopes))
            maxw = np.array([np.nan if v is None else v for v in fading["max_weight_layers"]], dtype=float)
            maxw_mean = float(np.nanmean(maxw)) if np.isfinite(maxw).any() else math.nan
            where = f", fastest in layers {span(layers)} ({worst:+.3f})" if layers else ""
            out.append({
                "kind": "fading", "probe": probe.name, "value": mean, "layers": layers,
                "max_weight_slope": maxw_mean if math.isfinite(maxw_mean) else None,
                "n": fading["n"],
                "text": f"normalized entropy changes {mean:+.3f} per doubling of context (n "
                        f"{_n_range(fading['n'])}){where}; max weight {maxw_mean:+.3f} per doubling",
            })  # fmt: skip
    return out


def _broke_how(probe: ProbeResult, index: int) -> str:
    """How the outputs at level ``index`` did not hold: the KL to the reference level, or (ICL) the
    task error against the reference's."""
    ref = reference_index(probe.name, probe.levels)
    first = level_text(probe, probe.levels[ref])
    kl = level_output_kl(probe)[index]
    if kl is not None:
        return f"KL {kl:.3g} nats/token to {first} > {OUTPUT_KL_HELD:g}"
    loss = level_loss(probe)
    return f"task error {loss[index]:.3g} vs {loss[ref]:.3g} at {first}, > {ERROR_HELD_RATIO:g}×"


def _held_finding(
    probe: ProbeResult, last: int, little: str, fresh: float, broken: dict[str, Any] | None
) -> dict[str, Any]:
    """Little collapse up to level ``last``: robust only if the outputs held there too (and the model
    is not degenerate); otherwise the finding says why this is no robustness."""
    kl = level_output_kl(probe)
    ref = reference_index(probe.name, probe.levels)
    first = level_text(probe, probe.levels[ref])
    broke = outputs_broke_at(probe)
    robust = robust_index(probe)
    found = {"kind": "no_collapse", "probe": probe.name, "level": probe.levels[last], "value": fresh,
             "output_kl": kl[last]}  # fmt: skip
    if broken is not None:
        found["verdict"] = "degenerate"
        found["text"] = f"{probe.name} {little}; not robustness: the model is degenerate"
    elif broke is not None and broke <= last:
        found.update(
            kind="outputs_broke", verdict="outputs broke", level=probe.levels[broke], output_kl=kl[broke]
        )
        at = level_text(probe, probe.levels[broke])
        how = _broke_how(probe, broke)
        found["text"] = f"{probe.name}: outputs broke from {at} ({how}) although it {little}; not robust"
    elif robust is not None and robust >= last:
        held = max((v for v in kl[: last + 1] if v is not None), default=None)
        how = f"KL ≤ {held:.3g} nats/token to {first}" if held is not None else "task error held"
        upto = level_text(probe, probe.levels[last])
        found.update(
            verdict="robust", text=f"{probe.name} robust up to {upto}: {little}; outputs held ({how})"
        )
    elif (partly := partly_collapsed_at(probe)) is not None:
        at = level_text(probe, probe.levels[partly])
        share = f"{ROBUST_COLLAPSE:.0%}"
        text = (f"{probe.name} {little}; collapse rises more than {share} of the rows over the unshifted "
                f"level from {at}: not robust")  # fmt: skip
        found.update(verdict="partly collapses", text=text)
    else:
        text = f"{probe.name} {little}; its outputs were not measured, so not called robust"
        found.update(verdict="unmeasured", text=text)
    return found


def _n_range(n: list) -> str:
    values = [v for v in n if v is not None]
    return f"{min(values):.0f}–{max(values):.0f}" if values else "?"


def absorbed_text(probe: ProbeResult) -> str:
    """ "absorbed by MODULE — this probe cannot test this model; use key-scale": what a magnitude probe
    whose shift did not arrive (:meth:`ProbeResult.reached` is False) says wherever it is named."""
    advice = "; use key-scale" if probe.kind is not None and probe.kind.acts_on is ActsOn.EMBEDDINGS else ""
    return f"absorbed by {probe.absorbed_by()} — this probe cannot test this model{advice}"


def residual_text(probe: ProbeResult) -> str:
    """What a probe absorbed before attention whose outputs broke says of the path its shift took."""
    return (f"through the residual stream, not attention (absorbed by {probe.absorbed_by()}; key-scale "
            "tests attention)")  # fmt: skip


def shift_text(probe: ProbeResult, index: int | None = None) -> str | None:
    """The shift measured where the probe acts at level ``index`` (default: the level its reach is
    judged at), the least over the layers: "×31.6" for a factor, "+8" for an offset; None where
    not measured."""
    index = probe.reach_index() if index is None else index
    shift = probe.reach_shift()
    if index is None or shift is None or index >= len(shift) or not np.isfinite(shift[index]).any():
        return None
    least = float(np.nanmin(shift[index]))
    return f"{least:+.3g}" if probe.kind.additive else f"×{least:.3g}"


def asked_text(probe: ProbeResult, index: int) -> str:
    """The shift level ``index`` asks for, relative to the first level: "×1000", "+32"."""
    first, level = probe.levels[0], probe.levels[index]
    return f"{level - first:+g}" if probe.kind.additive else f"×{level / first:g}"


def absorbed_finding(probe: ProbeResult) -> dict[str, Any]:
    """The finding of a magnitude probe whose shift did not arrive (:meth:`ProbeResult.reached`)."""
    index = probe.reach_index()
    level, layer = probe.levels[index], probe.absorbed_layer()
    where = "target key's logits" if probe.kind.has_target else "logits"
    measured = (
        f"{where} {shift_text(probe, index)} at {level_text(probe, level)}, {asked_text(probe, index)} asked"
    )
    partial = f"; it reached layers {span(list(range(layer)))} only" if layer else ""
    return {
        "kind": "absorbed", "probe": probe.name, "level": level, "layer": layer,
        "where": probe.absorbed_by(), "value": shift_text(probe, index),
        "text": f"{probe.name} {absorbed_text(probe)} ({measured}{partial})",
    }  # fmt: skip


def _reach_text(probe: ProbeResult, index: int, plain: bool = False) -> str:
    """ ", shift reached ×Z" where the probe's shift arrived (:func:`shift_text` at level ``index``)."""
    text = shift_text(probe, index) if probe.reached() is True else None
    if text is None:
        return ""
    return f", shift reached {text}" if plain else f" (shift reached {text})"


def _massive(probe: ProbeResult | None) -> dict[str, Any] | None:
    if probe is None or "massive_top1" not in probe.layer_metrics:
        return None
    top = probe.layer_metrics["massive_top1"][0]
    ratio = probe.layer_metrics["massive_ratio"][0]
    if not np.isfinite(top).any():
        return None
    layers = [int(i) for i in np.nonzero((top > MASSIVE_MAGNITUDE) & (ratio > MASSIVE_RATIO))[0]]
    peak = int(np.nanargmax(np.where(np.isfinite(ratio), ratio, -1)))
    if layers:
        text = (f"massive activations (Sun et al.: |h| > {MASSIVE_MAGNITUDE:g} and > {MASSIVE_RATIO:g}× the "
                f"median) in layers {span(layers)}; largest |h| {top[peak]:.3g} = {ratio[peak]:.3g}× "
                f"the median in layer {peak}")  # fmt: skip
    else:
        text = (
            f"no massive activations (Sun et al.): largest |h| {np.nanmax(top):.3g}, at most "
            f"{np.nanmax(ratio):.3g}× the median (layer {peak})"
        )
    return {"kind": "massive_activations", "probe": probe.name, "layers": layers, "layer": peak,
            "value": float(top[peak]), "ratio": float(ratio[peak]), "text": text}  # fmt: skip
