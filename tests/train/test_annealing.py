"""NAnnealing, the one n schedule under fine-tuning's --anneal-n (linear) and the recipe's transfer
(geometric): n along its path from the scorer's start value, and b by each rule, against the
formulas written out here."""

from __future__ import annotations

import pytest

from ssacli.scorers import make_scorer
from ssacli.train.annealing import NAnnealing


def ssa(options: str = ""):
    return make_scorer("ssa:init=paper" + (f",{options}" if options else ""), num_heads=2)


def n_b(scorer) -> tuple[float, float]:
    return float(scorer.n.detach()[0]), float(scorer.b.detach()[0])


@pytest.mark.parametrize("progress", [0.0, 0.25, 0.5, 1.0, 1.5])
def test_linear_moves_n_on_a_line_and_ties_b(progress):
    scorer = ssa()
    n0, _ = n_b(scorer)
    NAnnealing([scorer], 4.0, schedule="linear", b="tied").apply(progress)
    n, b = n_b(scorer)
    expected = n0 + (4.0 - n0) * min(progress, 1.0)
    assert n == pytest.approx(expected, rel=1e-6)
    assert b == pytest.approx(1 / expected, rel=1e-6)


@pytest.mark.parametrize("progress", [0.0, 0.5, 1.0, 2.0])
def test_geometric_moves_n_by_the_same_ratio_each_step(progress):
    scorer = ssa()
    n0, _ = n_b(scorer)
    NAnnealing([scorer], 24.0, schedule="geometric", b="tied").apply(progress)
    assert n_b(scorer)[0] == pytest.approx(n0 * (24.0 / n0) ** min(progress, 1.0), rel=1e-6)


def test_rescaled_b_keeps_b_times_n():
    scorer = ssa()
    n0, b0 = n_b(scorer)
    anneal = NAnnealing([scorer], 24.0, schedule="geometric", b="rescaled")
    for progress in (0.3, 0.7, 1.0):
        anneal.apply(progress)
        n, b = n_b(scorer)
        assert n * b == pytest.approx(n0 * b0, rel=1e-5)


def test_unless_learned_leaves_a_learned_b_to_the_optimizer():
    learned, tied = ssa("learn=b"), ssa("learn=n")
    b_learned = n_b(learned)[1]
    NAnnealing([learned, tied], 4.0, schedule="linear", b="unless learned").apply(1.0)
    assert n_b(learned) == pytest.approx((4.0, b_learned), rel=1e-6)
    assert n_b(tied) == pytest.approx((4.0, 0.25), rel=1e-6)


def test_freeze_stops_n_from_learning():
    scorer = ssa("learn=n")
    NAnnealing([scorer], 4.0, schedule="linear", b="tied").freeze()
    assert not scorer.n_raw.requires_grad


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="schedule"):
        NAnnealing([ssa()], 4.0, schedule="cosine", b="tied")
    with pytest.raises(ValueError, match="b rule"):
        NAnnealing([ssa()], 4.0, schedule="linear", b="learned")
