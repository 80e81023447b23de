"""Per-head and per-layer collapse points, the level where heads differ most, and what `--compare`
says changed, on tiny GPT-2 models whose heads are built to collapse at different levels.

The reference is independent of diagnose: `logit-scale` α multiplies every attention logit by α,
which for GPT-2 (logits q·k/√d) is the same as multiplying every query projection by α. So each
level is re-run here as a plain eager forward of a copy of the model with its query weights scaled,
and collapse rates, sink heads and collapse points are counted from `output_attentions` with
naive loops. Heads are made to differ by scaling their query weights (a head scaled by c sees α·c).
"""

from __future__ import annotations

import copy
import html
import io
import json

import numpy as np
import pytest
import torch
from rich.console import Console

from ssacli import diagnose
from ssacli.defaults import SINK_EPS, TAU
from ssacli.diagnosis.comparison import compare_results, comparison_findings
from ssacli.report.html import comparison_html, diagnose_html
from ssacli.report.terminal import render_comparison, render_diagnose
from tests.helpers.models import VOCAB, build_model

D, HEADS, HEAD_DIM = 32, 4, 8
LEVELS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
PROBE = "logit-scale:" + ",".join(str(v) for v in LEVELS)
HEAD_SCALES = (1, 4, 16, 64)  # layer 0's heads: 64 is collapsed before any shift


def _ids():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(3, VOCAB, (5, 16), generator=gen).tolist()


def _model_a():
    """Two layers × four heads. Position 0 carries a large value in dimension 0 (so a head can be
    made a sink by reading it). Layer 0's heads see their logits × 1, 4, 16, 64."""
    model = build_model("gpt2", n_layer=2, n_head=HEADS, n_embd=D)
    with torch.no_grad():
        model.transformer.wte.weight[:, 0] = 0.0
        model.transformer.wpe.weight[:, 0] = 0.0
        model.transformer.wpe.weight[0, 0] = 30.0
        for layer in model.transformer.h:
            layer.attn.c_attn.weight[:, : 2 * D] *= 3.0  # logits of order 1, so heads can collapse
        attn = model.transformer.h[0].attn.c_attn
        for head, c in enumerate(HEAD_SCALES):
            attn.weight[:, head * HEAD_DIM : (head + 1) * HEAD_DIM] *= c
            attn.bias[head * HEAD_DIM : (head + 1) * HEAD_DIM] *= c
    return model


def _model_b():
    """A with layer 0's queries ÷ 8 (its logits at level 8α equal A's at α: powers of two, exact)
    and layer 1's head 0 made a sink: a constant query and a key that reads dimension 0."""
    model = copy.deepcopy(_model_a())
    with torch.no_grad():
        first = model.transformer.h[0].attn.c_attn
        first.weight[:, :D] /= 8
        first.bias[:D] /= 8
        attn = model.transformer.h[1].attn.c_attn
        attn.weight[:, :HEAD_DIM] = 0.0
        attn.bias[:HEAD_DIM] = 0.0
        attn.bias[0] = 10.0
        attn.weight[:, D : D + HEAD_DIM] = 0.0
        attn.bias[D : D + HEAD_DIM] = 0.0
        attn.weight[0, D] = 10.0
    return model


def _eager(model, ids):
    """Per level: collapse rate [layer, head] (rows with >= 2 visible keys, max weight >= τ) and
    sink mass (weight on key 0) from the eager forward of a copy whose queries are × α."""
    rates, sinks = [], []
    for alpha in LEVELS:
        scaled = copy.deepcopy(model)
        with torch.no_grad():
            for layer in scaled.transformer.h:
                layer.attn.c_attn.weight[:, :D] *= alpha
                layer.attn.c_attn.bias[:D] *= alpha
            attentions = scaled(torch.tensor(ids), output_attentions=True).attentions
        rows = [a[:, :, 1:, :].double() for a in attentions]  # query 0 sees one key: not counted
        rates.append([(r.amax(-1) >= TAU).double().mean(dim=(0, 2)).tolist() for r in rows])
        sinks.append([r[..., 0].mean(dim=(0, 2)).tolist() for r in rows])
    return np.array(rates), np.array(sinks)


def _first(levels, rates):
    return next((lv for lv, r in zip(levels, rates) if r >= 0.5), None)


def _expected(rates):
    """Collapse points by hand: heads collapsed at level 1 set apart; per head, per layer (mean of
    the layer's other heads) and for the model (mean of all other heads), first level after 1."""
    base = rates[0] >= 0.5
    heads = [
        [None if base[layer, h] else _first(LEVELS[1:], rates[1:, layer, h]) for h in range(HEADS)]
        for layer in range(2)
    ]
    fresh = np.where(base[None], np.nan, rates)
    layers = [_first(LEVELS[1:], np.nanmean(fresh[1:, layer], axis=1)) for layer in range(2)]
    model = _first(LEVELS[1:], np.nanmean(fresh[1:].reshape(len(LEVELS) - 1, -1), axis=1))
    spread = [np.std(fresh[i][~base]) for i in range(len(LEVELS))]
    return base, heads, layers, model, int(np.argmax(spread))


@pytest.fixture(scope="module")
def runs():
    ids = _ids()
    out = {}
    for name, build in (("a", _model_a), ("b", _model_b)):
        model = build()
        out[name] = (diagnose(model, [PROBE], inputs=ids), *_eager(model, ids))
    return out


def test_per_head_and_per_layer_collapse_points_match_the_eager_reference(runs):
    result, rates, _ = runs["a"]
    probe = result.probe("logit-scale")
    np.testing.assert_allclose(probe.metrics["collapse_rate"], rates, atol=1e-9)
    base, heads, layers, model, different = _expected(rates)
    assert base[0, 3] and probe.baseline_collapsed_heads() == [tuple(h) for h in np.argwhere(base).tolist()]
    assert probe.head_collapse_points() == heads
    assert probe.layer_collapse_points() == layers
    assert probe.collapse_point() == model
    # The heads were built so: a head whose logits are × 4 more collapses no later, and they differ.
    first = heads[0][:3]
    assert None not in first and first[0] >= first[1] >= first[2] and first[0] > first[2]
    assert probe.most_different_level() == different
    summary = json.loads(result.to_json())["probes"][0]["summary"]
    assert summary["head_collapse_points"] == heads and summary["layer_collapse_points"] == layers
    assert summary["most_different_level"] == LEVELS[different]
    assert summary["baseline_collapsed_heads"] == np.argwhere(base).tolist()


def test_reports_show_per_head_points_and_name_the_heatmap_level(runs):
    result, rates, _ = runs["a"]
    _, heads, layers, model, _ = _expected(rates)
    console = Console(record=True, width=80, color_system=None, file=io.StringIO())
    render_diagnose(result, console, heatmap_probe="logit-scale")
    text = console.export_text()
    grid = [line.split()[1:] for line in text.splitlines() if line.split()[:1] == ["0"]]
    cells = ["B" if h is None else f"{h:g}" for h in heads[0]]
    assert cells in grid  # layer 0's row of the per-head collapse-point grid
    assert f"layer 0 at {layers[0]:g}" in " ".join(text.split())  # the per-layer line, unwrapped
    # Heatmaps show where the probe acts: the model's collapse point, computed by hand above.
    assert model is not None
    where = f"α={model:g} (its collapse point)"
    assert f"heatmap: max_weight, probe logit-scale at {where}" in " ".join(text.split())
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    page = diagnose_html(result)
    assert f"logit-scale: heatmaps at {where}" in page
    assert f"collapse point per layer: layer 0 at {layers[0]:g}" in page


def test_compare_says_what_changed_with_the_numbers(runs):
    (a, rates_a, sinks_a), (b, rates_b, sinks_b) = runs["a"], runs["b"]
    np.testing.assert_allclose(b.probe("logit-scale").metrics["collapse_rate"], rates_b, atol=1e-9)
    # Layer 0 of B at 8α is layer 0 of A at α: its heads' collapse points move exactly × 8. (The
    # layer's own point moves too, but not × 8: L0H3, collapsed at baseline in A, counts in B.)
    np.testing.assert_array_equal(rates_b[3:, 0], rates_a[:-3, 0])
    _, heads_a, layers_a, _, _ = _expected(rates_a)
    _, heads_b, layers_b, _, _ = _expected(rates_b)
    assert heads_a[0][3] is None and heads_b[0][3] is not None
    assert heads_b[0][:3] == [8 * p for p in heads_a[0][:3]]
    assert layers_a[0] is not None and layers_b[0] is not None and layers_a[0] != layers_b[0]
    found = {f["kind"]: f for f in comparison_findings(a, b)}
    # Sinks by hand (Gu: mean weight on the first token > ε), B's planted head among them.
    count_a, count_b = int((sinks_a[0] > SINK_EPS).sum()), int((sinks_b[0] > SINK_EPS).sum())
    assert sinks_b[0][1, 0] > 0.9 and count_b == count_a + 1
    assert (found["sink_change"]["a"], found["sink_change"]["b"]) == (count_a, count_b)
    assert f"first-token heads at baseline: {count_a} → {count_b} of 8" in found["sink_change"]["text"]
    # Collapsed before any shift: A's head scaled × 64 in layer 0, B's planted sink in layer 1.
    base_a, base_b = (np.argwhere(rates[0] >= 0.5).tolist() for rates in (rates_a, rates_b))
    assert (base_a, base_b) == ([[0, 3]], [[1, 0]])
    change = found["baseline_collapse_change"]
    assert (change["heads_a"], change["heads_b"]) == (base_a, base_b)
    assert "1 → 1 of 8 (A: L0H3; B: L1H0)" in change["text"]
    moved = {m["layer"]: (m["a"], m["b"]) for m in found["layer_collapse_change"]["layers"]}
    assert moved[0] == (layers_a[0], layers_b[0])
    assert (
        f"collapse point of layer 0 moved from α={layers_a[0]:g} to α={layers_b[0]:g}"
        in (found["layer_collapse_change"]["text"])
    )
    # Saturation: at the level where the model-mean collapse rate moved most, by hand.
    mean_a, mean_b = rates_a.mean(axis=(1, 2)), rates_b.mean(axis=(1, 2))
    i = max(range(len(LEVELS)), key=lambda k: (abs(mean_b[k] - mean_a[k]), LEVELS[k]))
    change = found["saturation_change"]
    assert change["level"] == LEVELS[i]
    assert change["collapse_rate"] == pytest.approx({"a": mean_a[i], "b": mean_b[i]})
    assert f"collapse {mean_a[i]:.0%} → {mean_b[i]:.0%}" in change["text"]
    # The same findings, with their numbers, in the comparison JSON, the terminal and the page.
    data = compare_results(a, b)
    json.dumps(data, allow_nan=False)
    assert [f["kind"] for f in data["findings"]] == [f["kind"] for f in comparison_findings(a, b)]
    console = Console(record=True, width=80, color_system=None, file=io.StringIO())
    render_comparison(a, b, console)
    flat = " ".join(console.export_text().replace("│", " ").split())  # wrapped lines joined
    page = comparison_html(a, b)
    for finding in data["findings"]:
        assert " ".join(finding["text"].split()) in flat
        assert html.escape(finding["text"]) in page
