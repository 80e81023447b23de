"""``before_report`` / ``--reuse-before``: an earlier report's BEFORE measurements and probes reused
instead of measured again, once it is a report of the same BEFORE (name and weights), measured with
the same settings on the same inputs; anything else is a UsageError that says what differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..models.identity import difference
from ..models.loading import LoadedModel
from .result import REPORT_SCHEMA, QualityReport, read_report


def reusable_report(report: QualityReport | dict[str, Any] | str | Path | None, names: dict[str, str | None]):
    """``before_report`` as its JSON document (read when a path), once the input files it was
    measured on are the ones given (the rest is :func:`check_reusable`'s, once BEFORE is loaded)."""
    if report is None:
        return None
    if isinstance(report, QualityReport):
        report = report.to_dict()
    elif isinstance(report, str | Path):
        report = read_report(report)
    recorded = report.get("settings", {})
    for key in ("text_id", "text_ood", "pairs"):
        if recorded.get(key) != names.get(key):
            raise UsageError(
                f"--reuse-before: the report's {key} is {recorded.get(key)!r}, not {names.get(key)}"
            )
    return report


def check_reusable(
    report: dict[str, Any], name: str, settings: dict[str, Any], text_id, text_ood, groups,
    text_builtin=None,
) -> None:  # fmt: skip
    """UsageError unless ``report`` measured BEFORE ``name`` with the same settings and inputs."""
    if report.get("schema") != REPORT_SCHEMA or report.get("before", {}).get("model") != name:
        raise UsageError(f"--reuse-before: the report is not one of BEFORE {name}")
    recorded = report.get("settings", {})
    differ = [k for k, v in settings.items() if recorded.get(k) != v]
    measured = report.get("measurements", {}).get("before", {})
    given_inputs = (("lm_id", text_id), ("lm_ood", text_ood), ("lm_builtin", text_builtin), ("pairs", groups))
    for key, given in given_inputs:
        if (given is not None) != (key in measured):
            differ.append(key)
    if differ:
        raise UsageError(f"--reuse-before: the report was measured with other settings ({', '.join(differ)})")


def reused_before(earlier: dict[str, Any], loaded: LoadedModel) -> tuple[dict[str, Any], Any]:
    """An earlier report's BEFORE measurements and probes, once its weights are ``loaded``'s."""
    from ..diagnosis.result import DiagnoseResult

    other = difference(earlier.get("before", {}).get("weights"), loaded.weights, "the report")
    if other is not None:  # the same name, other weights: its measurements are not BEFORE's
        raise UsageError(f"--reuse-before: {other}; measure BEFORE again (drop --reuse-before)")
    return earlier["measurements"]["before"], DiagnoseResult.from_dict(earlier["diagnose"]["a"])
