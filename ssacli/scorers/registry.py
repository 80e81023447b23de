"""One registry of scorers, and the spec strings every CLI command uses to build them.

A spec is ``name`` or ``name:key=value,key=value``; e.g. ``ssa:init=faithful,m=256`` or
``entmax:alpha=1.3,learn=alpha``. Values are parsed by the scorer's declared :class:`Option`s, so a
bad key or value fails here with a message that lists what is valid.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from .base import Scorer

SCORERS: dict[str, type[Scorer]] = {}


def register_scorer(cls: type[Scorer]) -> type[Scorer]:
    """Class decorator: add a scorer under ``cls.name`` (names are plain: no '/' or ':')."""
    if not cls.name or any(c in cls.name for c in "/:,="):
        raise ValueError(f"bad scorer name {cls.name!r}")
    if cls.name in SCORERS:
        raise ValueError(f"scorer {cls.name!r} is already registered")
    SCORERS[cls.name] = cls
    return cls


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split and type-check a spec: ``"ssa:n=2,learn=n"`` -> ``("ssa", {"n": 2.0, "learn": "n"})``."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty scorer spec; choose one of: {', '.join(SCORERS)}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in SCORERS:
        raise SpecError(
            f"unknown scorer '{name}'; choose one of: {', '.join(SCORERS)} (see `ssacli scorers`)"
        )
    cls = SCORERS[name]
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        valid = ", ".join(cls.options) or "(none)"
        if not eq or not key or not raw:
            raise SpecError(f"scorer '{name}': expected key=value, got {item!r}; valid keys: {valid}")
        if key not in cls.options:
            raise SpecError(f"scorer '{name}' has no option '{key}'; valid keys: {valid}")
        if key in options:
            raise SpecError(f"scorer '{name}': option '{key}' given twice")
        options[key] = cls.options[key].parse(name, key, raw)
    return name, options


def make_scorer(spec: str | Scorer, num_heads: int = 1) -> Scorer:
    """Build a scorer from a spec string (a Scorer instance is returned as it is)."""
    if isinstance(spec, Scorer):
        return spec
    name, options = parse_spec(spec)
    return SCORERS[name](num_heads=num_heads, **options)


def describe_scorer(spec: str) -> dict[str, Any]:
    """What a spec resolves to: its options (given or default) and initial parameter values."""
    scorer = make_scorer(spec)
    return {
        "spec": scorer.spec,
        "name": scorer.name,
        "summary": scorer.summary,
        "options": scorer.opts,
        "applied": scorer.applied_options(),  # as they act: overridden or inapplicable ones marked
        "learned": sorted(scorer.learn),
        "initial_values": {k: round(v[0].item(), 8) for k, v in scorer.parameter_values().items()},
    }


def scorer_table() -> list[dict[str, Any]]:
    """One row per scorer: what `ssacli scorers` prints (and emits with --json)."""
    rows = []
    for name, cls in SCORERS.items():
        rows.append(
            {
                "name": name,
                "summary": cls.summary,
                "trainable": list(cls.trainable),
                "rows_sum_to_one": cls.traits.rows_sum_to_one,
                "shift_invariant": cls.traits.shift_invariant,
                "limit": cls.traits.limit,
                "fusable": cls.traits.fusable,
                "uses_qk": cls.uses_qk,
                "options": {k: {"default": o.default, "help": o.help} for k, o in cls.options.items()},
            }
        )
    return rows
