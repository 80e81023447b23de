"""The verdict a diagnose report opens with: one line per probe, the most severe first.

:func:`probe_verdicts` reads a result into :class:`Verdict` s, one per probe, each with a ``kind``,
the ``line`` a report prints and a ``severity`` (lower is worse) that orders them:

* ``saturates`` / ``overflow`` (0): "saturates at σ=100 (collapse point)", "overflow at σ=1e+30 (…)":
  the model failed under the probe;
* ``absorbed`` / ``n/a`` / ``skipped`` (1): the probe could not test the model: "absorbed by
  model.layers.0.input_layernorm — this probe cannot test this model; use key-scale" (its shift did not
  arrive: :meth:`~ssacli.diagnosis.probe_result.ProbeResult.reached`), "n/a (scorer cannot respond)";
  a probe absorbed before attention whose outputs broke all the same (through the residual stream) is
  ``outputs broke`` (0) instead: "absorbed" never hides a broken model;
* ``robust`` (2): "robust up to σ=32 (shift reached ×31.6)": no collapse up to the top level, with the
  shift measured where the probe acts (the least over layers).

The kinds are decided in one place, :func:`verdict_of`, in the order of
:meth:`~ssacli.diagnosis.probe_result.ProbeResult.collapse_status` (overflow before a later collapse
point, a collapse point before reach), so that a state read from the model's outputs (a degenerate
model, outputs that broke) is one more branch there and one more entry of :data:`SEVERITY`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .findings import absorbed_text, level_text, residual_text, shift_text
from .outputs import (
    OUTPUT_KL_HELD,
    ROBUST_COLLAPSE,
    level_output_kl,
    outputs_broke_at,
    partly_collapsed_at,
    robust_index,
)
from .probe_result import ProbeResult

# Lower is more severe; the verdict block lists severity 0 first. States that read the model's
# outputs (degenerate, outputs broke) belong with 0: the model failed, whatever its attention did.
SEVERITY = {"saturates": 0, "overflow": 0, "degenerate": 0, "outputs broke": 0, "absorbed": 1, "n/a": 1,
            "partly collapses": 1, "skipped": 1, "robust": 2, "no collapse": 2}  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    probe: str
    kind: str  # a key of SEVERITY
    line: str  # what the report prints after the probe's name
    level: float | None = None  # the level the line names (collapse point, overflow, top robust level)

    @property
    def severity(self) -> int:
        return SEVERITY[self.kind]

    @property
    def text(self) -> str:
        return f"{self.probe}: {self.line}"

    @property
    def tone(self) -> str:
        """How a report colours it: "failed" (severity 0), "untested" (severity 1), "held" (robust)
        or "unconfirmed" (no collapse, but the outputs were not measured: attention held, nothing
        says the model did, so it is not coloured like a pass)."""
        if self.kind == "no collapse":
            return "unconfirmed"
        return {0: "failed", 1: "untested"}.get(self.severity, "held")


def verdict_of(probe: ProbeResult, broken: dict | None = None) -> Verdict:
    """One probe's verdict (see the module docstring); ``broken``: why the model is degenerate
    (:func:`ssacli.diagnosis.outputs.degenerate`), which no probe can read as robust."""
    name = probe.name
    if probe.skipped:
        return Verdict(name, "skipped", f"skipped: {probe.note or 'no countable rows'}")
    if probe.insensitive:
        return Verdict(name, "n/a", "n/a (scorer cannot respond)")
    point, flow = probe.collapse_point(), probe.first_overflow()
    if flow is not None and (point is None or flow[0] <= point):
        level, where = flow
        at = f"layer {where['layer']}: " if where.get("layer") is not None else ""
        return Verdict(
            name, "overflow", f"overflow at {level_text(probe, level)} ({at}{where.get('where')})", level
        )
    if point is not None:
        return Verdict(name, "saturates", f"saturates at {level_text(probe, point)} (collapse point)", point)
    broke = outputs_broke_at(probe)
    if probe.reached() is False:
        if broke is not None:  # "absorbed" never hides a model whose outputs broke anyway
            return _broke(probe, broke, f" {residual_text(probe)}")
        return Verdict(name, "absorbed", absorbed_text(probe))
    top = len(probe.levels) - 1
    if broken is not None:  # no collapse in a degenerate model is no robustness (outputs.py's rule)
        return Verdict(name, "degenerate", f"degenerate, not robust: {broken['text']}")
    if broke is not None:
        return _broke(probe, broke)
    partly = partly_collapsed_at(probe)
    if partly is not None:  # more than ROBUST_COLLAPSE of the rows, short of the collapse point
        worst = float(max(r for r in probe.fresh_collapse_rate() if r == r))
        at = probe.levels[partly]
        line = (f"partly collapses from {level_text(probe, at)} (up to {worst:.0%} of the rows > "
                f"{ROBUST_COLLAPSE:.0%}; no collapse point)")  # fmt: skip
        return Verdict(name, "partly collapses", line, at)
    if robust_index(probe) != top:  # outputs not measured: no collapse, but not called robust
        return Verdict(name, "no collapse", f"no collapse up to {level_text(probe, probe.levels[top])} "
                       "(outputs not measured, so not called robust)", probe.levels[top])  # fmt: skip
    shift = shift_text(probe, top) if probe.reached() else None
    if shift is not None:
        how = f"shift reached {shift}"
    elif probe.kind is not None and probe.kind.magnitude:
        how = "shift not measured"
    else:
        how = "no collapse"
    return Verdict(
        name, "robust", f"robust up to {level_text(probe, probe.levels[top])} ({how})", probe.levels[top]
    )


def _broke(probe: ProbeResult, index: int, how_far: str = "") -> Verdict:
    """ "outputs broke at LEVEL (KL … > 0.1)", then ``how_far`` (the path the shift took)."""
    kl = level_output_kl(probe)[index]
    how = "task error" if kl is None else f"KL {kl:.3g} nats/token to the unshifted run > {OUTPUT_KL_HELD:g}"
    at = probe.levels[index]
    line = f"outputs broke at {level_text(probe, at)} ({how}){how_far}"
    return Verdict(probe.name, "outputs broke", line, at)


def probe_verdicts(result) -> list[Verdict]:
    """Every probe's verdict, most severe first (ties: the order the probes ran in). ``result``: a
    :class:`~ssacli.diagnosis.result.DiagnoseResult`, or any sequence of probe results."""
    probes: Sequence[ProbeResult] = getattr(result, "probes", result)
    broken = result.degenerate() if hasattr(result, "degenerate") else None
    verdicts = [verdict_of(probe, broken) for probe in probes]
    return sorted(verdicts, key=lambda v: v.severity)


def paired_verdicts(a, b) -> list[tuple[str, Verdict | None, Verdict | None]]:
    """A comparison's verdict: per probe that either result ran, A's and B's verdict (None where
    one did not run it), the pair whose worse side is most severe first (ties: A's order, then B's)."""
    by_a = {v.probe: v for v in probe_verdicts(a)}
    by_b = {v.probe: v for v in probe_verdicts(b)}
    names = [p.name for p in a.probes] + [p.name for p in b.probes if p.name not in by_a]
    pairs = [(name, by_a.get(name), by_b.get(name)) for name in names]
    return sorted(pairs, key=lambda p: min(v.severity for v in p[1:] if v is not None))
