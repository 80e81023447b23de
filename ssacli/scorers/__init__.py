"""Attention scorers: pure, mask-exact functions from logits (or q, k) to weights, plus a registry.

>>> from ssacli.scorers import make_scorer
>>> ssa = make_scorer("ssa:init=paper", num_heads=8)
>>> weights = ssa(logits, mask)          # logits [b, h, q, k], mask bool, True = visible
"""

# Registration order is the order `ssacli scorers` lists them in: the reference first.
from . import softmax_family, sparse, unnormalized, cosformer  # noqa: F401, I001
from .base import AttentionInputs, Option, Scorer, Traits
from .registry import SCORERS, describe_scorer, make_scorer, parse_spec, register_scorer, scorer_table
from .softmax_family import FAITHFUL_M

__all__ = [
    "FAITHFUL_M",
    "SCORERS",
    "AttentionInputs",
    "Option",
    "Scorer",
    "Traits",
    "describe_scorer",
    "make_scorer",
    "parse_spec",
    "register_scorer",
    "scorer_table",
]
