"""The mechanism study's statistics and its intervention (studies/mechanism/mechanism_common.py),
against independent references: average ranks counted by hand, the partial correlation as the
correlation of least-squares residuals, and a softened model against its own eager softmax."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ssacli.stats import ranks

PATH = Path(__file__).resolve().parents[2] / "studies" / "mechanism" / "mechanism_common.py"
spec = importlib.util.spec_from_file_location("mechanism_common", PATH)
common = importlib.util.module_from_spec(spec)
spec.loader.exec_module(common)


def naive_ranks(values):
    """Rank i = 1 + (values below) + (ties − 1) / 2, counted by hand (0-based here)."""
    return [sum(w < v for w in values) + (sum(w == v for w in values) - 1) / 2 for v in values]


def test_ranks_average_ties_and_spearman_is_pearson_of_them():
    values = [0.0, 0.3, 0.0, 0.0, 0.9, 0.3]
    assert ranks(values).tolist() == naive_ranks(values)
    x, y = [0.0, 0.0, 0.1, 0.2, 0.2, 0.5], [3.0, 1.0, 2.0, 5.0, 4.0, 6.0]
    rx, ry = np.array(naive_ranks(x)), np.array(naive_ranks(y))
    dx, dy = rx - rx.mean(), ry - ry.mean()
    reference = float((dx * dy).sum() / math.sqrt((dx**2).sum() * (dy**2).sum()))
    assert common.spearman(x, y) == pytest.approx(reference, rel=1e-12)
    assert common.spearman([1, 2, 3, 4], [1, 1, 1, 1]) is None  # one side does not vary
    assert common.spearman([1, 2], [2, 1]) is None  # fewer than 3 points


def test_partial_spearman_is_the_correlation_of_rank_residuals():
    rng = np.random.default_rng(3)
    z = rng.integers(0, 4, 60).astype(float)  # a level, with ties
    x = z + rng.normal(size=60)
    y = z - 0.5 * x + rng.normal(size=60)
    rx, ry, rz = (ranks(v) for v in (x, y, z))
    design = np.column_stack([np.ones(60), rz])
    residual = [r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in (rx, ry)]
    reference = float(np.corrcoef(*residual)[0, 1])
    assert common.partial_spearman(x, y, z) == pytest.approx(reference, rel=1e-9)
    # the level alone drives both: the pooled ρ is large, the partial one is not
    noise_x, noise_y = rng.normal(size=60), rng.normal(size=60)
    assert common.spearman(z + 0.3 * noise_x, z + 0.3 * noise_y) > 0.6
    assert abs(common.partial_spearman(z + 0.3 * noise_x, z + 0.3 * noise_y, z)) < 0.3


def test_seed_bootstrap_gives_no_interval_from_one_seed_and_a_proper_one_from_several():
    one = common.association({0: [(0.1, 1.0), (0.2, 2.0), (0.3, 3.5)]})
    assert one["rho"] == pytest.approx(1.0) and one["ci_low"] is None and one["ci_high"] is None
    rng = np.random.default_rng(0)
    points = {s: [(float(a), float(a + rng.normal(scale=0.5))) for a in rng.normal(size=3)] for s in range(8)}
    several = common.association(points)
    assert several["seeds"] == 8 and several["models"] == 24
    assert several["ci_low"] <= several["rho"] <= several["ci_high"]
    assert "[" in common.interval(several) and "no interval" in common.interval(one)


def test_soften_heads_changes_only_the_chosen_heads_and_is_exact_at_t_1():
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=32, vocab_size=50)
    model = GPT2Model(config).eval()
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        reference = model(ids, output_attentions=True).attentions
    common.soften_heads(model, [(1, 2)], 1.0)
    with torch.no_grad():
        same = model(ids, output_attentions=True)
    for a, b in zip(reference, same.attentions):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    common.soften_heads(model, [(1, 2)], 4.0)
    with torch.no_grad():
        soft = model(ids, output_attentions=True).attentions
    torch.testing.assert_close(soft[0], reference[0], rtol=1e-5, atol=1e-6)  # layer 0 untouched
    for head in (0, 1, 3):
        torch.testing.assert_close(soft[1][:, head], reference[1][:, head], rtol=1e-5, atol=1e-6)
    # head (1, 2): softmax of its logits / 4, i.e. its weights ∝ w^(1/4) row by row
    expected = reference[1][:, 2] ** 0.25
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(soft[1][:, 2], expected, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(soft[1][:, 2], reference[1][:, 2])
