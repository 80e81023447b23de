"""The SSA scorers' n and b through the conversion recipe (:mod:`ssacli.train.recipe`): which scorers
are SSA's, n annealed geometrically from each layer's faithful m to the target with b tied to 1/n or
rescaled with it (:class:`NAnnealing`), and which of n and b a stage trains (:func:`train_n_and_b`).
A softmax control has no SSA scorer, so each of these then does nothing."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.interface import scorers_of
from ..scorers.base import positive_raw


def ssa_scorers(root: nn.Module) -> list[nn.Module]:
    """SSA's scorers under ``root`` (a bundled folder's Softmax scorer is not one)."""
    return [s for s in scorers_of(root).values() if s.name == "ssa"]


class NAnnealing:
    """n = n0·(target/n0)^progress per layer, from the n each scorer had when this was made (n0:
    geometric, so each step moves n by the same ratio); b = 1/n (``b="tied"``) or b·(n_old/n_new)
    (``"learned"``: the product b·n is kept and the gradient corrects b)."""

    def __init__(self, scorers: list[nn.Module], target_n: float | None, b: str) -> None:
        self.scorers, self.target, self.b = scorers, target_n, b
        self.n0 = [s.n.detach().double().cpu() for s in scorers]

    @torch.no_grad()
    def apply(self, progress: float) -> None:
        target = self.target
        for scorer, n0 in zip(self.scorers, self.n0):
            n_old = scorer.n.detach().double().cpu()
            n = n0 * (target / n0) ** min(progress, 1.0) if progress < 1 else torch.full_like(n0, target)
            scorer.n_raw.copy_(raw_values(n))
            if self.b == "tied":
                scorer.b_raw.copy_(raw_values(1.0 / n))
            else:
                b = scorer.b.detach().double().cpu() * n_old / n
                scorer.b_raw.copy_(raw_values(b))


def train_n_and_b(scorers: list[nn.Module], *, learn_n: bool, learn_b: bool) -> list[nn.Parameter]:
    """Set which of the scorers' n and b take gradients; return those that do (n untrained is the
    schedule's)."""
    for scorer in scorers:
        scorer.n_raw.requires_grad_(learn_n)
        scorer.b_raw.requires_grad_(learn_b)
    return [p for s in scorers for p in (s.b_raw, s.n_raw) if p.requires_grad]


def raw_values(values: torch.Tensor) -> torch.Tensor:
    """The raw parameter values that give the positive ``values`` (n or b)."""
    return torch.tensor([positive_raw(float(v), "ssa", "n or b") for v in values], dtype=torch.float32)


__all__ = ["NAnnealing", "raw_values", "ssa_scorers", "train_n_and_b"]
