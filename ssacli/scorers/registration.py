"""The registered scorer classes (:data:`SCORERS`) and the decorator that adds one
(:func:`register_scorer`). Each built-in scorer module registers its classes as it is imported;
:mod:`ssacli.scorers.registry` imports them all, so read SCORERS from there (or ``ssacli.scorers``)."""

from __future__ import annotations

from .base import Scorer
from .specs import DECLARATIONS, declare

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


__all__ = ["SCORERS", "register_scorer"]
