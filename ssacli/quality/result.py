"""What :func:`ssacli.compare_models` returns: :class:`QualityReport`, the ``ssacli report``
document as a typed value, with :meth:`QualityReport.to_dict` its JSON (schema ``ssacli-report``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..display import Displayed
from ..documents import REPORT_SCHEMA
from ..errors import UsageError

REPORT_VERSION = 1  # still 1 with a CONTROL: its keys are additions a version-1 reader may ignore


@dataclass
class QualityReport(Displayed):  # Displayed: _repr_html_ and plot(kind) in a notebook (ssacli/display.py)
    """BEFORE vs AFTER: every quality measure that applies to both models and the probe comparison.

    ``before`` / ``after``: model, family, kind and scorer of each side; ``settings``: what was
    measured with (the input files by name: ``text_id``, ``text_ood``, ``pairs``); ``quality``: one
    row per measure both sides have (:func:`~ssacli.quality.compare.quality_rows`);
    ``measurements``: each side's measures in full; ``diagnose``: the probes of both
    (:func:`~ssacli.diagnosis.comparison.compare_results`); ``notes``; ``conversion``: what each
    side's ssacli.json says about how it was made; ``versions``; ``elapsed_s``; ``lm_eval``: the
    lm-evaluation-harness rows when tasks were run (else None, and absent from :meth:`to_dict`).

    With a third model, CONTROL (``ssacli report BEFORE AFTER CONTROL``): ``control`` (its model,
    family, kind and scorer; written after ``after``) and ``diagnose_control`` (the probes of CONTROL
    as A and AFTER as B; written after ``diagnose``), with ``measurements["control"]``,
    ``conversion["control"]``, the quality rows' ``control`` and ``delta_control`` (AFTER − CONTROL)
    and ``lm_eval["control_rows"]``. Without one these are None and absent: the document is the
    two-model one, key for key (``schema_version`` stays 1)."""

    before: dict[str, Any]
    after: dict[str, Any]
    settings: dict[str, Any]
    quality: list[dict[str, Any]]
    measurements: dict[str, dict[str, Any]]
    diagnose: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    conversion: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    lm_eval: dict[str, Any] | None = None
    control: dict[str, Any] | None = None
    diagnose_control: dict[str, Any] | None = None
    decision: dict[str, Any] | None = None  # with a CONTROL: ssacli.quality.decision's block

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``ssacli report --json``), every key in the order it has always had;
        a CONTROL's ``control`` follows ``after``, its ``diagnose_control`` follows ``diagnose``."""
        data: dict[str, Any] = {"schema": REPORT_SCHEMA, "schema_version": REPORT_VERSION}
        # written after these when set: a CONTROL's side, its decision, its probes
        optional = {"after": ("control", "decision"), "diagnose": ("diagnose_control",)}
        for f in fields(self):
            if f.name in ("lm_eval", *(k for keys in optional.values() for k in keys)):
                continue
            data[f.name] = getattr(self, f.name)
            for extra in optional.get(f.name, ()):
                if getattr(self, extra) is not None:
                    data[extra] = getattr(self, extra)
        if self.lm_eval is not None:
            data["lm_eval"] = self.lm_eval
        return data


def read_report(path: str | Path) -> dict[str, Any]:
    """An earlier ``--json`` report, as its JSON document (``--reuse-before``); UsageError when the
    file is not readable JSON. Whether it is a report of the same BEFORE, measured with the same
    settings, is :func:`~ssacli.quality.reuse.check_reusable`'s."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"--reuse-before {path}: not a readable JSON report ({err})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--reuse-before {path}: not a readable JSON report (not a JSON object)")
    return data


__all__ = ["REPORT_SCHEMA", "REPORT_VERSION", "QualityReport", "read_report"]
