"""Two diagnose results side by side: the levels both swept, B − A of the model means, and the
findings that say what changed from A to B (``ssacli diagnose --compare``, the report page).

Comparison finding kinds: ``collapse_change``, ``saturation_change``, ``sink_change``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .findings import MAX_FINDINGS, baseline_probe, level_text
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
        "schema": "ssacli-diagnose-comparison",
        "schema_version": 2,
        "findings": comparison_findings(a, b),
        "a": a.to_dict(),
        "b": b.to_dict(),
        "deltas": deltas,
        "collapse_points": points,
    }


def comparison_findings(a: DiagnoseResult, b: DiagnoseResult) -> list[dict[str, Any]]:
    """What changed from A to B: collapse points, saturation at the harshest common level, sinks."""
    out: list[dict[str, Any]] = []
    names_b = {p.name: p for p in b.probes}
    for pa in a.probes:
        pb = names_b.get(pa.name)
        if pb is None or pa.skipped or pb.skipped:
            continue
        sa, sb = pa.collapse_status(), pb.collapse_status()
        if sa != sb:
            out.append(
                {
                    "kind": "collapse_change",
                    "probe": pa.name,
                    "a": sa,
                    "b": sb,
                    "text": f"{pa.name}: collapse point {sa} in A, {sb} in B",
                }
            )
        shared = common_levels(pa, pb)
        if not shared:
            continue
        level, ia, ib = shared[-1]
        ca, cb = float(pa.model_mean("collapse_rate")[ia]), float(pb.model_mean("collapse_rate")[ib])
        wa, wb = float(pa.model_mean("max_weight")[ia]), float(pb.model_mean("max_weight")[ib])
        if all(math.isfinite(v) for v in (ca, cb, wa, wb)) and abs(wb - wa) >= 0.05:
            verb = "less" if wb < wa else "more"
            out.append({
                "kind": "saturation_change", "probe": pa.name, "level": level, "a": wa, "b": wb,
                "text": f"{pa.name} {level_text(pa, level)}: B is {verb} saturated (max weight {wa:.2f} → "
                        f"{wb:.2f}, collapse rate {ca:.2f} → {cb:.2f})",
            })  # fmt: skip
    base_a, base_b = baseline_probe(a.probes), baseline_probe(b.probes)
    if base_a is not None and base_b is not None and all("sink_rate" in p.metrics for p in (base_a, base_b)):
        na = int(np.nansum(base_a.metrics["sink_rate"][0]))
        nb = int(np.nansum(base_b.metrics["sink_rate"][0]))
        if na != nb:
            text = f"sink heads at baseline: {na} of {sum(a.heads)} in A, {nb} of {sum(b.heads)} in B"
            out.append({"kind": "sink_change", "a": na, "b": nb, "text": text})
    return out[:MAX_FINDINGS]
