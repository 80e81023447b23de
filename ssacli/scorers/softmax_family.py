"""Scorers that are a softmax of a transformed logit: softmax, temperature, SSA, SSMax, sinks.

Each is ``softmax(t(x))`` over visible keys (masked logits -> -inf -> weight exactly 0), except the
sink scorers, whose denominator holds one extra, keyless term.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..kernels.fused import softmax_attention, ssa_attention
from ..kernels.ssa_transform import ssa_transform
from .base import (
    AttentionInputs,
    Scorer,
    masked_softmax,
    positive,
    positive_raw,
    visible_count,
    visible_max,
)
from .registration import register_scorer
from .specs import FAITHFUL_M, ssa_start  # noqa: F401 (FAITHFUL_M: m=auto's placeholder, below)


@register_scorer
class Softmax(Scorer, declared="softmax"):
    def transformed_logits(self, x, count):
        return x

    def score(self, x: torch.Tensor, visible: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        return masked_softmax(self.transformed_logits(x, None), visible)

    def fused(self, query, key, value, *, scale, causal, mask, dropout, backend="auto"):
        return softmax_attention(query, key, value, scale=scale, causal=causal, mask=mask, dropout=dropout)


@register_scorer
class Temperature(Scorer, declared="temperature"):
    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)  # t > 0: the declaration's rule
        self._add_param("t", math.log(self.opts["t"]))  # log-temperature: any real value is valid

    @property
    def t(self) -> torch.Tensor:
        return self.t_raw.exp()

    def transformed_logits(self, x, count):
        return x * self.per_head(torch.exp(-self.t_raw), x)

    def score(self, x, visible, inputs):
        return masked_softmax(self.transformed_logits(x, None), visible)

    def fused(self, query, key, value, *, scale, causal, mask, dropout, backend="auto"):
        # softmax(x / t): 1/t folded into the query, per head.
        inverse_t = torch.exp(-self.t_raw).to(query.dtype).reshape(1, -1, 1, 1)
        return softmax_attention(
            query * inverse_t, key, value, scale=scale, causal=causal, mask=mask, dropout=dropout
        )


@register_scorer
class SSA(Scorer, declared="ssa"):
    """Scaled Signed Averaging: w ∝ (1 + b|x|)^(sgn(x)·n), computed as softmax(n·sgn(x)·log1p(b|x|)).

    The log-domain form never forms the power, so it cannot overflow in fp16/bf16. b and n are
    positive through ``softplus(raw) + eps``.
    """

    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)
        init, b, n = ssa_start(self.given)  # b and n from init= (or preset=), m=, b=, n=
        self.opts["init"] = init
        if init == "authors":  # one n per layer, learned; b fixed (unless the spec says otherwise)
            self.opts["share"] = self.given.get("share", "layer")
            self.opts["learn"] = self.given.get("learn", "n")
            self.learn = self._learn_set()
        self._add_param("b", positive_raw(b, self.name, "b"))
        self._add_param("n", positive_raw(n, self.name, "n"))

    @property
    def needs_calibration(self) -> bool:
        """``init=faithful`` with m=auto (its default) and no explicit b or n: m is chosen per layer
        from the model's attention rows (ssacli.convert, ssacli.apply_scorer with inputs); FAITHFUL_M
        is only the placeholder of a scorer built alone."""
        return (
            self.opts["init"] == "faithful"
            and self.given.get("m", "auto") == "auto"
            and not ({"b", "n"} & set(self.given))
        )

    def applied_options(self) -> dict[str, Any]:
        """init says where b and n start: "given (b, n)" when the spec sets both (init=authors still
        sets share and learn), and which one it still supplies when the spec sets one; preset (init's
        other name) is folded into init, and m is shown only where it applies (init=faithful, b and n
        not both given)."""
        shown = {k: v for k, v in self.opts.items() if k != "preset"}
        init = shown["init"]
        given = [k for k in ("b", "n") if self.opts[k] is not None]
        if len(given) == 2:
            authors = "; share and learn from init=authors" if init == "authors" else ""
            shown["init"] = f"given (b, n){authors}"
        elif given:
            other = "n" if given == ["b"] else "b"
            shown["init"] = f"{init} ({other}; {given[0]} given)"
        for key in ("b", "n"):
            if shown[key] is None:
                shown[key] = f"from init={init}"
        if init != "faithful" or len(given) == 2:
            shown.pop("m")
        return shown

    @property
    def b(self) -> torch.Tensor:
        return positive(self.b_raw)

    @property
    def n(self) -> torch.Tensor:
        return positive(self.n_raw)

    def transformed_logits(self, x, count):
        return ssa_transform(x, self.per_head(self.n, x), self.per_head(self.b, x))

    def score(self, x, visible, inputs):
        return masked_softmax(self.transformed_logits(x, None), visible)

    def fused(self, query, key, value, *, scale, causal, mask, dropout, backend="auto"):
        return ssa_attention(
            query,
            key,
            value,
            self.b,
            self.n,
            scale=scale,
            causal=causal,
            mask=mask,
            dropout=dropout,
            backend=backend,
        )


@register_scorer
class SSMax(Scorer, declared="ssmax"):
    """Scalable-Softmax (Nakanishi 2025): softmax(s·log(N_i)·x), N_i the keys row i can see."""

    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)
        self._add_param("s", self.opts["s"])

    def transformed_logits(self, x, count):
        # Rows with no visible key have N = 0; they are zeroed by the caller, so log(max(N, 1)).
        log_n = count.to(x.dtype).clamp_min(1.0).log()
        return self.per_head(self.s_raw, x) * log_n * x

    def score(self, x, visible, inputs):
        return masked_softmax(self.transformed_logits(x, visible_count(visible, x.dtype)), visible)


@register_scorer
class Sink(Scorer, declared="sink"):
    """Softmax with a sink: exp(x_j) / (exp(s) + Σ_k exp(x_k)); the sink takes the remaining mass."""

    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)
        self._add_param("s", self.opts.get("s", 0.0))

    def transformed_logits(self, x, count):
        return x

    def keyless_logit(self, x):
        return self.per_head(self.s_raw, x)  # broadcasts against the [..., q, 1] row statistics

    def score(self, x, visible, inputs):
        s = self.keyless_logit(x)
        m = torch.maximum(visible_max(x, visible), s)  # stabilizer covering the sink term too
        e = torch.exp(torch.where(visible, x - m, float("-inf")))
        return e / (torch.exp(s - m) + e.sum(dim=-1, keepdim=True))


@register_scorer
class Softmax1(Sink, declared="softmax1"):
    """Off-by-one softmax (Miller 2023): a sink with fixed logit 0."""
