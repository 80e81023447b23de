"""The requirement expressions of ``ssacli check``: parsing one line into a :class:`Requirement`
and evaluating it on a diagnose result (with a baseline, as a regression gate too).

    METRIC@PROBE:LEVEL[layer=A-B,head=H] [mean|max|min] OP VALUE

Grammar and examples in docs/ci.md. Running a check (the diagnose it needs, the baseline, the report
and its JUnit/JSON) is :mod:`ssacli.check.requirements`.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..diagnosis.metrics import METRICS, QUALITY_METRICS, metric_spec
from ..diagnosis.probe_kinds import PROBES, parse_probe
from ..errors import UsageError

if TYPE_CHECKING:  # parsing is torch-free (a bad requirement is refused before the model stack)
    from ..diagnosis.result import DiagnoseResult

EXAMPLE = "collapse_rate@outlier:100[layer=0-1] max <= 0.2"
AGGREGATES = ("mean", "max", "min")
_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
        "==": lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)}  # fmt: skip
_NEGATED = {"<=": ">", "<": ">=", ">=": "<", ">": "<=", "==": "!="}
# Longest first, and the common mistakes too, so that they get a message rather than a misparse.
_OP_RE = re.compile(r"<=|>=|==|!=|=<|=>|<|>|=")
_LHS_RE = re.compile(r"^(?P<target>[^\[\]\s]+)\s*(?:\[(?P<sel>[^\]]*)\])?\s*(?P<agg>[A-Za-z_]\w*)?$")
_RANGE_RE = re.compile(r"^(\d+)(?:\s*-\s*(\d+))?$")


def _bad(text: str, problem: str) -> UsageError:
    return UsageError(f"requirement {text!r}: {problem} (e.g. '{EXAMPLE}')")


@dataclass(frozen=True)
class Outcome:
    """One requirement measured on one run. ``measured`` is NaN when the run leaves it undefined."""

    passed: bool
    measured: float
    message: str
    baseline: float | None = None  # the same quantity in the baseline run, when there is one


@dataclass(frozen=True)
class Requirement:
    """One parsed requirement; ``text`` is kept verbatim because reports and JUnit name it so."""

    text: str
    metric: str
    probe: str
    level: float
    op: str
    value: float
    aggregate: str = "mean"
    layers: tuple[int, int] | None = None  # inclusive index ranges; None = all
    heads: tuple[int, int] | None = None

    def __str__(self) -> str:
        return self.text

    @property
    def direction(self) -> str:
        """Which way the metric moves as attention saturates (or, for loss and output_kl, as the
        outputs degrade): high, low (none for row_mass)."""
        return metric_spec(self.metric).direction

    def measure(self, result: DiagnoseResult) -> float:
        """The aggregate over the selected heads at this level (NaN where every head is undefined).
        A run that lacks the probe, the level or the selected layers/heads is a usage error: the
        requirement does not fit the run, which says nothing about the model."""
        try:
            probe = result.probe(self.probe)
        except KeyError:
            raise UsageError(f"requirement '{self.text}': the run has no probe '{self.probe}'") from None
        index = next((i for i, lv in enumerate(probe.levels) if math.isclose(lv, self.level)), None)
        if index is None:
            have = ", ".join(f"{v:g}" for v in probe.levels)
            raise UsageError(
                f"requirement '{self.text}': level {self.level:g} was not measured (have {have})"
            )
        if self.metric in QUALITY_METRICS:  # one number per level: no heads to select
            from ..diagnosis.outputs import quality_values

            value = quality_values(probe, self.metric)[index]
            return math.nan if value is None else float(value)
        if self.metric not in probe.metrics:
            return math.nan
        values = self._selected(probe, index)
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            return math.nan
        return float({"mean": np.mean, "max": np.max, "min": np.min}[self.aggregate](finite))

    def _index(self, probe) -> int | None:
        return next((i for i, lv in enumerate(probe.levels) if math.isclose(lv, self.level)), None)

    def _selected(self, probe, index: int) -> np.ndarray:
        values = probe.metrics[self.metric][index]  # [layer, head]
        values = values[_pick(self.layers, values.shape[0], "layer", self.text)]
        return values[:, _pick(self.heads, values.shape[1], "head", self.text)]

    def worst_head(self, result: DiagnoseResult) -> tuple[int, int, float] | None:
        """(layer, head, value) of the selected head furthest past the bound at this level: the largest
        for ``<=`` / ``<``, the smallest for ``>=`` / ``>``, the most saturated for ``==`` (None if
        undefined). The bound's direction decides, not the metric's: an upper bound on entropy fails
        on the most uniform head, not on the most saturated one."""
        probe = result.probe(self.probe)
        index = self._index(probe)
        if index is None or self.metric not in probe.metrics:  # quality metrics have no heads
            return None
        values = self._selected(probe, index)
        if not np.isfinite(values).any():
            return None
        if self.op in ("<=", "<"):
            sign = 1.0
        elif self.op in (">=", ">"):
            sign = -1.0
        else:
            sign = -1.0 if self.direction == "low" else 1.0
        flat = int(np.nanargmax(np.where(np.isfinite(values), sign * values, -np.inf)))
        layer, head = np.unravel_index(flat, values.shape)
        layer0 = self.layers[0] if self.layers else 0
        head0 = self.heads[0] if self.heads else 0
        return int(layer) + layer0, int(head) + head0, float(values[layer, head])

    def evaluate(
        self,
        result: DiagnoseResult,
        baseline: DiagnoseResult | None = None,
        max_regression: float | None = None,
    ) -> Outcome:
        """Pass when the threshold holds and, with a baseline and ``max_regression``, the metric has
        not moved towards saturation by more than that (absolute). An undefined value fails: a gate
        that cannot be measured must not pass silently."""
        measured = self.measure(result)
        probe = result.probe(self.probe)
        flow = probe.overflowed(self._index(probe))
        if flow:
            layer = flow.get("layer")
            at = f"layer {layer} ({flow.get('where')})" if layer is not None else str(flow.get("where"))
            return Outcome(
                False, math.nan,
                f"overflow: {self.probe}:{self.level:g} made the forward non-finite (first at {at}); "
                "the level measures nothing",
            )  # fmt: skip
        if not math.isfinite(measured):
            note = result.probe(self.probe).note
            why = f": {note}" if note else " (no counted rows in the selected heads)"
            return Outcome(False, math.nan, f"undefined: {self.probe} left {self.metric} unmeasured{why}")
        passed = _OPS[self.op](measured, self.value)
        shown = f"measured {measured:.4g} {self.op if passed else _NEGATED[self.op]} {self.value:g}"
        parts = [shown if passed else f"{shown} (required {self.op} {self.value:g})"]
        if not passed:
            worst = self.worst_head(result)
            if worst is not None:
                parts.append(f"worst: layer {worst[0]} head {worst[1]} = {worst[2]:.4g}")
        before = None
        if baseline is not None:
            before, note = self._baseline_value(baseline)
            if before is None:
                parts.append(note)
            else:
                moved = (measured - before) * {"high": 1, "low": -1}.get(self.direction, 0)
                delta = f"{measured - before:+.4g} vs baseline {before:.4g}"
                if self.direction == "none":
                    parts.append(f"{delta} ({self.metric} has no saturating direction)")
                elif max_regression is not None and moved > max_regression:
                    passed = False
                    toward = "up" if self.direction == "high" else "down"
                    parts.append(
                        f"regressed {delta}: more than {max_regression:g} towards saturation "
                        f"({self.metric} saturates {toward})"
                    )
                else:
                    limit = f", within {max_regression:g}" if max_regression is not None else ""
                    parts.append(f"{delta}{limit}")
        return Outcome(passed, measured, "; ".join(parts), before)

    def _baseline_value(self, baseline: DiagnoseResult) -> tuple[float | None, str]:
        try:
            value = self.measure(baseline)
        except UsageError:
            return None, f"not compared: the baseline did not measure {self.probe}:{self.level:g}"
        if not math.isfinite(value):
            return None, "not compared: undefined in the baseline"
        return value, ""


def _pick(span: tuple[int, int] | None, size: int, what: str, text: str) -> slice:
    if span is None:
        return slice(None)
    if span[1] >= size:
        raise UsageError(f"requirement '{text}': {what} {span[1]} is out of range (0-{size - 1} here)")
    return slice(span[0], span[1] + 1)


def parse_requirement(text: str) -> Requirement:
    """Parse one requirement; every problem is a UsageError naming the expression and an example."""
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "empty requirement")
    source = text.strip()
    masked = re.sub(r"\[[^\]]*\]", lambda m: "#" * len(m.group()), source)  # '=' inside [...] is no op
    ops = list(_OP_RE.finditer(masked))
    if not ops:
        raise _bad(source, "no comparison; use one of <=, <, >=, >, ==")
    if len(ops) > 1:
        raise _bad(source, "more than one comparison")
    op = ops[0].group()
    if op not in _OPS:
        fix = {"=": "==", "=<": "<=", "=>": ">="}.get(op)
        raise _bad(source, f"'{op}' is not a comparison; use {fix}" if fix else f"'{op}' is not supported")
    lhs, rhs = source[: ops[0].start()].strip(), source[ops[0].end() :].strip()
    try:
        value = float(rhs)
    except ValueError:
        raise _bad(source, f"the threshold {rhs!r} is not a number" if rhs else "no threshold") from None
    if not math.isfinite(value):
        raise _bad(source, "the threshold must be finite")
    match = _LHS_RE.match(lhs)
    if match is None:
        raise _bad(source, "expected METRIC@PROBE:LEVEL[SELECTOR] [mean|max|min] OP VALUE")
    target, selector, aggregate = match.group("target", "sel", "agg")
    metric, at, rest = target.partition("@")
    if not at:
        raise _bad(source, "name the probe after the metric: METRIC@PROBE:LEVEL")
    if metric not in METRICS and metric not in QUALITY_METRICS:
        raise _bad(
            source, f"unknown metric '{metric}'; choose from: {', '.join([*METRICS, *QUALITY_METRICS])}"
        )
    probe, colon, raw_level = rest.partition(":")
    if probe not in PROBES:
        raise _bad(source, f"unknown probe '{probe}'; choose from: {', '.join(PROBES)}")
    if not colon or not raw_level:
        levels = ",".join(f"{v:g}" for v in PROBES[probe].defaults)
        raise _bad(source, f"give one level of {probe} after a colon (its default levels: {levels})")
    if metric == "outlier_capture" and not PROBES[probe].has_target:
        with_target = ", ".join(k.name for k in PROBES.values() if k.has_target)
        raise _bad(source, f"outlier_capture needs a probe with a target token: {with_target}")
    if "," in raw_level:
        raise _bad(source, "one level per requirement; write one requirement per level")
    try:
        (level,) = parse_probe(f"{probe}:{raw_level}").levels
    except UsageError as err:
        raise _bad(source, str(err)) from None
    if metric in QUALITY_METRICS and (selector is not None or aggregate not in (None, "mean")):
        raise _bad(source, f"{metric} is one number per probe level: no [layer/head] selector or max/min")
    aggregate = aggregate or "mean"
    if aggregate not in AGGREGATES:
        raise _bad(source, f"unknown aggregate '{aggregate}'; choose from: {', '.join(AGGREGATES)}")
    spans = _selector(source, selector) if selector is not None else {}
    return Requirement(
        source, metric, probe, level, op, value, aggregate, spans.get("layer"), spans.get("head")
    )


def _selector(source: str, selector: str) -> dict[str, tuple[int, int]]:
    spans: dict[str, tuple[int, int]] = {}
    for item in (part.strip() for part in selector.split(",")):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if key not in ("layer", "head") or not eq:
            raise _bad(source, f"selector item {item!r}: write layer=N, layer=A-B, head=N or head=A-B")
        if key in spans:
            raise _bad(source, f"'{key}' is selected twice")
        found = _RANGE_RE.match(raw)
        if found is None:
            raise _bad(source, f"{key}={raw!r}: give an index (0-based) or a range A-B")
        low, high = int(found.group(1)), int(found.group(2) or found.group(1))
        if high < low:
            raise _bad(source, f"{key}={raw}: the range is empty")
        spans[key] = (low, high)
    return spans


def required_probes(requirements: list[Requirement]) -> list[str]:
    """The minimal ``--probe`` set: each probe once, with exactly the levels the requirements name;
    an ``output_kl`` requirement adds its probe's neutral level (the KL is to that, unshifted, run)."""
    levels: dict[str, set[float]] = {}
    for req in requirements:
        levels.setdefault(req.probe, set()).add(req.level)
        neutral = PROBES[req.probe].neutral
        if req.metric == "output_kl" and neutral is not None:
            levels[req.probe].add(float(neutral))
    return [f"{name}:{','.join(f'{v:g}' for v in sorted(levels[name]))}" for name in PROBES if name in levels]
