"""What the ``generation`` section of a diagnose report (``diagnose --generate N``) says: per layer,
the key metrics at the first and the last generated token, the model means over bins of generated
positions, and (HTML) one figure of the model mean per metric against the cache's key length. The
terminal (:func:`ssacli.report.terminal.generation_tables`) and the HTML page
(:func:`ssacli.report.html.generation_body`) lay these out.

Numbers come from :class:`~ssacli.diagnosis.generation.GenerationResult` only.
"""

from __future__ import annotations

import math

import numpy as np

from ..diagnosis.generation import GenerationResult
from ..diagnosis.metrics import METRICS

# The metrics shown (first and last step per layer; model means per bin).
SHOWN = ("entropy", "max_weight", "collapse_rate", "sink_mass")
BINNED = ("entropy", "max_weight", "collapse_rate", "effective_tokens", "sink_mass")
BINS = 4


def fmt(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"


def title(gen: GenerationResult) -> str:
    keys = gen.key_lengths()
    exact = "not checked" if gen.max_rel_diff is None else f"max rel. diff {gen.max_rel_diff:.1e}"
    return (
        f"generation · {gen.steps} greedy tokens after {gen.prompts} prompts · keys {keys[0]}→{keys[-1]} · "
        f"vs full recomputation: {exact}"
    )


def layer_rows(gen: GenerationResult, labels: list[str]) -> tuple[list[str], list[list[str]]]:
    """Per layer: each shown metric's head mean at the first and the last generated step."""
    header = ["layer"]
    for name in SHOWN:
        header += [f"{METRICS[name].header}\nfirst", f"{METRICS[name].header}\nlast"]
    means = {name: gen.layer_mean(name) for name in SHOWN}
    rows = []
    for layer, label in enumerate(labels):
        row = [label]
        for name in SHOWN:
            row += [fmt(means[name][0, layer]), fmt(means[name][-1, layer])]
        rows.append(row)
    return header, rows


def bins(steps: int, count: int = BINS) -> list[tuple[int, int]]:
    """``count`` (at most ``steps``) contiguous [start, stop) ranges of the steps, nearly equal."""
    edges = np.linspace(0, steps, min(count, steps) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def bin_rows(gen: GenerationResult) -> tuple[list[str], list[list[str]]]:
    """Per bin of generated positions: each binned metric's mean over steps, layers and heads."""
    header = ["tokens", "keys", *(METRICS[n].header for n in BINNED)]
    keys = gen.key_lengths()
    rows = []
    for start, stop in bins(gen.steps):
        row = [f"{start + 1}-{stop}", f"{keys[start]}-{keys[stop - 1]}"]
        for name in BINNED:
            values = gen.metrics[name][start:stop]
            row.append(fmt(float(np.nanmean(values))) if np.isfinite(values).any() else "n/a")
        rows.append(row)
    return header, rows


def generation_figure(gen: GenerationResult):
    """Per shown metric: the model mean (black) and each layer's head mean against the key length."""
    from .figures import LAYERS, metric_title, panel_grid

    fig, axes = panel_grid(len(BINNED))
    keys = np.asarray(gen.key_lengths(), dtype=float)
    for ax, name in zip(axes, BINNED):
        per_layer = gen.layer_mean(name)
        count = per_layer.shape[1]
        for layer in range(count):
            ax.plot(keys, per_layer[:, layer], lw=0.7, alpha=0.7, color=LAYERS(layer / max(count - 1, 1)))
        with np.errstate(invalid="ignore"):
            ax.plot(keys, np.nanmean(per_layer, axis=1), lw=2.2, color="black")
        ax.set_xlabel("key length (prompt + generated)", size=8)
        metric_title(ax, name)
    fig.suptitle("generation: metrics per decoding step (black: model mean; lines: layers)", size=9)
    return fig


def comparison_rows(comparison: dict) -> tuple[str, list[str], list[list[str]]]:
    """``diagnose --compare`` of two generations (:func:`~ssacli.diagnosis.comparison.
    generation_comparison`): a title, and per metric A, B and B − A of the mean over the common steps."""
    steps, prompt = comparison["steps"], comparison["prompt_length"]
    same = prompt["a"] == prompt["b"]
    length = f"prompt {prompt['a']}" if same else f"prompts A {prompt['a']}, B {prompt['b']}"
    caption = f"generation · first {steps} greedy tokens · {length} · means over steps, layers, heads"
    rows = []
    for name, values in comparison["metrics"].items():
        cells = [fmt(math.nan if values[k] is None else values[k]) for k in ("a", "b")]
        delta = values["delta"]
        rows.append([METRICS[name].header, *cells, "n/a" if delta is None else f"{delta:+.3f}"])
    return caption, ["metric", "A", "B", "Δ"], rows


def comparison_figure(ga: GenerationResult, gb: GenerationResult):
    """Per binned metric: the model mean against the key length, A solid and B dashed."""
    from .figures import metric_title, panel_grid

    fig, axes = panel_grid(len(BINNED))
    for ax, name in zip(axes, BINNED):
        for gen, style, side in ((ga, "-", "A"), (gb, "--", "B")):
            with np.errstate(invalid="ignore"):
                mean = np.nanmean(gen.layer_mean(name), axis=1)
            ax.plot(gen.key_lengths(), mean, style, lw=1.8, color="black", label=side)
        ax.set_xlabel("key length (prompt + generated)", size=8)
        metric_title(ax, name)
    axes[0].legend(fontsize=7)
    fig.suptitle("generation: model mean per decoding step (A solid, B dashed)", size=9)
    return fig


__all__ = [
    "bin_rows", "bins", "comparison_figure", "comparison_rows", "generation_figure", "layer_rows", "title",
]  # fmt: skip
