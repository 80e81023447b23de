"""SSA's n set by a schedule rather than learned, and b with it: :class:`NAnnealing`, under both the
fine-tuning run's ``--anneal-n`` (linear in the step) and the conversion recipe's attention transfer
(geometric, from each layer's faithful m to the target)."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.interface import scorers_of
from ..errors import UsageError
from ..scorers.base import positive_raw

SCHEDULES = ("linear", "geometric")
# What b does as n moves: "tied", b = 1/n (the init=faithful relation); "rescaled", b·n is kept
# (b·n_old/n_new) and the gradient corrects b; "unless learned", tied where the scorer does not
# learn b, left to the optimizer where it does.
B_RULES = ("tied", "rescaled", "unless learned")


class NAnnealing:
    """n from each scorer's value when this was made (n0) to ``target`` as ``progress`` goes from 0
    to 1, exactly the target from 1 on: linearly (``schedule="linear"``) or geometrically
    (``"geometric"``: n0·(target/n0)^progress, each step moving n by the same ratio); then b by the
    ``b`` rule (:data:`B_RULES`)."""

    def __init__(self, scorers: list[nn.Module], target: float | None, *, schedule: str, b: str) -> None:
        if schedule not in SCHEDULES or b not in B_RULES:
            raise ValueError(f"schedule {schedule!r} or b rule {b!r} unknown")
        self.scorers, self.target, self.schedule, self.b = scorers, target, schedule, b
        self.n0 = [s.n.detach().double().cpu() for s in scorers]  # a fine-tuning checkpoint keeps them

    def freeze(self) -> None:
        """n is set every step, never learned while annealing."""
        for scorer in self.scorers:
            scorer.n_raw.requires_grad_(False)

    def n_at(self, n0: torch.Tensor, progress: float) -> torch.Tensor:
        if self.schedule == "linear":
            return torch.lerp(n0, torch.full_like(n0, self.target), min(progress, 1.0))  # exact at 1
        return n0 * (self.target / n0) ** progress if progress < 1 else torch.full_like(n0, self.target)

    @torch.no_grad()
    def apply(self, progress: float) -> None:
        for scorer, n0 in zip(self.scorers, self.n0):
            n_old = scorer.n.detach().double().cpu()
            n = self.n_at(n0, progress)
            scorer.n_raw.copy_(raw_values(n))
            if self.b == "tied" or (self.b == "unless learned" and "b" not in scorer.learn):
                scorer.b_raw.copy_(raw_values(1.0 / n))
            elif self.b == "rescaled":
                scorer.b_raw.copy_(raw_values(scorer.b.detach().double().cpu() * n_old / n))


def anneal_n(root: nn.Module, target: float) -> NAnnealing:
    """Fine-tuning's ``--anneal-n``: n linear in the step, b = 1/n unless the scorer learns b; every
    scorer under ``root`` must be SSA's."""
    scorers = list(scorers_of(root).values())
    if not scorers or any(s.name != "ssa" for s in scorers):
        names = sorted({s.name for s in scorers}) or ["none"]
        raise UsageError(f"--anneal-n applies to SSA scorers only; this model's scorer is {', '.join(names)}")
    return NAnnealing(scorers, float(target), schedule="linear", b="unless learned")


def raw_values(values: torch.Tensor) -> torch.Tensor:
    """The raw parameter values that SSA's positive parametrization maps to ``values`` (n or b)."""
    return torch.tensor([positive_raw(float(v), "ssa", "n or b") for v in values], dtype=torch.float32)


__all__ = ["B_RULES", "SCHEDULES", "NAnnealing", "anneal_n", "raw_values"]
