"""One registry of scorer classes, and the spec strings every CLI command uses to build them.

Importing this module registers every built-in scorer (:data:`SCORERS` and :func:`register_scorer`
are :mod:`ssacli.scorers.registration`'s, where the built-in classes register themselves).

A spec is ``name`` or ``name:key=value,key=value``; e.g. ``ssa:init=faithful,m=256`` or
``entmax:alpha=1.3,learn=alpha``. :func:`parse_spec` (torch-free, in :mod:`ssacli.scorers.specs`)
checks it against the scorer's declaration, so a bad key or value fails there with a message that
lists what is valid; :func:`make_scorer` builds the torch module.
"""

from __future__ import annotations

from typing import Any

# The built-in scorer classes register themselves as they are imported: importing them here gives
# whoever imports the registry all of them.
from . import cosformer, softmax_family, sparse, unnormalized  # noqa: F401
from .base import Scorer
from .registration import SCORERS, register_scorer
from .specs import parse_spec, scorer_table

__all__ = ["SCORERS", "describe_scorer", "make_scorer", "parse_spec", "register_scorer", "scorer_table"]


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
