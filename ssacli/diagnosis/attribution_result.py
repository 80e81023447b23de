"""The values of :func:`ssacli.diagnosis.attribution.attribute`: what it patches and measures
(:class:`AttributionSettings`, checked when built) and what it returns (one probe level's damage and
what the attention patterns of head sets carry of it, JSON-able (:meth:`Attribution.to_dict`) and in
a few lines of text (:meth:`Attribution.lines`))."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import UsageError

Head = tuple[int, int]  # (layer, head), counted from 0
# The plan's reading (docs/results/saturation-matters-plan.md, committed before any run): collapse
# marks the heads that carry the damage only where the chosen set beats this share of random sets …
NULL_BEATS = 95.0
# … and does not mark them where the set sits inside this central share of the null
NULL_CENTRAL = 90.0
READINGS = {
    "marks": "collapse marks the heads that carry the damage",
    "does not mark": "collapse does not mark the heads that carry the damage",
    "undecided": "undecided at this budget",
}


@dataclass(frozen=True)
class AttributionSettings:
    """What an attribution patches and measures (:func:`~ssacli.diagnosis.attribution.attribute`'s
    keywords of those names); a bad value is a UsageError here, before any forward."""

    level: float | None = None  # the shifted level (None: the probe's last one other than unshifted)
    heads: tuple[Head, ...] | None = None  # a given set (None: top k chosen on half the prompts)
    k: int = 4
    null: int = 200  # random layer-matched sets per measured set
    per_head: bool = True  # each head of a set alone too
    ceiling: bool = True  # every head patched
    resamples: int = 10_000  # bootstrap resamples of each interval

    def __post_init__(self) -> None:
        if self.k < 1:
            raise UsageError(f"k must be at least 1 (heads per chosen set), got {self.k}")
        if self.null < 0:
            raise UsageError(f"null must be 0 (no null) or more random sets, got {self.null}")
        if self.resamples < 1:
            raise UsageError(f"resamples must be at least 1, got {self.resamples}")
        if self.heads is not None and not self.heads:
            raise UsageError("heads must name at least one (layer, head) pair, or be None to choose them")


@dataclass
class SetAttribution:
    """The damage one head set's unshifted patterns removed, measured on ``measured_on``'s prompts."""

    heads: list[Head]
    chosen_on: list[int] | None  # prompts the set was chosen on (None: given, or every head)
    measured_on: list[int]
    removed: list[float]  # per measured prompt: loss(shifted) − loss(shifted, S patched)
    mean: float
    interval: tuple[float, float] | None  # 95 % bootstrap interval over the measured prompts
    damage: float  # the mean damage over the same prompts
    damage_interval: tuple[float, float] | None
    share: float | None  # mean / damage, only where the damage's interval excludes 0
    null: list[float] = field(default_factory=list)  # mean removed by each random layer-matched set
    percentile: float | None = None  # where ``mean`` falls in ``null`` (100: above every random set)
    per_head: dict[str, float] = field(default_factory=dict)  # "L3H2" -> mean removed alone

    @property
    def parts_sum(self) -> float | None:
        """What the set's heads removed one at a time, summed (beside ``mean``: self-repair)."""
        return float(sum(self.per_head.values())) if self.per_head else None

    @property
    def reading(self) -> str | None:
        """The plan's reading of a set against its null (docs/results/saturation-matters-plan.md):
        "marks" where the removed damage's interval excludes 0 (above it) and the set beats at least
        NULL_BEATS of the random sets, "does not mark" where it sits in the null's central
        NULL_CENTRAL, else "undecided"; None without a null."""
        if self.percentile is None:
            return None
        if self.interval is not None and self.interval[0] > 0 and self.percentile >= NULL_BEATS:
            return "marks"
        low = (100 - NULL_CENTRAL) / 2
        return "does not mark" if low <= self.percentile <= 100 - low else "undecided"


@dataclass
class Attribution:
    """One probe level's damage and what attention patterns carry of it (:func:`attribute`)."""

    model: str
    probe: str
    level: float
    reference_level: float
    k: int
    layers: list[str]
    heads: list[int]
    loss_reference: list[float]  # per prompt, unshifted
    loss_shifted: list[float]
    damage: list[float]  # per prompt: shifted − unshifted
    damage_interval: tuple[float, float] | None
    rise: list[list[float]]  # [layer][head] collapse rise over every prompt (NaN: collapsed unshifted)
    sets: list[SetAttribution]  # chosen on half A measured on B, and the reverse; or the given set
    ceiling: SetAttribution | None  # every head patched (None: not asked for)
    elapsed_s: float
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (NaN as None), each set with its :attr:`~SetAttribution.reading`."""
        out = asdict(self)
        for one, kept in zip([*self.sets, self.ceiling], [*out["sets"], out["ceiling"]], strict=True):
            if kept is not None:
                kept["reading"] = one.reading
        return _jsonable(out)

    def lines(self) -> list[str]:
        """The result in a few lines of at most 80 columns."""
        mean = float(np.mean(self.damage))
        out = [
            f"{self.probe} at {self.level:g} against {self.reference_level:g}, {len(self.damage)} prompts",
            f"  damage {mean:+.4f} nats/token {_interval(self.damage_interval)}",
        ]
        for one in [*self.sets, *([self.ceiling] if self.ceiling else [])]:
            if one is self.ceiling:
                out.append("  every head (the ceiling: what attention patterns carry at all)")
            elif one.chosen_on is None:
                out.append(f"  {_names(one.heads)} (given)")
            else:
                where = f"top {len(one.heads)} by collapse rise on {len(one.chosen_on)} prompts"
                out.append(f"  {_names(one.heads)} ({where})")
            share = "" if one.share is None else f", {one.share:.0%} of the damage"
            on = f" on {len(one.measured_on)} prompts" if one.chosen_on is not None else ""
            out.append(f"    removes {one.mean:+.4f} {_interval(one.interval)}{on}{share}")
            if one.percentile is not None:
                out.append(f"    beats {one.percentile:.0f}% of {len(one.null)} random layer-matched sets")
                out.append(f"    {READINGS[one.reading]}")
            if one.per_head:
                alone = ", ".join(f"{h} {v:+.4f}" for h, v in one.per_head.items())
                out.append(f"    alone: {alone}")
        return out


def _names(heads: list[Head]) -> str:
    return " ".join(f"L{layer}H{head}" for layer, head in heads)


def _interval(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


__all__ = ["Attribution", "AttributionSettings", "Head", "SetAttribution"]
