"""Two diagnose results side by side: the levels both swept, B − A of the model means, and the
findings that say what changed from A to B (``ssacli diagnose --compare``, the report page).

Comparison finding kinds (:data:`CHANGE_ORDER`): ``sink_change``, ``baseline_collapse_change``,
``collapse_change``, ``shift_change`` (what the shift did to each model: each one's change from its
own unshifted level, not where each started), ``layer_collapse_change``, ``saturation_change``,
``generation_change`` (both results ran ``--generate``: :func:`generation_comparison`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..defaults import SINK_EPS
from ..documents import COMPARISON_SCHEMA
from .findings import baseline_probe, level_text
from .generation import EXACT_METRICS
from .outputs import collapse_change
from .probe_result import ProbeResult, json_ready
from .result import DiagnoseResult


def common_levels(a: ProbeResult, b: ProbeResult) -> list[tuple[float, int, int]]:
    """(level, index in a, index in b) for each level both probes swept, in a's order. Levels are
    matched with a relative tolerance: the same sweep written by two runs may round differently."""
    shared = []
    for ia, level in enumerate(a.levels):
        for ib, other in enumerate(b.levels):
            if math.isclose(level, other, rel_tol=1e-9, abs_tol=1e-12):
                shared.append((level, ia, ib))
                break
    return shared


def compare_results(a: DiagnoseResult, b: DiagnoseResult) -> dict[str, Any]:
    """Both results plus, per probe present and not skipped in both, B − A of every shared metric's
    model mean on the common levels (None where either side is undefined) and both collapse
    points (each over its own levels). JSON-ready: no NaN anywhere."""
    deltas: dict[str, dict[str, list]] = {}
    points: dict[str, dict[str, float | None]] = {}
    names_b = {p.name for p in b.probes}
    for pa in a.probes:
        if pa.name not in names_b:
            continue
        pb = b.probe(pa.name)
        if pa.skipped or pb.skipped:
            continue
        shared = common_levels(pa, pb)
        entry: dict[str, list] = {"levels": [level for level, _, _ in shared]}
        for metric in [m for m in pa.metrics if m in pb.metrics]:
            ma, mb = pa.model_mean(metric), pb.model_mean(metric)
            entry[metric] = [json_ready(float(mb[ib] - ma[ia])) for _, ia, ib in shared]
        deltas[pa.name] = entry
        points[pa.name] = {"a": pa.collapse_point(), "b": pb.collapse_point()}
    return {
        "schema": COMPARISON_SCHEMA,
        "schema_version": 2,
        "findings": comparison_findings(a, b),
        "a": a.to_dict(),
        "b": b.to_dict(),
        "deltas": deltas,
        "collapse_points": points,
        "generation": generation_comparison(a, b),
    }


def generation_comparison(a: DiagnoseResult, b: DiagnoseResult) -> dict[str, Any] | None:
    """``diagnose --generate`` on both sides: over the decoding steps both ran (the first
    ``steps``), each metric's mean over steps, layers and heads in A and in B, and B − A. None when
    neither side generated; ``{"only": "A"}`` (or B) when one did."""
    ga, gb = a.generation, b.generation
    if ga is None and gb is None:
        return None
    if ga is None or gb is None:
        return {"only": "A" if gb is None else "B"}
    steps = min(ga.steps, gb.steps)
    metrics = {}
    for name in EXACT_METRICS:
        if name not in ga.metrics or name not in gb.metrics:
            continue
        va, vb = (_finite_mean(g.metrics[name][:steps]) for g in (ga, gb))
        delta = None if va is None or vb is None else vb - va
        metrics[name] = {"a": va, "b": vb, "delta": delta}
    return {
        "steps": steps,
        "prompt_length": {"a": ga.prompt_length, "b": gb.prompt_length},
        "max_rel_diff": {"a": ga.max_rel_diff, "b": gb.max_rel_diff},
        "metrics": metrics,
    }


def _finite_mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


# Most telling first; within a kind, in A's probe order. All are kept (the terminal lists --findings).
CHANGE_ORDER = ("sink_change", "baseline_collapse_change", "collapse_change", "shift_change",
                "layer_collapse_change", "saturation_change", "generation_change")  # fmt: skip
SATURATION_STEP = 0.05  # a model-mean collapse rate or max weight that moved less is not a finding


def comparison_findings(a: DiagnoseResult, b: DiagnoseResult) -> list[dict[str, Any]]:
    """What changed from A to B, as findings (``kind``, ``text``, and the numbers: A's under
    ``a``, B's under ``b``): first-token heads and heads collapsed at baseline, each probe's collapse point,
    the layers whose collapse point moved, and saturation at the common level where A and B differ
    most. Kinds in :data:`CHANGE_ORDER`, most telling first."""
    out = _baseline_changes(a, b)
    probes_b = {p.name: p for p in b.probes}
    for pa in a.probes:
        pb = probes_b.get(pa.name)
        if pb is None or pa.skipped or pb.skipped:
            continue
        change = _collapse_change(pa, pb)
        if change is not None:
            out.append(change)
        layers = _layer_collapse_change(pa, pb, change)
        if layers is not None:
            out.append(layers)
        shift = _shift_change(pa, pb)
        if shift is not None:
            out.append(shift)
        saturation = _saturation_change(pa, pb)
        if saturation is not None:
            out.append(saturation)
    generating = _generation_change(generation_comparison(a, b))
    if generating is not None:
        out.append(generating)
    out.sort(key=lambda f: CHANGE_ORDER.index(f["kind"]))
    return out


def _shift_change(pa: ProbeResult, pb: ProbeResult) -> dict[str, Any] | None:
    """What the shift did to each model at the top level both measured: each one's change in fresh
    collapse from its own unshifted level (:func:`ssacli.diagnosis.outputs.collapse_change`), when
    the two changes differ by SATURATION_STEP or more. Where each model started is not the probe's
    effect (compared as levels, a high unshifted collapse in A would read as B fixing length)."""
    fa, fb = pa.fresh_collapse_rate(), pb.fresh_collapse_rate()
    common = [lv for i, lv in enumerate(pa.levels) if math.isfinite(fa[i]) and lv in pb.levels
              and math.isfinite(fb[pb.levels.index(lv)])]  # fmt: skip
    if len(common) < 2:
        return None
    level = common[-1]
    ca, cb = collapse_change(pa, pa.levels.index(level)), collapse_change(pb, pb.levels.index(level))
    if not abs(cb.change - ca.change) >= SATURATION_STEP:
        return None
    ref = level_text(pa, pa.levels[ca.reference])
    return {
        "kind": "shift_change", "probe": pa.name, "level": level,
        "a": ca.change, "b": cb.change, "noise_a": ca.noise, "noise_b": cb.noise,
        "text": f"{pa.name} {level_text(pa, level)}: collapse {100 * ca.change:+.1f} points from the "
                f"unshifted {ref} in A → {100 * cb.change:+.1f} in B (each from its own unshifted level)",
    }  # fmt: skip


def _point_text(probe: ProbeResult, point: float | None) -> str:
    return "never" if point is None else level_text(probe, point)


def _same_point(x: float | None, y: float | None) -> bool:
    return x is None and y is None or (x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9))


def _baseline_changes(a: DiagnoseResult, b: DiagnoseResult) -> list[dict[str, Any]]:
    """First-token heads (Gu ε) and heads collapsed at the first level, on each side's unshifted probe."""
    base_a, base_b = baseline_probe(a.probes), baseline_probe(b.probes)
    if base_a is None or base_b is None:
        return []
    out = []
    of_a, of_b = int(sum(a.heads)), int(sum(b.heads))
    of = f"of {of_a}" if of_a == of_b else f"(of {of_a} heads in A, {of_b} in B)"
    if all("sink_rate" in p.metrics for p in (base_a, base_b)):
        na = int(np.nansum(base_a.metrics["sink_rate"][0]))
        nb = int(np.nansum(base_b.metrics["sink_rate"][0]))
        if na != nb:
            # first-token heads, not the head class "sink" (ssacli.diagnosis.findings says why)
            text = (f"first-token heads at baseline: {na} → {nb} {of} (mean weight on the first token > "
                    f"{SINK_EPS:g})")  # fmt: skip
            out.append({"kind": "sink_change", "a": na, "b": nb, "of_a": of_a, "of_b": of_b, "eps": SINK_EPS,
                        "text": text})  # fmt: skip
    heads_a, heads_b = base_a.baseline_collapsed_heads(), base_b.baseline_collapsed_heads()
    if heads_a != heads_b:
        which = "; ".join(f"{side}: {_heads_text(heads)}" for side, heads in (("A", heads_a), ("B", heads_b)))
        out.append({
            "kind": "baseline_collapse_change", "a": len(heads_a), "b": len(heads_b),
            "heads_a": [list(h) for h in heads_a], "heads_b": [list(h) for h in heads_b],
            "text": f"heads collapsed before any shift: {len(heads_a)} → {len(heads_b)} {of} ({which})",
        })  # fmt: skip
    return out


def _heads_text(heads: list[tuple[int, int]], shown: int = 4) -> str:
    if not heads:
        return "none"
    more = f" +{len(heads) - shown} more" if len(heads) > shown else ""
    return ", ".join(f"L{layer}H{head}" for layer, head in heads[:shown]) + more


def _collapse_change(pa: ProbeResult, pb: ProbeResult) -> dict[str, Any] | None:
    sa, sb = pa.collapse_status(), pb.collapse_status()
    if sa == sb:
        return None
    la, lb = pa.collapse_point(), pb.collapse_point()
    ta = sa if la is None else level_text(pa, la)
    tb = sb if lb is None else level_text(pb, lb)
    return {"kind": "collapse_change", "probe": pa.name, "a": sa, "b": sb, "level_a": la, "level_b": lb,
            "text": f"{pa.name} collapse point: {ta} in A → {tb} in B"}  # fmt: skip


def _layer_collapse_change(
    pa: ProbeResult, pb: ProbeResult, model_change: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The layers whose own collapse point moved (same layer count on both sides, both probes able
    to respond); None when they all moved exactly as the model's collapse point did."""
    if pa.insensitive or pb.insensitive or False in (pa.reached(), pb.reached()):
        return None
    points_a, points_b = pa.layer_collapse_points(), pb.layer_collapse_points()
    if len(points_a) != len(points_b):
        return None
    gone_a, gone_b = (p.baseline_collapsed().all(axis=1) for p in (pa, pb))  # nothing left to collapse
    moved = [
        {"layer": layer, "a": x, "b": y}
        for layer, (x, y) in enumerate(zip(points_a, points_b))
        if not (gone_a[layer] or gone_b[layer] or _same_point(x, y))
    ]
    if not moved:
        return None
    if model_change is not None and all(
        _same_point(m["a"], model_change["level_a"]) and _same_point(m["b"], model_change["level_b"])
        for m in moved
    ):
        return None
    parts = [f"{_point_text(pa, m['a'])} to {_point_text(pb, m['b'])}" for m in moved[:3]]
    text = f"{pa.name}: collapse point of layer {moved[0]['layer']} moved from {parts[0]}" + "".join(
        f"; layer {m['layer']} from {part}" for m, part in zip(moved[1:3], parts[1:])
    )
    if len(moved) > 3:
        text += f" (and {len(moved) - 3} more layers)"
    return {"kind": "layer_collapse_change", "probe": pa.name, "layers": moved, "text": text}


def _saturation_change(pa: ProbeResult, pb: ProbeResult) -> dict[str, Any] | None:
    """At the common level where the model-mean collapse rate moved most (else the max weight), if
    it moved by at least SATURATION_STEP."""
    rows = []
    for level, ia, ib in common_levels(pa, pb):
        values = [
            float(p.model_mean(m)[i])
            for m in ("collapse_rate", "max_weight")
            for p, i in ((pa, ia), (pb, ib))
        ]
        if all(math.isfinite(v) for v in values):
            rows.append((level, *values))
    if not rows:
        return None
    by_collapse = max(rows, key=lambda r: (abs(r[2] - r[1]), r[0]))
    by_weight = max(rows, key=lambda r: (abs(r[4] - r[3]), r[0]))
    if abs(by_collapse[2] - by_collapse[1]) >= SATURATION_STEP:
        level, ca, cb, wa, wb = by_collapse
        less = cb < ca
    elif abs(by_weight[4] - by_weight[3]) >= SATURATION_STEP:
        level, ca, cb, wa, wb = by_weight
        less = wb < wa
    else:
        return None
    return {
        "kind": "saturation_change", "probe": pa.name, "level": level, "a": wa, "b": wb,
        "collapse_rate": {"a": ca, "b": cb}, "max_weight": {"a": wa, "b": wb},
        "text": f"{pa.name} {level_text(pa, level)}: collapse {ca:.0%} → {cb:.0%}, max weight {wa:.2f} → "
                f"{wb:.2f} (B {'less' if less else 'more'} saturated)",
    }  # fmt: skip


def _generation_change(comparison: dict[str, Any] | None) -> dict[str, Any] | None:
    """While generating, when the mean collapse rate (else the mean max weight) over the common
    decoding steps moved by at least SATURATION_STEP."""
    if not comparison or "metrics" not in comparison:
        return None
    rates, weights = (comparison["metrics"].get(m, {}) for m in ("collapse_rate", "max_weight"))
    moved = [m for m in (rates, weights) if m.get("delta") is not None and abs(m["delta"]) >= SATURATION_STEP]
    if not moved:
        return None
    less = moved[0]["delta"] < 0
    parts = []
    if rates.get("delta") is not None:
        parts.append(f"collapse {rates['a']:.0%} → {rates['b']:.0%}")
    if weights.get("delta") is not None:
        parts.append(f"max weight {weights['a']:.2f} → {weights['b']:.2f}")
    text = (f"while generating ({comparison['steps']} tokens): " + ", ".join(parts)
            + f" (B {'less' if less else 'more'} saturated)")  # fmt: skip
    return {"kind": "generation_change", "steps": comparison["steps"], "collapse_rate": rates,
            "max_weight": weights, "text": text}  # fmt: skip
