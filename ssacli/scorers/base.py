"""The scorer contract, its options, and the masking helpers every scorer shares.

A scorer maps scaled attention logits ``x[..., q, k]`` (plus a boolean ``mask`` that is True where a
query may see a key) to attention weights of the same shape. The base class enforces the contract so
that no scorer can get it wrong on its own:

* math runs in at least fp32 and the result is cast back to the input dtype;
* the content of masked logits can never leak in (they are overwritten before any math, so NaN or
  ``finfo.min`` fills are harmless);
* masked keys get exactly 0 weight and fully masked rows (left padding, padded queries) are all zeros.

Subclasses implement :meth:`Scorer.score` on clean inputs; what they declare (options, traits) is in
:mod:`ssacli.scorers.specs`, torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import SpecError
from .declaration import POSITIVE_EPS, Declaration, Option, Traits, check_positive, learn_set  # noqa: F401
from .specs import DECLARATIONS


@dataclass
class AttentionInputs:
    """What a scorer that works on q and k instead of logits (cosFormer) may look at."""

    query: torch.Tensor | None = None  # [b, h, q, d]
    key: torch.Tensor | None = None  # [b, h, k, d], already repeated for GQA
    query_positions: torch.Tensor | None = None  # [q] or [b, q] token positions
    key_positions: torch.Tensor | None = None  # [k] or [b, k]


class Scorer(nn.Module):
    """Base class of every scorer. Instances are modules so trainable parameters travel with a model.

    A built-in scorer takes its declaration (name, summary, traits, options, trainable, uses_qk) from
    the table in :mod:`ssacli.scorers.specs`: ``class SSA(Scorer, declared="ssa")`` sets the class
    attributes below from it. A scorer outside the table declares them as class attributes."""

    name: ClassVar[str]
    summary: ClassVar[str]
    traits: ClassVar[Traits]
    options: ClassVar[dict[str, Option]] = {}
    trainable: ClassVar[tuple[str, ...]] = ()  # names of the parameters `learn=` may select
    uses_qk: ClassVar[bool] = False
    declared: ClassVar[Declaration | None] = None  # the table's entry this class takes, if any

    def __init_subclass__(cls, declared: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.declared = None if declared is None else DECLARATIONS[declared]
        if cls.declared is not None:
            d = cls.declared
            cls.name, cls.summary, cls.traits = d.name, d.summary, d.traits
            cls.options, cls.trainable, cls.uses_qk = d.options, d.trainable, d.uses_qk

    @classmethod
    def declaration(cls) -> Declaration:
        """What this class declares: its entry in the table, or its class attributes."""
        return cls.declared or Declaration.of(cls)

    def __init__(self, num_heads: int = 1, **options: Any) -> None:
        super().__init__()
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise SpecError(
                f"scorer '{self.name}' has no option {', '.join(unknown)}; "
                f"valid keys: {', '.join(self.options) or '(none)'}"
            )
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        self.declaration().check(options)  # the rules parse_spec applies, for keyword arguments too
        self.num_heads = num_heads
        self.given = dict(options)  # what the user set; the spec string round-trips this
        self.opts = {k: options.get(k, opt.default) for k, opt in self.options.items()}
        self.learn = self._learn_set()

    @property
    def needs_calibration(self) -> bool:
        """Whether this scorer's start is to be measured on a model's own logits before it is used
        (SSA's ``init=faithful`` with ``m=auto``): a scorer alone takes a placeholder start, and
        :func:`ssacli.attention.interface.apply_scorer` refuses to attach it uncalibrated."""
        return False

    # -- spec round-trip ------------------------------------------------------------------------
    @property
    def spec(self) -> str:
        """Canonical spec string that rebuilds this scorer (without trained values)."""
        if not self.given:
            return self.name
        items = ",".join(f"{k}={_format_value(v)}" for k, v in self.given.items())
        return f"{self.name}:{items}"

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}, num_heads={self.num_heads}"

    def applied_options(self) -> dict[str, Any]:
        """The options as they act on this scorer (what ``ssacli scorers SPEC`` shows): all of them,
        unless a scorer knows that some are overridden or do not apply."""
        return dict(self.opts)

    def _learn_set(self) -> frozenset[str]:
        if "learn" not in self.options:
            return frozenset()
        return learn_set(self.declaration(), self.opts["learn"])

    # -- parameters -----------------------------------------------------------------------------
    def _param_count(self) -> int:
        share = self.opts.get("share", "head")
        return 1 if share == "layer" else self.num_heads

    def _add_param(self, public: str, raw_value: float) -> None:
        """Register ``<public>_raw``, an [H] (or [1] with share=layer) parameter, frozen unless learned.

        Frozen parameters stay parameters (not buffers) so every checkpoint has the same keys.
        """
        data = torch.full((self._param_count(),), float(raw_value), dtype=torch.float32)
        self.register_parameter(f"{public}_raw", nn.Parameter(data, requires_grad=public in self.learn))

    def parameter_values(self) -> dict[str, torch.Tensor]:
        """Current value of each trainable parameter, in its natural units (b, n, t, α, s)."""
        values = {}
        for public in self.trainable:
            natural = isinstance(getattr(type(self), public, None), property)
            values[public] = getattr(self, public) if natural else getattr(self, f"{public}_raw")
        return {k: v.detach() for k, v in values.items()}

    def per_head(self, value: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Reshape an [H] or [1] parameter so it broadcasts over ``x[..., h, q, k]``."""
        value = value.to(x.dtype)
        if value.numel() == 1:
            return value.reshape(())
        if x.dim() < 3 or x.shape[-3] != value.numel():
            raise ValueError(
                f"scorer '{self.name}' holds {value.numel()} per-head parameters but the logits "
                f"have shape {tuple(x.shape)} (heads on dim -3)"
            )
        return value.reshape(-1, 1, 1)

    # -- the contract -----------------------------------------------------------------------------
    def forward(
        self,
        scores: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        query: torch.Tensor | None = None,
        key: torch.Tensor | None = None,
        query_positions: torch.Tensor | None = None,
        key_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Weights for ``scores[..., q, k]``; ``mask`` (bool, broadcastable) is True where visible."""
        compute_dtype = torch.promote_types(scores.dtype, torch.float32)
        x = scores.to(compute_dtype)
        if mask is None:
            visible = torch.ones_like(x, dtype=torch.bool)
        else:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be a bool tensor (True = visible), got {mask.dtype}")
            visible = mask.expand_as(x)
        x = x.masked_fill(~visible, 0.0)
        inputs = AttentionInputs(query, key, query_positions, key_positions)
        weights = self.score(x, visible, inputs)
        return weights.masked_fill(~visible, 0.0).to(scores.dtype)

    def score(self, x: torch.Tensor, visible: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        """Weights from clean logits ``x`` (masked entries are 0). Masked outputs are zeroed later."""
        raise NotImplementedError

    # -- the fused path (ssacli.kernels.fused) ------------------------------------------------------------
    def fused(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        scale: float,
        causal: bool,
        mask: torch.Tensor | None,
        dropout: float,
        backend: str = "auto",
    ) -> torch.Tensor | None:
        """Attention output [b, h, q, d] without forming the weights, or None: no fused kernel.

        key/value are [b, h_kv, k, d] (not repeated for GQA); ``mask`` is bool [b|1, 1|h, q, k]
        (True = visible) and ``causal`` bottom-right aligned. Must equal ``forward`` followed by
        ``weights @ value`` (tests/kernels/test_fused.py checks outputs and gradients). ``backend``:
        the model's (ssacli.kernels.routing.BACKENDS), for a scorer whose kernel has several paths.
        """
        return None

    # -- the online form (diagnose's fused statistics, ssacli.kernels.online_stats) ---------------------
    def transformed_logits(self, x: torch.Tensor, count: torch.Tensor) -> torch.Tensor | None:
        """t(x) for scorers whose weights are softmax(t(x)) over the visible keys (plus at most a
        :meth:`keyless_logit` in the denominator), so that running sums over key blocks give every row
        statistic; None for the others. ``x``: clean logits [..., h, q, k] in the compute dtype;
        ``count`` [..., q, 1]: the keys each row sees (what ``score`` would count). ``score`` of such
        a scorer is this transform followed by the softmax, so the two cannot drift apart."""
        return None

    def keyless_logit(self, x: torch.Tensor) -> torch.Tensor | None:
        """The logit of the denominator's extra term that no key carries (sink: s; softmax1: 0),
        broadcastable to ``x[..., h, q, 1]``; None where the row's weights sum to one."""
        return None


# ---- helpers shared by scorers ---------------------------------------------------------------------


def masked_softmax(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax over visible keys; fully masked rows come out finite (and are zeroed by the caller).

    Masked logits become -inf so their weight is exactly 0. A row with no visible key would give
    NaN that way, so its logits are set to 0 instead (uniform, then zeroed): no NaN in forward or
    backward.
    """
    any_visible = visible.any(dim=-1, keepdim=True)
    fill = torch.where(any_visible, float("-inf"), 0.0).to(z.dtype)
    return torch.softmax(torch.where(visible, z, fill), dim=-1)


def visible_count(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """N_i: the number of keys row i may see, shape [..., q, 1] (never the padded length)."""
    return visible.sum(dim=-1, keepdim=True).to(dtype)


def visible_max(x: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Row max over visible entries, [..., q, 1]; 0 for rows with none."""
    m = torch.where(visible, x, float("-inf")).amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def visible_min(x: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    m = torch.where(visible, x, float("inf")).amin(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def inverse_softplus(y: float) -> float:
    """raw such that softplus(raw) == y (y > 0), stable for large and small y."""
    return y + math.log(-math.expm1(-y))


def positive(raw: torch.Tensor) -> torch.Tensor:
    """softplus(raw) + eps: a positive parameter that gradient steps cannot push to <= 0."""
    return F.softplus(raw) + POSITIVE_EPS


def positive_raw(value: float, scorer: str, key: str) -> float:
    """The raw value of a positive parameter (:func:`positive`) that starts at ``value``."""
    check_positive(value, scorer, key)
    return inverse_softplus(value - POSITIVE_EPS)


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):  # shortest text that parses back to the same float
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
    return str(v)
