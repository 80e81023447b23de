"""Sparse scorers from the ``entmax`` package: sparsemax, 1.5-entmax and α-entmax (bisection).

The entmax functions know nothing of masks, and -inf inputs break their threshold search. A masked
key is instead given the logit ``rowmax - gap`` with ``gap`` large enough that α-entmax provably
assigns it exactly 0: α-entmax zeroes every x with ``x < max - 1/(α-1)``. The masked value does not
depend on what was there, so masked content cannot leak, and the threshold is the one of the visible
keys alone.
"""

from __future__ import annotations

import math

import torch
from entmax import entmax15, entmax_bisect, sparsemax

from ..errors import SpecError
from .base import SHARE, Option, Scorer, Traits, learn_option, visible_max
from .registry import register_scorer


def _park_masked(x: torch.Tensor, visible: torch.Tensor, gap: torch.Tensor | float) -> torch.Tensor:
    """Put masked logits ``gap + 1`` below the visible row max: outside the support of α-entmax."""
    return torch.where(visible, x, visible_max(x, visible) - gap - 1.0)


@register_scorer
class Sparsemax(Scorer):
    name = "sparsemax"
    summary = "Euclidean projection on the simplex: [x - τ]₊ (entmax package)"
    traits = Traits("yes", "yes", "one-hot", "no")

    def score(self, x, visible, inputs):
        return sparsemax(_park_masked(x, visible, 1.0), dim=-1)


@register_scorer
class Entmax15(Scorer):
    name = "entmax15"
    summary = "1.5-entmax: [x/2 - τ]₊² (entmax package, exact sort)"
    traits = Traits("yes", "yes", "one-hot", "no")

    def score(self, x, visible, inputs):
        return entmax15(_park_masked(x, visible, 2.0), dim=-1)


@register_scorer
class Entmax(Scorer):
    """α-entmax by bisection, α = 1 + sigmoid(a) ∈ (1, 2) per head (α → 1 is softmax, 2 sparsemax)."""

    name = "entmax"
    summary = "α-entmax by bisection, α ∈ (1, 2) learned per head (entmax package)"
    traits = Traits("yes", "yes", "one-hot", "no")
    trainable = ("alpha",)
    options = {
        "alpha": Option(1.5, float, "initial α, strictly between 1 and 2"),
        "learn": learn_option("alpha", ("alpha",)),
        "share": SHARE,
        "n_iter": Option(50, int, "bisection iterations"),
    }

    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)
        alpha = self.opts["alpha"]
        if not 1.0 < alpha < 2.0:
            raise SpecError(
                f"scorer 'entmax': alpha must be strictly between 1 and 2, got {alpha:g} "
                "(alpha=1 is softmax, alpha=2 is sparsemax: use those scorers)"
            )
        if self.opts["n_iter"] < 1:
            raise SpecError(f"scorer 'entmax': n_iter must be >= 1, got {self.opts['n_iter']}")
        u = alpha - 1.0
        self._add_param("alpha", math.log(u / (1.0 - u)))  # logit of α - 1

    @property
    def alpha(self) -> torch.Tensor:
        return 1.0 + torch.sigmoid(self.alpha_raw)

    def score(self, x, visible, inputs):
        alpha = self.per_head(self.alpha, x)
        alpha = alpha.expand(*x.shape[:-1], 1)  # entmax_bisect wants one α per row
        parked = _park_masked(x, visible, 1.0 / (alpha - 1.0))
        return entmax_bisect(parked, alpha, dim=-1, n_iter=self.opts["n_iter"])
