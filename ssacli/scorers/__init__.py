"""Attention scorers: pure, mask-exact functions from logits (or q, k) to weights, plus a registry.

>>> from ssacli.scorers import make_scorer
>>> ssa = make_scorer("ssa:init=paper", num_heads=8)
>>> weights = ssa(logits, mask)          # logits [b, h, q, k], mask bool, True = visible

What each scorer declares (name, options, traits) is torch-free (:mod:`ssacli.scorers.specs`, the
table; :mod:`ssacli.scorers.declaration`, its vocabulary), and so is :func:`parse_spec`: the names
below load their module on first use (PEP 562), so ``from ssacli.scorers import parse_spec`` checks
a spec without importing torch. The torch classes live in softmax_family.py, sparse.py,
unnormalized.py and cosformer.py; importing the registry registers all of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that owns it
_LAZY = {
    "DECLARATIONS": "specs",
    "FAITHFUL_M": "specs",
    "parse_spec": "specs",
    "scorer_table": "specs",
    "Declaration": "declaration",
    "Option": "declaration",
    "Traits": "declaration",
    "AttentionInputs": "base",
    "Scorer": "base",
    "SCORERS": "registry",
    "describe_scorer": "registry",
    "make_scorer": "registry",
    "register_scorer": "registry",
}

if TYPE_CHECKING:
    from .base import AttentionInputs, Scorer
    from .declaration import Declaration, Option, Traits
    from .registry import SCORERS, describe_scorer, make_scorer, register_scorer
    from .specs import DECLARATIONS, FAITHFUL_M, parse_spec, scorer_table


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ssacli.scorers' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "DECLARATIONS",
    "FAITHFUL_M",
    "SCORERS",
    "AttentionInputs",
    "Declaration",
    "Option",
    "Scorer",
    "Traits",
    "describe_scorer",
    "make_scorer",
    "parse_spec",
    "register_scorer",
    "scorer_table",
]
