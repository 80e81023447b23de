"""What every diagnose report says, as plain strings: facts, number formats, table columns and
rows, layer labels, legends, the heatmap's probe and saturation colors.

The terminal (:mod:`ssacli.report.terminal`) and the HTML page (:mod:`ssacli.report.html`) both
read these, so they always say the same thing; what each metric is called and which way it
saturates comes from :data:`ssacli.diagnosis.metrics.METRICS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..diagnosis.findings import level_text
from ..diagnosis.metrics import LAYER_METRICS, METRICS, QUALITY_METRICS
from ..diagnosis.probe_result import ProbeResult
from ..diagnosis.result import DiagnoseResult
from ..errors import UsageError


def fmt(value: Any) -> str:
    """Three significant digits; a dash where the value is missing or undefined."""
    if value is None:
        return "–"
    value = float(value)
    return f"{value:.3g}" if math.isfinite(value) else "–"


def fmt_level(level: float) -> str:
    return f"{level:g}"


def fmt_delta(value: Any) -> str:
    """Signed, so a change reads as one: "+0.1", "-0.25", "0" for no change."""
    text = fmt(value)
    if text in ("–", "0", "-0"):
        return text.lstrip("-")
    return text if text.startswith("-") else "+" + text


def describe(value: Any, limit: int = 100) -> str:
    """One line for a settings value of any shape (inputs can be a list of texts or a count)."""
    if isinstance(value, dict):
        text = ", ".join(f"{k}={describe(v, limit)}" for k, v in value.items())
    elif isinstance(value, list | tuple):
        text = ", ".join(describe(v, limit) for v in value)
    elif value is None:
        text = "–"
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def layer_labels(layers: Sequence[str], width: int = 24) -> list[str]:
    """``"3 mid.part"``: the layer index plus what differs between module names.

    Leading and trailing dotted components shared by every name ("model.layers." ... ".self_attn")
    say nothing, so they are dropped; when only the index remains, the index alone is the label.
    """
    parts = [name.split(".") for name in layers]
    if not parts:
        return []
    lead = 0
    while all(len(p) > lead + 1 for p in parts) and len({p[lead] for p in parts}) == 1:
        lead += 1
    tail = 0
    while all(len(p) > lead + tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    labels = []
    for index, p in enumerate(parts):
        rest = ".".join(p[lead : len(p) - tail])
        if rest == str(index) or len(layers) == 1:
            labels.append(str(index))
            continue
        if len(rest) > width:
            rest = "…" + rest[-(width - 1) :]
        labels.append(f"{index} {rest}")
    return labels


def table_columns(probe: ProbeResult) -> list[str]:
    """The metrics worth a column for this probe: the key ones, plus outlier capture where the
    probe defines it, the learned sink where the model has one and row mass where a scorer does not
    normalize rows."""
    names = [m for m, spec in METRICS.items() if spec.key and m in probe.metrics]
    for name in ("outlier_capture", "learned_sink"):
        if name in probe.metrics and np.isfinite(probe.metrics[name]).any():
            names.append(name)
    if "row_mass" in probe.metrics:
        mass = probe.metrics["row_mass"]
        finite = mass[np.isfinite(mass)]
        if finite.size and float(np.abs(finite - 1.0).max()) > 1e-3:
            names.append("row_mass")
    return names


REACH_COLUMN = "logit rms ×"  # the per-level logit RMS ÷ the first level's (where the probe acts)


def probe_table_rows(probe: ProbeResult) -> tuple[list[str], list[list[str]]]:
    """Header and formatted rows (one per level) of a probe's model-mean table: the metrics, the
    logit RMS ratio for magnitude probes (where the probe acts: ProbeResult.reach), then the extras. A level
    whose forward overflowed reads "overflow" in every cell."""
    metrics = table_columns(probe)
    means = {m: probe.model_mean(m) for m in metrics}
    reach = probe.reach_model() if probe.kind is not None and probe.kind.magnitude else None
    if reach is not None and all(r is None for r in reach):
        reach = None
    extras = [k for k in probe.extras if k != "tokens"]
    header = ["level", *(["tokens"] if "tokens" in probe.extras else []), *metrics,
              *([REACH_COLUMN] if reach is not None else []), *extras]  # fmt: skip
    rows = []
    for i, level in enumerate(probe.levels):
        if probe.overflowed(i):
            rows.append([fmt_level(level), *(["overflow"] * (len(header) - 1))])
            continue
        row = [fmt_level(level)]
        if "tokens" in probe.extras:
            row.append(fmt(probe.extras["tokens"][i]))
        row += [fmt(means[m][i]) for m in metrics]
        if reach is not None:
            row.append("–" if reach[i] is None else f"{reach[i]:.2f}")
        row += [fmt(probe.extras[k][i] if i < len(probe.extras[k]) else None) for k in extras]
        rows.append(row)
    return header, rows


SATURATED_TITLE = "most saturated heads (at the level where each probe's heads differ most)"
SATURATED_METRICS = ("collapse_rate", "max_weight", "entropy")  # its columns after probe, level, layer, head


def saturated_rows(result: DiagnoseResult, count: int) -> list[list[str]]:
    """The ``count`` most saturated heads (:meth:`~ssacli.diagnosis.result.DiagnoseResult.most_saturated`)
    as table rows: probe, level, layer label, head, then :data:`SATURATED_METRICS`."""
    labels = layer_labels(result.layers)
    rows = []
    for h in result.most_saturated(count):
        layer = labels[h["layer"]] if h["layer"] < len(labels) else str(h["layer"])
        values = [fmt(h[m]) for m in SATURATED_METRICS]
        rows.append([h["probe"], fmt_level(h["level"]), layer, str(h["head"]), *values])
    return rows


def column_header(name: str) -> str:
    if name in METRICS:
        return METRICS[name].header
    if name in LAYER_METRICS:
        return LAYER_METRICS[name].header
    if name in QUALITY_METRICS:  # extras: the loss and the output KL per level
        return QUALITY_METRICS[name].header
    return name


def summary_findings(result: DiagnoseResult) -> list[str]:
    """The findings' sentences, in order (terminal and HTML show the same list)."""
    return [f["text"] for f in result.findings()]


def collapse_cell(probe: ProbeResult) -> str:
    """What the summary says about a probe's collapse point (n/a and overflow included)."""
    return probe.collapse_status()


def summary_facts(result: DiagnoseResult) -> list[tuple[str, str]]:
    """The header facts of a result, in display order, as plain strings."""
    settings = result.settings
    probes = "; ".join(
        f"{p.name}: " + ("skipped" if p.skipped else ", ".join(fmt_level(v) for v in p.levels))
        for p in result.probes
    )
    points = "; ".join(f"{p.name}: " + ("skipped" if p.skipped else collapse_cell(p)) for p in result.probes)
    device = f"{describe(settings.get('device'))} / {describe(settings.get('dtype'))}"
    return [
        ("model", result.model),
        ("family", result.family),
        ("scorer", result.scorer),
        ("route", result.route),
        ("layers × heads", layers_by_heads(result)),
        ("inputs", describe(settings.get("inputs"))),
        *([("shift", shift_fact(settings["shift"]))] if settings.get("shift") else []),
        *(
            [
                (
                    "length",
                    f"{settings['length']} {settings.get('length_unit', 'tokens')} (--length "
                    f"{settings['length_asked']} capped at the model's maximum)",
                )
            ]
            if settings.get("length_asked") is not None
            else []
        ),
        ("device / dtype", device),
        ("probes (levels)", probes),
        ("collapse point", points),
        *([("unaudited", result.unaudited)] if result.unaudited else []),
        ("elapsed", f"{result.elapsed_s:.1f} s"),
    ]


def shift_fact(shift: dict[str, Any]) -> str:
    """The --shift corpus as the header names it: "code.txt against the --text file, 8 documents of
    64 tokens each"."""
    return (f"{shift.get('name')} against {shift.get('reference')}, {shift.get('documents')} documents "
            f"of {shift.get('tokens')} tokens each")  # fmt: skip


def layers_by_heads(result: DiagnoseResult) -> str:
    """The shape: "3 × 4", or "3 × 2–4" where layers have different head counts."""
    heads = sorted(set(result.heads)) or [0]
    return f"{len(result.layers)} × {heads[0] if len(heads) == 1 else f'{heads[0]}–{heads[-1]}'}"


def pick_heatmap(result: DiagnoseResult, metric: str, probe: str | None) -> ProbeResult:
    """The probe a heatmap shows: the one asked for, else the non-skipped probe whose harshest
    level has the highest model-mean max weight (where saturation shows most)."""
    if metric not in METRICS:
        raise UsageError(f"unknown heatmap metric '{metric}'; choose one of: {', '.join(METRICS)}")
    if probe is not None:
        try:
            chosen = result.probe(probe)
        except KeyError as err:
            raise UsageError(err.args[0]) from None
        if chosen.skipped:
            raise UsageError(f"probe '{probe}' was skipped ({chosen.note or 'no data'}); pick another")
    else:
        live = [p for p in result.probes if not p.skipped]
        if not live:
            why = "; ".join(f"{p.name}: {p.note or 'no data'}" for p in result.probes)
            raise UsageError(f"nothing was measured: every probe was skipped ({why}); choose probes this "
                             "model can take (`ssacli diagnose --help` lists them)")  # fmt: skip
        chosen = max(live, key=_last_peak)
    if metric not in chosen.metrics:
        raise UsageError(f"probe '{chosen.name}' has no metric '{metric}'; choose another heatmap metric")
    return chosen


def _last_peak(probe: ProbeResult) -> float:
    value = float(probe.model_mean("max_weight")[-1])
    return value if math.isfinite(value) else -math.inf


def saturation_scale(metric: str, grid: np.ndarray) -> tuple[float, float]:
    """Value range for colors: [0, 1] for bounded metrics so colors compare across models,
    the grid's own range otherwise."""
    if metric in METRICS and METRICS[metric].bounded:
        return 0.0, 1.0
    finite = grid[np.isfinite(grid)]
    if not finite.size:
        return 0.0, 1.0
    return float(finite.min()), float(finite.max())


def saturation(metric: str, value: float, lo: float, hi: float) -> float:
    """0 = calm, 1 = saturated, for a value on the metric's color range."""
    t = 0.5 if hi <= lo else min(max((value - lo) / (hi - lo), 0.0), 1.0)
    return 1.0 - t if metric in METRICS and METRICS[metric].higher_is_saturated is False else t


def delta_verdict(metric: str, delta: float) -> str:
    """What Δ = B − A of a metric says: "worse" (B more saturated), "better" (less), or "" (no
    change, undefined, or a metric with no saturating direction)."""
    direction = METRICS[metric].direction if metric in METRICS else "none"
    if not math.isfinite(delta) or direction == "none" or abs(delta) < 1e-12:
        return ""
    return "worse" if (delta > 0) == (direction == "high") else "better"


def comparison_columns(pa: ProbeResult, pb: ProbeResult) -> list[str]:
    """The compared metrics (:attr:`MetricSpec.compared`) defined (finite somewhere) in at least one
    of the two probes."""
    return [
        m
        for m, spec in METRICS.items()
        if spec.compared
        and m in pa.metrics
        and m in pb.metrics
        and (np.isfinite(pa.metrics[m]).any() or np.isfinite(pb.metrics[m]).any())
    ]


def collapse_point_grid(probe: ProbeResult) -> list[list[str]] | None:
    """[layer][head] cells: the level where each head collapses, "B" if it is collapsed at the
    first level (baseline), "·" if it never does, "" for a head the layer does not have (None when
    no head ever collapses)."""
    if probe.insensitive or "collapse_rate" not in probe.metrics:
        return None
    points = probe.head_collapse_points()
    base = probe.baseline_collapsed()
    exists = np.isfinite(probe.metrics["collapse_rate"]).any(axis=0)
    cells = [
        [
            ""
            if not exists[layer, head]
            else "B"
            if base[layer, head]
            else "·"
            if p is None
            else fmt_level(p)
            for head, p in enumerate(row)
        ]
        for layer, row in enumerate(points)
    ]
    if all(c in ("·", "") for row in cells for c in row):
        return None
    return cells


def collapse_grid_legend(probe: ProbeResult) -> str:
    return (
        f"per-head collapse points, probe {probe.name}: the first level where the head collapses "
        "(max weight ≥ τ in half its rows); B = collapsed at baseline, · = never"
    )


def heatmap_index(probe: ProbeResult) -> int:
    """The level a probe's heatmaps show: where the probe acts, its collapse point, or, where it has
    none, its harshest level that did not overflow (not where the heads differ most, which is often
    the unshifted level and shows no effect of the probe)."""
    point = probe.collapse_point()
    if point is not None and point in probe.levels:
        return probe.levels.index(point)
    finite = [i for i in range(len(probe.levels)) if not probe.overflowed(i)]
    return finite[-1] if finite else len(probe.levels) - 1


def heatmap_legend(probe: ProbeResult, metric: str, index: int | None = None) -> str:
    direction = METRICS[metric].direction
    saturated = {"high": "high values", "low": "low values"}.get(direction, "no direction")
    index = heatmap_index(probe) if index is None else index
    return (
        f"heatmap: {metric}, probe {probe.name} at {level_text(probe, probe.levels[index])} "
        f"({level_reason(probe, index)}); rows = layers, columns = heads; darker = more saturated "
        f"({saturated}); · = undefined"
    )


def level_reason(probe: ProbeResult, index: int) -> str:
    """Why a heatmap shows level ``index``: the probe's collapse point, or its harshest level
    (that did not overflow) where it has none."""
    if index != heatmap_index(probe):
        return "the level asked for"
    if probe.collapse_point() is not None:
        return "its collapse point"
    if index != len(probe.levels) - 1:
        return "its harshest level without overflow; no model-level collapse point"
    return "its harshest level; no model-level collapse point"


def heatmap_level_text(probe: ProbeResult) -> str:
    """The sentence that names the level a probe's heatmaps show and why."""
    index = heatmap_index(probe)
    where = level_text(probe, probe.levels[index])
    return f"{probe.name}: heatmaps at {where} ({level_reason(probe, index)})"


def collapse_detail(probe: ProbeResult) -> str | None:
    """One line on where a probe's collapse starts: the collapse point of each layer (consecutive
    layers with the same point grouped) and how the heads' own collapse points spread (the first
    level and its heads, how many heads have collapsed by the last level, how many never do).
    Heads collapsed at baseline are left out (listed on their own line). None where the probe
    cannot say (n/a, absorbed: its shift did not arrive) or no head collapses."""
    if probe.insensitive or probe.reached() is False or "collapse_rate" not in probe.metrics:
        return None
    exists = np.isfinite(probe.metrics["collapse_rate"]).any(axis=0)
    base = probe.baseline_collapsed()
    points = probe.head_collapse_points()
    heads = [(layer, head, point) for layer, row in enumerate(points) for head, point in enumerate(row)
             if exists[layer, head] and not base[layer, head]]  # fmt: skip
    collapsed = [(layer, head, point) for layer, head, point in heads if point is not None]
    if not collapsed:
        return None
    first = min(point for _, _, point in collapsed)
    firsts = [f"L{layer}H{head}" for layer, head, point in collapsed if point == first]
    shown = ", ".join(firsts[:4]) + (f" +{len(firsts) - 4} more" if len(firsts) > 4 else "")
    last = max(point for _, _, point in collapsed)
    never = len(heads) - len(collapsed)
    per_head = f"first at {fmt_level(first)} ({shown})"
    if last != first or never:
        per_head += f", {len(collapsed)} of {len(heads)} by {fmt_level(last)}"
    if never:
        per_head += f", {never} never"
    return (
        f"collapse point per layer: {_grouped_layers(probe.layer_collapse_points())} · per head: {per_head}"
    )


def _grouped_layers(points: list[float | None]) -> str:
    """[8, 8, None, 4] -> "layers 0–1 at 8, layer 2 never, layer 3 at 4"."""
    groups: list[list] = []
    for layer, point in enumerate(points):
        if groups and groups[-1][2] == point and groups[-1][1] == layer - 1:
            groups[-1][1] = layer
        else:
            groups.append([layer, layer, point])
    return ", ".join(
        (f"layer {start}" if start == end else f"layers {start}–{end}")
        + (" never" if point is None else f" at {fmt_level(point)}")
        for start, end, point in groups
    )
