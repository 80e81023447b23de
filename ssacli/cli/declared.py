"""Commands whose options are the fields of settings values (issue 53): each setting is declared
once, as a field of the value the API takes (:func:`ssacli.setting.setting`: its default, its help,
how its option is spelled), and the command's Typer options are built from those fields.

A command names the values it builds, in the order ``--help`` lists their options (:func:`options`:
a dataclass and which of its fields, with what this command says otherwise, e.g. another default).
:func:`command` gives Typer one option per field; the command function keeps its arguments (MODEL,
…) as parameters and receives the options as one :class:`Given`: ``given.NAME`` is an option's
value, ``given.of(Settings, **changes)`` the settings value built from its options, with the
``changes`` where the command line spells a value otherwise (a file whose text the field holds, a
comma-separated list). Options only the command line has (output files, --quiet) are fields of a
frozen dataclass of the command's own module, declared the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field
from typing import Any

import typer

from ..setting import CLI, HELP, option_fields

GIVEN = "given"  # the parameter of a command function that receives its options


@dataclass(frozen=True)
class Options:
    """Some fields of the settings dataclass ``cls`` as options, in ``names``' order, each with the
    option keywords (``default``, ``help``, ``flags``, …) ``changes`` gives it in this command."""

    cls: type
    names: tuple[str, ...]
    changes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def parameters(self) -> list[inspect.Parameter]:
        declared = {f.name: f for f in option_fields(self.cls)}
        return [_parameter(declared[name], self.changes.get(name, {})) for name in self.names]


def options(cls: type, *names: str, exclude: tuple[str, ...] = (), **changes: Mapping[str, Any]) -> Options:
    """The option fields of ``cls`` (``names``: these, in this order; else all but ``exclude``), with
    ``changes``: per field, the option keywords this command gives it otherwise."""
    declared = [f.name for f in option_fields(cls)]
    chosen = names or tuple(n for n in declared if n not in exclude)
    unknown = [n for n in (*chosen, *exclude, *changes) if n not in declared]
    if unknown:
        raise TypeError(f"{cls.__name__} has no option field {', '.join(unknown)}")
    return Options(cls, chosen, changes)


class Given:
    """A command's option values: ``given.NAME``, and :meth:`of`."""

    def __init__(self, values: dict[str, Any], sources: tuple[Options, ...]) -> None:
        self._values, self._sources = values, sources

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no option {name!r}") from None

    def of(self, cls: type, **changes: Any) -> Any:
        """The ``cls`` value of the options declared by its fields, with ``changes`` (the fields whose
        value the command line spells otherwise, or that no option sets). An option left at the text
        that stands for its field's default (``setting(default_text=…)``) gives the field's default."""
        declared = {f.name: f for f in option_fields(cls)}
        values = {}
        for name in (n for source in self._sources if source.cls is cls for n in source.names):
            spelled = declared[name].metadata[CLI]
            if "default" in spelled and self._values[name] == spelled["default"]:
                continue  # the command line's spelling of the default: the field's own
            values[name] = self._values[name]
        return cls(**(values | changes))


def command(*sources: Options | type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A Typer command function whose options are ``sources``' fields (a dataclass alone: all its
    option fields), after the function's own parameters; the function takes them as ``given``."""
    chosen = tuple(s if isinstance(s, Options) else options(s) for s in sources)

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(function, eval_str=True).parameters.values() if p.name != GIVEN]
        generated = [p for source in chosen for p in source.parameters()]
        names = [p.name for p in (*own, *generated)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise TypeError(f"{function.__name__}: more than one option named {', '.join(twice)}")

        @functools.wraps(function)  # __wrapped__: inspect.getsourcelines reads the command's own lines
        def run(**values: Any) -> Any:
            mine = {p.name: values.pop(p.name) for p in own}
            return function(**mine, **{GIVEN: Given(values, chosen)})

        run.__signature__ = inspect.Signature([*own, *generated])  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in (*own, *generated)}
        run.options = chosen  # type: ignore[attr-defined]  # what the options are built from (tests)
        return run

    return decorate


def help_of(cls: type, name: str, default: Any) -> str:
    """The help of field ``name`` of ``cls`` naming ``default``, for an option of it that defaults to
    None (not given: another default applies, e.g. a config file's, then ``default``)."""
    text = next(f for f in option_fields(cls) if f.name == name).metadata[HELP]
    return f"{text.removesuffix('.')} (default {default})."


def _parameter(declared: Field, change: Mapping[str, Any]) -> inspect.Parameter:
    """The Typer option of one settings field: its default, help and spelling, with ``change``."""
    spelled = {**declared.metadata[CLI], "help": declared.metadata[HELP], **change}
    default = spelled.pop("default", declared.default)
    typed = declared.default if declared.default not in (None, MISSING) else default  # the field's own first
    kind = spelled.pop("type", None) or (None if typed in (None, MISSING) else type(typed))
    if kind is None:
        raise TypeError(f"option field {declared.name} has no default to read its type from: setting(type=…)")
    if default is MISSING:
        default = ...  # Typer's "required"
    flags = spelled.pop("flags", ())
    if kind is bool and not flags:  # --name alone, not Typer's --name/--no-name pair
        flags = ("--" + declared.name.replace("_", "-"),)
    return inspect.Parameter(
        declared.name, inspect.Parameter.KEYWORD_ONLY, default=typer.Option(default, *flags, **spelled),
        annotation=kind,
    )  # fmt: skip
