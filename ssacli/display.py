"""Results drawn in a notebook, across the layers: :class:`Displayed` gives a result type (diagnose's
``DiagnoseResult``, quality's ``QualityReport``, check's ``CheckReport``) Jupyter's ``_repr_html_``
and ``plot(kind, …)``; the report layer, above those layers, draws them.

Why a registry: a layer imports only from the layers below it (docs/architecture.md), and a lazy
``from ..report import …`` inside a method would still make diagnosis depend on report, only out of
import-linter's sight. So a result asks this module, at the bottom of the stack, for "the HTML of a
DiagnoseResult", and the package root (ssacli/__init__.py: the public API, above every layer, which
already maps names to modules) binds each type to the report functions that draw it, by module
path: nothing is imported until a notebook asks, and ``import ssacli`` stays torch-free. The root
always runs first: importing ``ssacli.diagnosis.result`` imports the ``ssacli`` package before it.
"""

from __future__ import annotations

import importlib
from typing import Any

# type name → ("module:function" drawing its HTML, "module:function" drawing one of its figures)
_BOUND: dict[str, tuple[str, str]] = {}


def bind(type_name: str, html: str, plot: str) -> None:
    """Name the functions that draw ``type_name``'s results: ``html(result) -> str`` and
    ``plot(result, kind, **options) -> matplotlib Figure``, each as ``"module:function"``."""
    _BOUND[type_name] = (html, plot)


def _drawer(result: Any, which: int):
    name = type(result).__name__
    if name not in _BOUND:  # a subclass draws as the ssacli type it extends
        name = next((c.__name__ for c in type(result).__mro__ if c.__name__ in _BOUND), name)
    try:
        target = _BOUND[name][which]
    except KeyError:
        raise LookupError(f"no display is bound for {name} (ssacli/__init__.py binds them)") from None
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


class Displayed:
    """What a result type inherits to show itself in a notebook (docs/notebooks.md)."""

    def _repr_html_(self) -> str:
        """The compact HTML Jupyter shows for the result: its verdict first, details folded."""
        return _drawer(self, 0)(self)

    def plot(self, kind: str | None = None, **options: Any):
        """One of the result's figures as a ``matplotlib.figure.Figure`` (no pyplot state, no
        backend chosen): the figures of its HTML page and of ``--png`` / ``--svg``. ``kind`` None:
        the first of the type's kinds; a bad kind or option is a UsageError that lists them."""
        return _drawer(self, 1)(self, kind, **options)


__all__ = ["Displayed", "bind"]
