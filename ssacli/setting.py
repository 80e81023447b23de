"""A settings field that carries its own help and command-line form (issue 53).

The settings values of the API (:class:`~ssacli.diagnosis.settings.DiagnoseSettings`,
:class:`~ssacli.models.options.LoadOptions`, …) declare each setting once, as a dataclass field
made by :func:`setting`: its default, the help text its option shows, and how the option is spelled
where that is not ``--field-name`` with the field's own type. ``ssacli/cli/declared.py`` builds the
Typer options of every command from these fields, so a default or a help text is written in one
place and ``ssacli COMMAND --help`` cannot drift from the API. A field made without help (a plain
default, or ``setting(default)``) is API-only: no command offers it.

The keyword wrappers of the API (``ssacli.diagnose(model, **settings)``) build their values with
:func:`settings_from`, so a keyword is read in one place too.

Cheap to import (the standard library only): the CLI reads these fields before it imports a stage.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, Field, field
from typing import Any

HELP = "help"  # the field's metadata key: its option's help text (None: no option)
CLI = "cli"  # the field's metadata key: how its option is spelled (the keywords of option())


def setting(
    default: Any = MISSING,
    help: str | None = None,  # noqa: A002 - the name Typer and argparse give it
    *,
    flags: tuple[str, ...] = (),
    type: Any = None,  # noqa: A002 - what Typer reads it as
    default_text: Any = MISSING,
    metavar: str | None = None,
    min: float | None = None,  # noqa: A002
    max: float | None = None,  # noqa: A002
    hidden: bool = False,
) -> Any:
    """A dataclass field with its option: ``help`` (None: the field is API-only), ``flags`` (the
    option's names; default ``--field-name``), ``type`` (what the option reads, where it is not the
    default's type: ``Path`` for a file whose text the field holds, ``list[str]`` for a repeated
    option), ``default_text`` (the option's default where the command line spells the value as text,
    e.g. ``"1,2,4"`` for a tuple), ``metavar``, ``min`` / ``max`` (checked as the option is parsed;
    the field checks them again where it is built) and ``hidden`` (accepted, not listed: a
    deprecated flag)."""
    spelling = {"flags": tuple(flags), "type": type, "metavar": metavar, "min": min, "max": max}
    cli = {k: v for k, v in spelling.items() if v not in (None, ())}
    if default_text is not MISSING:
        cli["default"] = default_text
    if hidden:
        cli["hidden"] = True
    return field(default=default, metadata={HELP: help, CLI: cli})


def option_fields(cls: type) -> list[Field]:
    """The fields of dataclass ``cls`` that are options (made with a help text), in their order;
    init-only fields (``InitVar``, e.g. a deprecated keyword) included."""
    return [f for f in cls.__dataclass_fields__.values() if f.metadata.get(HELP) is not None]


def init_names(cls: type) -> list[str]:
    """The keywords dataclass ``cls`` is built with: its init fields, init-only ones included."""
    return list(inspect.signature(cls).parameters)


def settings_from(function: str, keywords: dict[str, Any], *classes: type) -> tuple[Any, ...]:
    """One value of each of ``classes`` from a keyword wrapper's ``keywords``: each keyword goes to
    the first class with a field of its name. A keyword none of them takes is a TypeError naming
    ``function``, as Python's own for a function that does not take it."""
    taken = {cls: {} for cls in classes}
    for name, value in keywords.items():
        owner = next((cls for cls in classes if name in init_names(cls)), None)
        if owner is None:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
        taken[owner][name] = value
    return tuple(cls(**taken[cls]) for cls in classes)
