"""What a scorer declares, with no torch behind it: its options, traits and trainable parameters.

A :class:`Declaration` is everything about a scorer that a spec string is checked against: name,
summary, :class:`Traits`, :class:`Option`\\ s, the parameters ``learn=`` may select, and the rules its
option values obey beyond their types (``temperature:t=0`` is refused here, not when a tensor is
made). The built-in scorers' declarations are the table in :mod:`ssacli.scorers.specs`; each torch
scorer class takes its declaration from there (``class SSA(Scorer, declared="ssa")``), so the CLI
refuses a bad ``--scorer`` before torch is imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError

# Smallest value a positive parameter reparameterized through softplus can take.
POSITIVE_EPS = 1e-9


@dataclass(frozen=True)
class Option:
    """One ``key=value`` of a scorer spec. ``kind`` is float, int, bool, str, a tuple of choices, or
    a function from the text to the value (raising ValueError)."""

    default: Any
    kind: Any
    help: str

    def parse(self, scorer: str, key: str, raw: str) -> Any:
        try:
            if isinstance(self.kind, tuple):
                if raw not in self.kind:
                    raise ValueError
                return raw
            if self.kind is bool:
                if raw.lower() in ("1", "true", "yes", "on"):
                    return True
                if raw.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            value = self.kind(raw)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError
            return value
        except ValueError:
            expected = "|".join(self.kind) if isinstance(self.kind, tuple) else self.kind.__name__
            raise SpecError(f"scorer '{scorer}': {key}={raw!r} is not a valid {expected}") from None


@dataclass(frozen=True)
class Traits:
    """What `ssacli scorers` tabulates; facts from docs/scorers.md, checked by the tests."""

    rows_sum_to_one: str  # "yes", "no", "<= 1", "< 1"
    shift_invariant: str  # "yes", "no", "n/a"
    limit: str  # what the weights tend to as logits x -> c*x, c -> inf
    fusable: str  # one streaming pass over key blocks with O(1) state per row?


@dataclass(frozen=True)
class Declaration:
    """One scorer as specs see it. ``rules(given)`` refuses option values (those the spec gives,
    already typed) that no scorer could start from, with a :class:`SpecError`; None: any typed value
    will do."""

    name: str
    summary: str
    traits: Traits
    options: dict[str, Option] = field(default_factory=dict)
    trainable: tuple[str, ...] = ()  # names of the parameters `learn=` may select
    uses_qk: bool = False  # scores q and k (cosFormer), not the logits
    rules: Callable[[dict[str, Any]], None] | None = None

    def filled(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every option: the given value, else the default."""
        return {key: given.get(key, option.default) for key, option in self.options.items()}

    def check(self, given: dict[str, Any]) -> None:
        """Refuse the values of ``given`` (typed options, all of them known) that cannot start."""
        if "learn" in given:
            learn_set(self, given["learn"])
        if self.rules is not None:
            self.rules(given)

    @classmethod
    def of(cls, scorer: type) -> Declaration:
        """The declaration a scorer class makes by its class attributes (a scorer outside the table,
        e.g. a user's, registered with ssacli.scorers.register_scorer)."""
        return cls(
            scorer.name, scorer.summary, scorer.traits, dict(scorer.options), tuple(scorer.trainable),
            bool(scorer.uses_qk),
        )  # fmt: skip


def learn_set(declaration: Declaration, raw: str) -> frozenset[str]:
    """The parameters ``learn=raw`` selects: none, all, or a '+'-joined subset of the trainable ones."""
    if raw == "none":
        return frozenset()
    if raw == "all":
        return frozenset(declaration.trainable)
    chosen = frozenset(raw.split("+"))
    bad = sorted(chosen - set(declaration.trainable))
    if bad:
        raise SpecError(
            f"scorer '{declaration.name}': learn={raw!r} names {', '.join(bad)}; "
            f"use a '+'-joined subset of {', '.join(declaration.trainable)}, or all, or none"
        )
    return chosen


def check_positive(value: float, scorer: str, key: str) -> None:
    """A parameter kept positive through softplus(raw) + POSITIVE_EPS must start above the eps."""
    if not value > POSITIVE_EPS:
        raise SpecError(f"scorer '{scorer}': {key} must be > {POSITIVE_EPS:g}, got {value:g}")


# Option presets reused by scorers with trainable per-head parameters.
SHARE = Option("head", ("head", "layer"), "one parameter per head, or one per layer")


def learn_option(default: str, names: tuple[str, ...]) -> Option:
    return Option(default, str, f"trainable: a '+'-joined subset of {'/'.join(names)}, all, or none")
