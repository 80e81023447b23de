"""Scorers whose rows need not sum to one: sigmoid, softpick, SA-softmax, ReLU/N.

For these, downstream metrics report the row mass Σ_j w_ij on its own and compute entropy and
max-weight on the renormalized row (docs/scorers.md).
"""

from __future__ import annotations

import torch

from .base import (
    Scorer,
    masked_softmax,
    visible_count,
    visible_max,
    visible_min,
)
from .registration import register_scorer


@register_scorer
class Sigmoid(Scorer, declared="sigmoid"):
    """Sigmoid attention (Ramapuram et al. 2024): σ(x + bias), bias = -log N_i by default."""

    def score(self, x, visible, inputs):
        if self.opts["bias"] is not None:
            return torch.sigmoid(x + self.opts["bias"])
        log_n = visible_count(visible, x.dtype).clamp_min(1.0).log()
        return torch.sigmoid(x - log_n)


@register_scorer
class Softpick(Scorer, declared="softpick"):
    """Softpick (Zuhri et al. 2025): relu(eˣ − 1) / Σ_visible |eˣ − 1|.

    Stabilized by m = max(0, row max): both terms are multiplied by e^(−m), so nothing overflows.
    Masked keys are left out of the denominator. A row whose terms are all 0 gets 0 weights.
    """

    def score(self, x, visible, inputs):
        m = visible_max(x, visible).clamp_min(0.0)
        shifted = torch.exp(x - m) - torch.exp(-m)  # (eˣ − 1)·e^(−m)
        den = torch.where(visible, shifted.abs(), 0.0).sum(dim=-1, keepdim=True)
        safe = torch.where(den > 0, den, torch.ones_like(den))
        return torch.where(den > 0, torch.relu(shifted) / safe, 0.0)


@register_scorer
class SASoftmax(Scorer, declared="sa-softmax"):
    """Self-adjusting softmax (Zheng et al. 2025): x·softmax(x), or with x rescaled to [0, 1].

    ``norm=true`` (default) uses (x − min)/(max − min) over the visible keys of the row, which keeps
    weights in [0, 1] with row mass ≤ 1; a row whose visible logits are all equal has no spread to
    rescale and gets the plain softmax.
    """

    def score(self, x, visible, inputs):
        p = masked_softmax(x, visible)
        if not self.opts["norm"]:
            return x * p
        lo, hi = visible_min(x, visible), visible_max(x, visible)
        spread = hi - lo
        scale = torch.where(spread > 0, (x - lo) / torch.where(spread > 0, spread, 1.0), 1.0)
        return scale * p


@register_scorer
class ReluNorm(Scorer, declared="relu-norm"):
    """ReLU attention normalized by sequence length (Wortsman et al. 2023): relu(x)^p / N_i (p = 1 or
    2: the declaration's rule)."""

    def score(self, x, visible, inputs):
        n = visible_count(visible, x.dtype).clamp_min(1.0)
        return torch.relu(x).pow(self.opts["power"]) / n
