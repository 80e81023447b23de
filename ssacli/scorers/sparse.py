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

from .base import Scorer, visible_max
from .registration import register_scorer


def _park_masked(x: torch.Tensor, visible: torch.Tensor, gap: torch.Tensor | float) -> torch.Tensor:
    """Put masked logits ``gap + 1`` below the visible row max: outside the support of α-entmax."""
    return torch.where(visible, x, visible_max(x, visible) - gap - 1.0)


@register_scorer
class Sparsemax(Scorer, declared="sparsemax"):
    def score(self, x, visible, inputs):
        return sparsemax(_park_masked(x, visible, 1.0), dim=-1)


@register_scorer
class Entmax15(Scorer, declared="entmax15"):
    def score(self, x, visible, inputs):
        return entmax15(_park_masked(x, visible, 2.0), dim=-1)


@register_scorer
class Entmax(Scorer, declared="entmax"):
    """α-entmax by bisection, α = 1 + sigmoid(a) ∈ (1, 2) per head (α → 1 is softmax, 2 sparsemax)."""

    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)  # 1 < alpha < 2, n_iter >= 1: the declaration's rules
        alpha = self.opts["alpha"]
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
