"""What an attribution patches and measures, as one frozen value (:class:`AttributionSettings`),
checked in one place. Each option field's help is its ``ssacli attribute`` option's
(:func:`ssacli.setting.setting`). Cheap to import (neither numpy nor torch): the CLI reads the
fields to build its options. The attribution is :mod:`ssacli.diagnosis.attribution`, its result
:mod:`ssacli.diagnosis.attribution_result`."""

from __future__ import annotations

from dataclasses import dataclass

from .. import defaults
from ..defaults import RESAMPLES
from ..errors import UsageError
from ..setting import setting

Head = tuple[int, int]  # (layer, head), counted from 0


@dataclass(frozen=True)
class AttributionSettings:
    """What an attribution patches and measures (:func:`~ssacli.diagnosis.attribution.attribute`'s
    keywords of those names); a bad value is a UsageError here, before any forward. Each option
    field's help is its ``ssacli attribute`` option's (``--heads`` and ``--remedy`` comma-separated;
    ``--no-per-head`` and ``--no-ceiling`` turn ``per_head`` and ``ceiling`` off)."""

    level: float | None = setting(  # None: the probe's last level other than the unshifted one
        None, "The shifted level to attribute (default: the probe's last).", type=float
    )
    heads: tuple[Head, ...] | None = setting(  # a given set (None: top k chosen on half the prompts)
        None,
        "Measure this set on every prompt, e.g. L2H1,L3H0 (default: top --k by collapse rise, "
        "chosen on half the prompts, measured on the other).",
        type=str,
        metavar="HEADS",
    )
    k: int = setting(defaults.ATTRIBUTE_K, "Heads per chosen set.", flags=("--k",), min=1)
    null: int = setting(  # random layer-matched sets per measured set
        defaults.ATTRIBUTE_NULL, "Random layer-matched sets per set (0: no null; the cost).", min=0
    )
    per_head: bool = True  # each head of a set alone too
    ceiling: bool = True  # every head patched
    resamples: int = setting(  # bootstrap resamples of each interval
        RESAMPLES,
        f"Bootstrap resamples of each interval (default: ssacli.stats', {RESAMPLES:,}).",
        type=int,
        default_text=None,
        min=1,
    )
    remedy: tuple[float, ...] = setting(  # temperatures T tried on each measured set's heads (the remedy)
        (),
        "Also temper each set's heads at these temperatures (the remedy, not attribution; "
        "refused under logit-scale, which T undoes exactly).",
        type=str,
        default_text=None,
        metavar="T1,T2,…",
    )

    def __post_init__(self) -> None:
        # sequences as given by a caller ([[layer, head], …], a list of temperatures) kept as tuples:
        # the value is frozen and hashable, and its JSON reads the same either way
        if self.heads is not None:
            object.__setattr__(self, "heads", tuple(tuple(h) for h in self.heads))
        object.__setattr__(self, "remedy", tuple(self.remedy))
        if any(not (t > 0) for t in self.remedy):
            raise UsageError(f"remedy temperatures must be above 0, got {list(self.remedy)}")
        if self.k < 1:
            raise UsageError(f"k must be at least 1 (heads per chosen set), got {self.k}")
        if self.null < 0:
            raise UsageError(f"null must be 0 (no null) or more random sets, got {self.null}")
        if self.resamples < 1:
            raise UsageError(f"resamples must be at least 1, got {self.resamples}")
        if self.heads is not None and not self.heads:
            raise UsageError("heads must name at least one (layer, head) pair, or be None to choose them")
