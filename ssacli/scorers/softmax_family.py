"""Scorers that are a softmax of a transformed logit: softmax, temperature, SSA, SSMax, sinks.

Each is ``softmax(t(x))`` over visible keys (masked logits -> -inf -> weight exactly 0), except the
sink scorers, whose denominator holds one extra, keyless term.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import SpecError
from ..kernels.fused import softmax_attention, ssa_attention
from .base import (
    POSITIVE_EPS,
    SHARE,
    AttentionInputs,
    Option,
    Scorer,
    Traits,
    learn_option,
    masked_softmax,
    positive,
    positive_raw,
    visible_count,
    visible_max,
)
from .registry import register_scorer

# SSA with b = 1/m, n = m tends to softmax as m grows. 128 is the smallest power of two whose mean
# KL(softmax || ssa) on N(0, 1) logits over 64 keys is below 1e-4 (measured 3.8e-5; m = 64 gives
# 1.5e-4). tests/scorers/test_scorers.py measures it again.
FAITHFUL_M = 128.0
PAPER_B, PAPER_N = 0.8, 1.5
# The authors' production kernel (omyokun/SSA, Nemotron3-114M/train/SSA): one n per layer, trainable,
# init 1.5; b fixed at 0.8 (../shared/notes/paper.md).
AUTHORS_B, AUTHORS_N = 0.8, 1.5
SSA_PRESETS = ("paper", "faithful", "authors")


def faithful_m(raw: str) -> float | str:
    """``m=auto`` (chosen per layer from the model's own logits by ``ssacli convert``) or a number."""
    return "auto" if raw == "auto" else float(raw)


@register_scorer
class Softmax(Scorer):
    name = "softmax"
    summary = "exp(x) / sum exp(x): the reference"
    traits = Traits("yes", "yes", "one-hot", "yes")

    def transformed_logits(self, x, count):
        return x

    def score(self, x: torch.Tensor, visible: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        return masked_softmax(self.transformed_logits(x, None), visible)

    def fused(self, query, key, value, *, scale, causal, mask, dropout):
        return softmax_attention(query, key, value, scale=scale, causal=causal, mask=mask, dropout=dropout)


@register_scorer
class Temperature(Scorer):
    name = "temperature"
    summary = "softmax(x / t), t = exp(theta) learned per head"
    traits = Traits("yes", "yes", "one-hot", "yes")
    trainable = ("t",)
    options = {
        "t": Option(1.0, float, "initial temperature (> 0); weights = softmax(x / t)"),
        "learn": learn_option("t", ("t",)),
        "share": SHARE,
    }

    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)
        if not self.opts["t"] > 0:
            raise SpecError(f"scorer 'temperature': t must be > 0, got {self.opts['t']:g}")
        self._add_param("t", math.log(self.opts["t"]))  # log-temperature: any real value is valid

    @property
    def t(self) -> torch.Tensor:
        return self.t_raw.exp()

    def transformed_logits(self, x, count):
        return x * self.per_head(torch.exp(-self.t_raw), x)

    def score(self, x, visible, inputs):
        return masked_softmax(self.transformed_logits(x, None), visible)

    def fused(self, query, key, value, *, scale, causal, mask, dropout):
        # softmax(x / t): 1/t folded into the query, per head.
        inverse_t = torch.exp(-self.t_raw).to(query.dtype).reshape(1, -1, 1, 1)
        return softmax_attention(
            query * inverse_t, key, value, scale=scale, causal=causal, mask=mask, dropout=dropout
        )


@register_scorer
class SSA(Scorer):
    """Scaled Signed Averaging: w ∝ (1 + b|x|)^(sgn(x)·n), computed as softmax(n·sgn(x)·log1p(b|x|)).

    The log-domain form never forms the power, so it cannot overflow in fp16/bf16. b and n are
    positive through ``softplus(raw) + eps``.
    """

    name = "ssa"
    summary = "softmax(n·sgn(x)·log1p(b|x|)) = (1+b|x|)^(sgn(x)·n), normalized"
    traits = Traits("yes", "no", "x₊ⁿ/Σx₊ⁿ", "yes")
    trainable = ("b", "n")
    options = {
        "init": Option(
            "paper",
            SSA_PRESETS,
            "paper: b=0.8, n=1.5; faithful: b=1/m, n=m (≈ softmax); authors: the authors' kernel, "
            "b=0.8 fixed, n=1.5 one per layer, learned",
        ),
        "preset": Option(None, SSA_PRESETS, "the same as init= (one of the two)"),
        "m": Option(
            "auto",
            faithful_m,
            "init=faithful only: auto (convert picks per layer the smallest power of 2 meeting "
            f"--max-error; {FAITHFUL_M:g} for a scorer built alone, never attached uncalibrated) "
            "or a number; larger m is closer to softmax",
        ),
        "b": Option(None, float, "initial b (> 0); overrides the preset"),
        "n": Option(None, float, "initial n (> 0); overrides the preset"),
        "learn": learn_option("all", ("b", "n")),
        "share": SHARE,
    }

    def __init__(self, num_heads: int = 1, **options) -> None:
        super().__init__(num_heads, **options)
        if "preset" in self.given and "init" in self.given:
            raise SpecError("scorer 'ssa': preset= and init= are the same option; give one")
        init = self.opts["preset"] or self.opts["init"]
        self.opts["init"] = init
        m = self.opts["m"]
        if "m" in self.given and init != "faithful":
            raise SpecError("scorer 'ssa': m only applies to init=faithful (e.g. ssa:init=faithful,m=256)")
        if init == "authors":  # one n per layer, learned; b fixed (unless the spec says otherwise)
            self.opts["share"] = self.given.get("share", "layer")
            self.opts["learn"] = self.given.get("learn", "n")
            self.learn = self._learn_set()
        if init == "faithful":
            m = FAITHFUL_M if m == "auto" else m
            if not 0 < m < 1 / POSITIVE_EPS:
                raise SpecError(f"scorer 'ssa': m must be in (0, {1 / POSITIVE_EPS:g}), got {m:g}")
            b, n = 1.0 / m, m
        elif init == "authors":
            b, n = AUTHORS_B, AUTHORS_N
        else:
            b, n = PAPER_B, PAPER_N
        b = self.opts["b"] if self.opts["b"] is not None else b
        n = self.opts["n"] if self.opts["n"] is not None else n
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
        b, n = self.per_head(self.b, x), self.per_head(self.n, x)
        # sgn(x)·log1p(b|x|) written branch-wise: torch.sign has zero gradient at 0, but the
        # transform is smooth there with slope b.
        return n * torch.where(x >= 0, torch.log1p(b * x.clamp_min(0)), -torch.log1p(-b * x.clamp_max(0)))

    def score(self, x, visible, inputs):
        return masked_softmax(self.transformed_logits(x, None), visible)

    def fused(self, query, key, value, *, scale, causal, mask, dropout):
        return ssa_attention(
            query, key, value, self.b, self.n, scale=scale, causal=causal, mask=mask, dropout=dropout
        )


@register_scorer
class SSMax(Scorer):
    """Scalable-Softmax (Nakanishi 2025): softmax(s·log(N_i)·x), N_i the keys row i can see."""

    name = "ssmax"
    summary = "softmax(s·log(N_i)·x), N_i = visible keys of the row"
    traits = Traits("yes", "yes", "one-hot", "yes")
    trainable = ("s",)
    options = {
        "s": Option(1.0, float, "initial scale s"),
        "learn": learn_option("s", ("s",)),
        "share": SHARE,
    }

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
class Sink(Scorer):
    """Softmax with a sink: exp(x_j) / (exp(s) + Σ_k exp(x_k)); the sink takes the remaining mass."""

    name = "sink"
    summary = "exp(x) / (exp(s) + Σ exp(x)), learned sink logit s per head"
    traits = Traits("< 1", "no", "one-hot", "yes")
    trainable = ("s",)
    options = {
        "s": Option(0.0, float, "initial sink logit"),
        "learn": learn_option("s", ("s",)),
        "share": SHARE,
    }

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
class Softmax1(Sink):
    """Off-by-one softmax (Miller 2023): a sink with fixed logit 0."""

    name = "softmax1"
    summary = "exp(x) / (1 + Σ exp(x)): off-by-one softmax"
    trainable = ()
    options = {}
