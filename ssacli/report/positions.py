"""What the terminal and the HTML page say about where attention lands (a result's
:meth:`~ssacli.diagnosis.result.DiagnoseResult.position_profiles`): one row per layer (its head
classes, the sink share over the first k tokens and its boost over uniform, the local share, the mean
attention distance and the most-received position past the first k), the layer × head grid of head
classes, and the legend that states the bins' resolution and the classes' thresholds. Both reports
read these, so they always say the same thing."""

from __future__ import annotations

import warnings

import numpy as np

from .. import defaults
from ..diagnosis.positions import CLASS_RULES, HEAD_CLASSES, PositionProfiles
from ..diagnosis.result import DiagnoseResult
from .summary import fmt, fmt_level, layer_labels

CLASS_LETTERS = {"sink": "S", "local": "L", "focused": "F", "distributed": "D", None: "·"}
HEADER = ["layer", "classes", "sink@k", "boost", "local", "distance", "most received past k"]


def _level_index(result: DiagnoseResult, profiles: PositionProfiles) -> tuple[object, int] | None:
    for probe in result.probes:
        if probe.name == profiles.probe and profiles.level in probe.levels:
            return probe, probe.levels.index(profiles.level)
    return None


def _layer_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _counts(profiles: PositionProfiles, layer: int) -> str:
    counts = profiles.class_counts(layer)
    return " ".join(f"{CLASS_LETTERS[name]}{counts[name]}" for name in HEAD_CLASSES)


def _most_received(profiles: PositionProfiles, layer: int, sinks: list) -> str:
    """The layer's head whose top bin past the first k receives the most: "512–639 H3 .21 ×4.2"."""
    best = None
    for head, found in enumerate(sinks[layer]):
        if found and (best is None or found[0]["share"] > best[1]["share"]):
            best = (head, found[0])
    if best is None:
        return "–"
    head, top = best
    boost = "" if top["boost"] is None else f" ×{top['boost']:.3g}"
    first, last = top["keys"][0], top["keys"][1] - 1
    keys = str(first) if first == last else f"{first}–{last}"
    return f"{keys} H{head} {fmt(top['share'])}{boost}"


def _tokens(count: int) -> str:
    return f"{count} token" if count == 1 else f"{count} tokens"


def position_rows(result: DiagnoseResult) -> tuple[str, list[str], list[list[str]]] | None:
    """(title, header, one row per layer) of the position summary; None where not measured. The
    scalar columns are head means of the probe's arrays at the profiles' level."""
    profiles = result.position_profiles()
    if profiles is None:
        return None
    found = _level_index(result, profiles)
    labels = layer_labels(result.layers)
    sinks = profiles.secondary_sinks(1)
    rows = []
    for layer in range(len(profiles.classes)):
        means = ["–"] * 4
        if found is not None:
            probe, index = found
            names = ("sink_share", "sink_boost", "local_share", "attention_distance")
            means = [fmt(_layer_mean(probe.metrics[name][index, layer])) for name in names]
        label = labels[layer] if layer < len(labels) else str(layer)
        rows.append([label, _counts(profiles, layer), *means, _most_received(profiles, layer, sinks)])
    title = (
        f"where attention lands · {profiles.probe} at {fmt_level(profiles.level)} · first k = "
        f"{profiles.sink_k} · bins of {_tokens(profiles.bin_width)}"
    )
    return title, HEADER, rows


def class_grid(profiles: PositionProfiles) -> list[list[str]]:
    """The layer × head grid of class letters (· where not measured)."""
    return [[CLASS_LETTERS[c] for c in row] for row in profiles.classes]


def position_legend(profiles: PositionProfiles) -> str:
    """What the columns and letters mean, the thresholds and the resolution of the positions."""
    rules = "; ".join(f"{CLASS_LETTERS[name]} {name}: {rule}" for name, rule in CLASS_RULES.items())
    counts = profiles.class_counts()
    total = ", ".join(f"{counts[name]} {name}" for name in HEAD_CLASSES)
    return (
        f"heads: {total}. Classes, the first that holds: {rules} (the findings' first-token heads are "
        f"another count: weight on token 0 > {defaults.SINK_EPS:g}). sink@k: weight on the first "
        f"{profiles.sink_k} tokens; boost: that over what uniform weights give them; local: weight "
        f"within {defaults.LOCAL_DISTANCE} tokens; distance: mean |i − j|. Most received past k: the "
        f"head whose key bin past the first k gets the largest mean share (keys, share, × over uniform); "
        f"positions are resolved to bins of {_tokens(profiles.bin_width)}."
    )


def profiles_figure(profiles: PositionProfiles):
    """Two layer × bin panels, head means: the attention received per key bin over uniform (log
    scale: a sink bin is bright, an ignored one dark) and the share of a row's weight per distance
    bin (0, 1, 2–3, …)."""
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    with warnings.catch_warnings():  # a layer with no measured head: its mean is NaN, said in the plot
        warnings.simplefilter("ignore", RuntimeWarning)
        boost = np.nanmean(profiles.received_boost, axis=1)  # [layer, key bin]
        distance = np.nanmean(profiles.distance, axis=1)  # [layer, distance bin]
    layers = boost.shape[0]
    fig = Figure(figsize=(11.0, min(max(2.6, 0.22 * layers + 1.4), 9.0)))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    finite = boost[np.isfinite(boost) & (boost > 0)]
    norm = LogNorm(vmin=max(finite.min(), 1e-3), vmax=max(finite.max(), 1.01)) if finite.size else None
    image = left.imshow(np.ma.masked_invalid(np.where(boost > 0, boost, np.nan)), aspect="auto", norm=norm,
                        cmap="magma", interpolation="nearest")  # fmt: skip
    fig.colorbar(image, ax=left, fraction=0.04, pad=0.02).ax.tick_params(labelsize=7)
    edges = profiles.key_edges
    bins = len(edges) - 1
    step = max(1, bins // 8)  # about 8 labels, evenly spaced from bin 0 (labels of adjacent bins collide)
    ticks = sorted({0, *range(step, bins, step)})
    if bins - 1 - ticks[-1] >= max(1, step // 2):
        ticks.append(bins - 1)
    left.set_xticks(ticks, [str(edges[t]) for t in ticks], size=7)
    left.set_title(f"received ÷ uniform by key position (bin 0: the first {profiles.sink_k})", size=9)
    left.set_xlabel("first key of the bin", size=8)
    image = right.imshow(np.ma.masked_invalid(distance), aspect="auto", cmap="viridis", vmin=0.0,
                         interpolation="nearest")  # fmt: skip
    fig.colorbar(image, ax=right, fraction=0.05, pad=0.02).ax.tick_params(labelsize=7)
    dedges = profiles.distance_edges
    right.set_xticks(range(len(dedges) - 1), [str(e) for e in dedges[:-1]], size=7)
    right.set_title("share of a row's weight by distance |i − j|", size=9)
    right.set_xlabel("first distance of the bin", size=8)
    for ax in (left, right):
        ax.set_yticks(range(0, layers, max(1, -(-layers // 16))))
        ax.set_ylabel("layer", size=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


__all__ = [
    "CLASS_LETTERS", "class_grid", "position_legend", "position_rows", "profiles_figure",
]  # fmt: skip
