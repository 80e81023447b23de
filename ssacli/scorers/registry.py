"""One registry of scorer classes, and the spec strings every CLI command uses to build them.

A spec is ``name`` or ``name:key=value,key=value``; e.g. ``ssa:init=faithful,m=256`` or
``entmax:alpha=1.3,learn=alpha``. :func:`parse_spec` (torch-free, in :mod:`ssacli.scorers.specs`)
checks it against the scorer's declaration, so a bad key or value fails there with a message that
lists what is valid; :func:`make_scorer` builds the torch module.
"""

from __future__ import annotations

from typing import Any

from .base import Scorer
from .specs import DECLARATIONS, declare, parse_spec, scorer_table

__all__ = ["SCORERS", "describe_scorer", "make_scorer", "parse_spec", "register_scorer", "scorer_table"]

SCORERS: dict[str, type[Scorer]] = {}  # in the order of DECLARATIONS: `ssacli scorers` lists them so


def register_scorer(cls: type[Scorer]) -> type[Scorer]:
    """Class decorator: add a scorer under ``cls.name`` (names are plain: no '/' or ':'). A built-in
    scorer takes its declaration from the table (``declared=``); any other is declared by its class
    attributes, and from then on parse_spec knows it too."""
    if not getattr(cls, "name", None) or any(c in cls.name for c in "/:,="):
        raise ValueError(f"bad scorer name {getattr(cls, 'name', None)!r}")
    if cls.name in SCORERS:
        raise ValueError(f"scorer {cls.name!r} is already registered")
    if cls.declared is None:
        declare(cls.declaration())
    elif cls.declared is not DECLARATIONS.get(cls.name):
        raise ValueError(f"scorer {cls.name!r} is declared twice")
    SCORERS[cls.name] = cls
    order = list(DECLARATIONS)  # whichever scorer module is imported first, the table's order
    ordered = sorted(SCORERS.items(), key=lambda item: order.index(item[0]))
    SCORERS.clear()
    SCORERS.update(ordered)
    return cls


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


# The built-in scorer classes register themselves as they are imported: whoever imports the registry
# gets all of them (they import register_scorer from here, defined above).
from . import cosformer, softmax_family, sparse, unnormalized  # noqa: E402, F401, I001
