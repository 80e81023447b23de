"""The SSA scorers' n and b through the conversion recipe (:mod:`ssacli.train.recipe`): which scorers
are SSA's (:func:`ssa_scorers`; their n is annealed by :class:`ssacli.train.annealing.NAnnealing`)
and which of n and b a stage trains (:func:`train_n_and_b`). A softmax control has no SSA scorer,
so each of these then does nothing."""

from __future__ import annotations

from torch import nn

from ..attention.interface import scorers_of


def ssa_scorers(root: nn.Module) -> list[nn.Module]:
    """SSA's scorers under ``root`` (a bundled folder's Softmax scorer is not one)."""
    return [s for s in scorers_of(root).values() if s.name == "ssa"]


def train_n_and_b(scorers: list[nn.Module], *, learn_n: bool, learn_b: bool) -> list[nn.Parameter]:
    """Set which of the scorers' n and b take gradients; return those that do (n untrained is the
    schedule's)."""
    for scorer in scorers:
        scorer.n_raw.requires_grad_(learn_n)
        scorer.b_raw.requires_grad_(learn_b)
    return [p for s in scorers for p in (s.b_raw, s.n_raw) if p.requires_grad]


__all__ = ["ssa_scorers", "train_n_and_b"]
