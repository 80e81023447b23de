"""The settings of ``ssacli check``: explicit ones over an ssacli.toml over the defaults, with the
requirements parsed, ready to run (:func:`check_settings` -> :class:`CheckSettings`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..defaults import DEFAULT_MODEL
from ..errors import UsageError
from .baseline import check_regression_gate, read_baseline
from .config import CONFIG_FILE, load_config, same_model
from .expressions import Requirement, parse_requirement

if TYPE_CHECKING:  # the settings are built torch-free: a bad requirement or toml is refused at once
    from .requirements import CheckReport


@dataclass
class CheckSettings:
    """A check ready to run: MODEL, its parsed requirements and :func:`run_check`'s other keywords
    (``baseline``, ``max_regression``, and :func:`ssacli.diagnose`'s)."""

    model: str
    requires: list[Requirement]
    options: dict[str, Any]

    def run(self, progress: Callable[[str, int, int], None] | None = None) -> CheckReport:
        """:func:`run_check` with these settings; ``progress(what, done, total)`` as diagnose's."""
        from .requirements import run_check

        shown = {} if progress is None else {"progress": progress}
        return run_check(self.model, self.requires, **shown, **self.options)


def check_settings(
    model: str | None = None,
    *,
    config: str | Path | None = None,
    requires: list[str] | None = None,
    baseline: str | Path | None = None,
    max_regression: float | None = None,
    **diagnose_options: Any,
) -> CheckSettings:
    """The settings of ``ssacli check``: those given (not None, not False) over the ``[check]`` table
    of ``config`` (None: ./ssacli.toml when it exists), over the defaults. Requirements are parsed
    here, so a bad one fails before any model loads; none at all is a UsageError, as are a
    ``max_regression`` the gate cannot apply and a baseline that is not a result. So is a
    ./ssacli.toml found implicitly whose ``model`` is another model than ``model``: its thresholds,
    baseline and probe settings were measured on that model (``config=`` applies them anyway; even
    ``requires`` does not, since the file's baseline and settings would still apply)."""
    implicit = config is None and Path(CONFIG_FILE).is_file()
    if implicit:
        config = Path(CONFIG_FILE)
    settings: dict[str, Any] = load_config(config) if config is not None else {}
    foreign = implicit and model and "model" in settings and not same_model(model, settings["model"])
    if foreign:
        raise UsageError(
            f"./{CONFIG_FILE} is for model '{settings['model']}', not '{model}' (its thresholds were "
            f"measured on that model): pass --config {CONFIG_FILE} to apply them to '{model}' anyway, "
            f"or write its own with `ssacli check {model} --init --config FILE` and check with "
            "--config FILE"
        )
    flags = {"requires": requires or None, "baseline": baseline, "max_regression": max_regression}
    given = {**flags, **diagnose_options}
    settings.update({k: v for k, v in given.items() if v is not None and v is not False})
    chosen = model or settings.get("model", DEFAULT_MODEL)
    settings.pop("model", None)
    parsed = [parse_requirement(r) for r in settings.pop("requires", [])]
    if not parsed:
        where = f"'{config}' lists none under [check] requires" if config else f"no {CONFIG_FILE} here"
        raise UsageError(
            f"no requirements ({where}); pass --require EXPR or write one with `ssacli check --init`"
        )
    for key in ("tau", "max_regression"):
        if key in settings:
            settings[key] = float(settings[key])
    baseline = settings.get("baseline")
    check_regression_gate(settings.get("max_regression"), baseline)
    if isinstance(baseline, str | Path):
        read_baseline(baseline)  # there and a result: before any model loads
    return CheckSettings(chosen, parsed, settings)
