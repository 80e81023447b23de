"""`ssacli check`: attention-saturation requirements that a model must meet, for CI gates.

A requirement is one line (grammar and examples in docs/ci.md)::

    METRIC@PROBE:LEVEL[layer=A-B,head=H] [mean|max|min] OP VALUE
    collapse_rate@outlier:100 max <= 0.2      # no head collapses in more than 20 % of its rows
    entropy@embed-scale:16 >= 0.3             # mean over every head (the diagnose model mean)

Requirements name the probe levels they need, so a check runs only those levels, not every probe.
A baseline (an earlier ``diagnose --json`` or ``check --json`` file) turns each requirement into a
regression gate too: the metric may not move towards saturation by more than ``max_regression``.

One requirement, parsed and evaluated, is :mod:`ssacli.check.expressions`; this module runs a check:
the baseline, the diagnose of the levels the requirements name, the report and its JUnit/JSON.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..diagnosis.probe_result import json_ready
from ..diagnosis.result import DiagnoseResult
from ..display import Displayed
from ..documents import CHECK_SCHEMA as SCHEMA
from ..errors import InputError, UsageError
from ..models.identity import difference
from . import JUNIT_SUITE
from .baseline import check_regression_gate, read_baseline
from .expressions import Outcome, Requirement, parse_requirement, required_probes

SCHEMA_VERSION = 1
SETTINGS_COMPARED = ("seed", "samples", "length", "tau", "top_k", "inputs")


def load_baseline(path: str | Path) -> DiagnoseResult:
    """A ``diagnose --json`` result, or a ``check --json`` file (its embedded result)."""
    data = read_baseline(path)
    try:
        return DiagnoseResult.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"baseline '{path}' is malformed ({err!r}); re-create it") from None


# ---- a whole check ---------------------------------------------------------------------------------


@dataclass
class CheckReport(Displayed):  # Displayed: _repr_html_ and plot(kind) in a notebook (ssacli/display.py)
    model: str
    requirements: list[Requirement]
    outcomes: list[Outcome]
    result: DiagnoseResult
    baseline_file: str | None = None
    max_regression: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)

    @property
    def failures(self) -> int:
        return sum(not o.passed for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document; its ``result`` makes the file usable as the next baseline."""
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "passed": self.passed,
            "baseline_file": self.baseline_file,
            "max_regression": self.max_regression,
            "warnings": list(self.warnings),
            "requirements": [
                {
                    "expr": r.text,
                    "passed": o.passed,
                    "measured": json_ready(o.measured),
                    "baseline": json_ready(o.baseline),
                    "message": o.message,
                }
                for r, o in zip(self.requirements, self.outcomes)
            ],
            "result": self.result.to_dict(),
        }

    def junit_xml(self) -> str:
        """One <testsuite> with one <testcase> per requirement, as CI test-report viewers read it."""
        suite = ET.Element("testsuite", name=JUNIT_SUITE, tests=str(len(self.outcomes)),
                           failures=str(self.failures), errors="0", skipped="0",
                           time=f"{self.result.elapsed_s:.3f}")  # fmt: skip
        props = ET.SubElement(suite, "properties")
        for key in ("model", "baseline_file", "max_regression"):
            value = getattr(self, key)
            ET.SubElement(props, "property", name=key, value="" if value is None else str(value))
        for req, out in zip(self.requirements, self.outcomes):
            case = ET.SubElement(suite, "testcase", name=req.text, classname=self.model, time="0")
            if not out.passed:
                failure = ET.SubElement(case, "failure", message=out.message, type="RequirementFailed")
                failure.text = f"{req.text}\n{out.message}"
            base = "" if out.baseline is None else f" baseline={out.baseline:.6g}"
            ET.SubElement(case, "system-out").text = f"measured={out.measured:.6g}{base}\n{out.message}"
        ET.indent(suite)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def run_check(
    model: str,
    requires: list[str | Requirement],
    *,
    baseline: str | Path | DiagnoseResult | None = None,
    max_regression: float | None = None,
    **diagnose_options: Any,
) -> CheckReport:
    """Parse ``requires``, diagnose ``model`` on just the probe levels they name, and evaluate them.
    Everything cheap (expressions, baseline file) is checked before the model loads. The other
    keywords (``trust_remote_code`` included) are :func:`ssacli.diagnose`'s."""
    from ..diagnosis.run import diagnose

    reqs = [r if isinstance(r, Requirement) else parse_requirement(r) for r in requires]
    if not reqs:
        raise UsageError(
            "no requirements: pass --require EXPR or list them in ssacli.toml (ssacli check --init)"
        )
    check_regression_gate(max_regression, baseline)
    base = load_baseline(baseline) if isinstance(baseline, str | Path) else baseline
    result = diagnose(model, required_probes(reqs), **diagnose_options)
    outcomes = [r.evaluate(result, base, max_regression) for r in reqs]
    warnings = [f"unaudited: {result.unaudited}"] if result.unaudited else []
    broken = result.degenerate()  # a verdict no threshold can hide: the JSON and the table say it
    if broken is not None:
        warnings.append(f"degenerate: {broken['text']}")
    if base is not None:
        other_weights = difference(base.weights, result.weights)  # a warning: a new commit may be the point
        if other_weights is not None:
            warnings.append(other_weights)
        for key in SETTINGS_COMPARED:
            now, then = result.settings.get(key), base.settings.get(key)
            if now != then:
                warnings.append(f"the baseline ran with {key}={then}, this run with {key}={now}")
    label = str(baseline) if isinstance(baseline, str | Path) else (None if base is None else base.model)
    return CheckReport(str(model), reqs, outcomes, result, label, max_regression, warnings)
