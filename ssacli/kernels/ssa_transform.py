"""SSA's transform of a logit in PyTorch, written once for every torch path: the eager scorer
(ssacli.scorers.softmax_family.SSA), the blocked kernel's torch block math (ssacli.kernels.blocked)
and flex_attention's ``score_mod`` (ssacli.kernels.fused). The C kernels have theirs in native_math.h,
the Triton kernels in triton_kernels.py (base 2); the tests hold each against this one.

t = n·sgn(x)·log1p(b|x|), the log of SSA's weight (1 + b|x|)^(sgn(x)·n) up to the softmax's
normalization; the kernels fold b into the query (y = b·x) and transform y with b omitted.
"""

from __future__ import annotations

import torch


def ssa_transform(x: torch.Tensor, n, b=None) -> torch.Tensor:
    """t = n·sgn(x)·log1p(b|x|) (``b`` None: 1), ``n`` and ``b`` broadcast against x (scalars or per
    head). One log1p, of b|x|, with each sign's branch formed apart: its gradient has slope b·n at
    x = 0, where torch.sign's zero gradient would stop it, and b's gradient is the sum of the two
    branches' (the eager scorer's learned b, as it always was). Hidden keys (x = −inf) give −inf."""
    nonnegative = x >= 0
    above, below = x.clamp_min(0), -x.clamp_max(0)
    if b is not None:
        above, below = b * above, b * below
    magnitude = torch.log1p(torch.where(nonnegative, above, below))
    return n * torch.where(nonnegative, magnitude, -magnitude)


__all__ = ["ssa_transform"]
