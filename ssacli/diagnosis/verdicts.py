"""The verdict a diagnose report opens with: one line per probe, those that tested attention first.

:func:`probe_verdicts` reads a result into :class:`Verdict` s, one per probe, each with a ``kind``,
the ``line`` a report prints and a ``severity`` (lower is worse) that orders them:

* ``saturates`` / ``overflow`` (0): "saturates at σ=100 (collapse point)", "overflow at σ=1e+30 (…)":
  the model failed under the probe;
* ``absorbed`` / ``n/a`` / ``skipped`` (1): the probe could not test the model: "absorbed by
  model.layers.0.input_layernorm — this probe cannot test this model; use key-scale" (its shift did not
  arrive: :meth:`~ssacli.diagnosis.probe_result.ProbeResult.reached`), "n/a (scorer cannot respond)";
  a probe absorbed before attention whose outputs broke all the same (through the residual stream) is
  ``outputs broke`` (0) instead: "absorbed" never hides a broken model;
* ``partly collapses`` (1): the collapse rate rose more than ROBUST_COLLAPSE over the unshifted level,
  beyond its prompt-to-prompt noise (:func:`~ssacli.diagnosis.outputs.collapse_change`), short of the
  collapse point;
* ``robust`` (2): "robust up to σ=32 (shift reached ×31.6)": no rise in collapse beyond the noise up to
  the top level (or one within ROBUST_COLLAPSE), outputs held, with the shift measured where the probe
  acts (the least over layers); ``no collapse`` / ``collapse falls`` (2): the same without measured
  outputs, the second where collapse falls below the unshifted level with the shift (not a failure).

Every collapse a line names is a change from the same model's unshifted level: what collapses before
any shift is the baseline's own finding (:mod:`ssacli.diagnosis.findings`), never the probe's effect.

The kinds are decided in one place, :func:`verdict_of`, in the order of
:meth:`~ssacli.diagnosis.probe_result.ProbeResult.collapse_status` (overflow before a later collapse
point, a collapse point before reach), so that a state read from the model's outputs (a degenerate
model, outputs that broke) is one more branch there and one more entry of :data:`SEVERITY`.

Order: the probes whose shift reached attention (and those that change the inputs: length, numeric)
come first, most severe first; then those that did not test attention (absorbed, n/a, skipped), most
severe first. A failure among the second (outputs that broke through the residual stream) keeps its
severity's colour, so it stays in sight without opening the verdict ahead of the probes that measured
attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .findings import absorbed_text, level_text, residual_text, shift_text
from .outputs import (
    OUTPUT_KL_HELD,
    ROBUST_COLLAPSE,
    CollapseChange,
    collapse_change,
    collapse_falls,
    level_output_kl,
    outputs_broke_at,
    partly_collapsed_at,
    robust_index,
)
from .probe_result import ProbeResult
from .shift import shift_damage_text

# Lower is more severe; the verdict block lists severity 0 first. States that read the model's
# outputs (degenerate, outputs broke) belong with 0: the model failed, whatever its attention did.
SEVERITY = {"saturates": 0, "overflow": 0, "degenerate": 0, "outputs broke": 0, "absorbed": 1, "n/a": 1,
            "partly collapses": 1, "skipped": 1, "robust": 2, "no collapse": 2,
            "collapse falls": 2}  # fmt: skip
# Kinds whose probe did not test attention (listed after those that did: the module docstring)
UNTESTED = ("absorbed", "n/a", "skipped")


@dataclass(frozen=True)
class Verdict:
    probe: str
    kind: str  # a key of SEVERITY
    line: str  # what the report prints after the probe's name
    level: float | None = None  # the level the line names (collapse point, overflow, top robust level)
    reached: bool = True  # the probe tested attention (False: absorbed before it, n/a or skipped)

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
        if self.kind in ("no collapse", "collapse falls"):
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
    if partly is not None:  # collapse rose more than ROBUST_COLLAPSE beyond its noise, short of the point
        changes = [collapse_change(probe, i) for i in range(len(probe.levels))]
        worst = max((c for c in changes if c.rises()), key=lambda c: c.change)
        at, ref = probe.levels[partly], level_text(probe, probe.levels[worst.reference])
        line = (f"partly collapses from {level_text(probe, at)} (collapse up to {worst.after:.0%}: "
                f"+{100 * worst.change:.1f} points over the unshifted {worst.before:.0%} at {ref}, > "
                f"{ROBUST_COLLAPSE:.0%}; {worst.noise_text()})")  # fmt: skip
        return Verdict(name, "partly collapses", line, at)
    falls = collapse_falls(probe)
    if robust_index(probe) != top:  # outputs not measured: no collapse, but not called robust
        upto = level_text(probe, probe.levels[top])
        if falls is not None:
            return Verdict(name, "collapse falls", f"{_falls_text(probe, falls)}; {_unheld(probe)}",
                           probe.levels[top])  # fmt: skip
        rise = _small_rise(probe)
        if rise is not None:  # a rise beyond the noise is a collapse, however small: said as measured
            line = f"collapse rises up to {upto} ({rise}) ({_unheld(probe)})"
            return Verdict(name, "no collapse", line, probe.levels[top])
        return Verdict(name, "no collapse", f"no collapse up to {upto}{_beyond(probe)} ({_unheld(probe)})",
                       probe.levels[top])  # fmt: skip
    shift = shift_text(probe, top) if probe.reached() else None
    if shift is not None:
        how = f"shift reached {shift}"
    elif probe.kind is not None and probe.kind.magnitude:
        how = "shift not measured"
    else:
        how = "no collapse"
    falls_text = "" if falls is None else f"; {_falls_text(probe, falls)}"
    rise = _small_rise(probe)
    rise_text = "" if rise is None else f"; collapse {rise}"
    line = f"robust up to {level_text(probe, probe.levels[top])} ({how}){falls_text}{rise_text}"
    return Verdict(name, "robust", line, probe.levels[top])


def _small_rise(probe: ProbeResult) -> str | None:
    """ "+3.7 points over the unshifted 8.3% at 0, under the 10% line; noise ±0.5 over 32 prompts":
    the largest rise of the fresh collapse rate beyond its noise that stays within ROBUST_COLLAPSE
    (a probe that passed the line partly collapses instead); None where collapse rose beyond the
    noise nowhere. Under natural shifts on SmolLM2-135M collapse rose +1.5 to +4.8 points beyond its
    noise (docs/results/saturation-matters.md): "no collapse" would have hidden a measured rise."""
    changes = [collapse_change(probe, i) for i in range(len(probe.levels))]
    small = [
        c for c in changes if 0 < c.change <= ROBUST_COLLAPSE and c.beyond_noise() and c.noise is not None
    ]
    if not small:
        return None
    worst = max(small, key=lambda c: c.change)
    ref = level_text(probe, probe.levels[worst.reference])
    return (f"+{100 * worst.change:.1f} points over the unshifted {worst.before:.0%} at {ref}, under the "
            f"{ROBUST_COLLAPSE:.0%} line; {worst.noise_text()}")  # fmt: skip


def _unheld(probe: ProbeResult) -> str:
    """Why a probe without a collapse is not called robust: its outputs were not measured, or (the
    shift probe: other tokens, no KL to compare) only its loss was, which mixes damage with the
    shifted text's own difficulty."""
    damage = shift_damage_text(probe)
    if damage is None:
        return "outputs not measured, so not called robust"
    return f"output damage {damage}, difficulty and damage together, so not called robust"


def _falls_text(probe: ProbeResult, falls: CollapseChange) -> str:
    """ "collapse falls with the shift (15.5% at ×1 → 14.2% at ×8; noise ±0.2 over 8 prompts)"."""
    top = max(i for i, r in enumerate(probe.fresh_collapse_rate()) if r == r)
    ref, at = (level_text(probe, probe.levels[i]) for i in (falls.reference, top))
    return (f"collapse falls with the shift ({100 * falls.before:.1f}% at {ref} → {100 * falls.after:.1f}% "
            f"at {at}; {falls.noise_text()})")  # fmt: skip


def _beyond(probe: ProbeResult) -> str:
    """ " beyond the unshifted 15%" where the unshifted level itself collapses more than
    ROBUST_COLLAPSE of the rows (its own finding), else nothing."""
    base = collapse_change(probe, 0)
    ref = level_text(probe, probe.levels[base.reference])
    return f" beyond the unshifted {base.before:.0%} at {ref}" if base.before > ROBUST_COLLAPSE else ""


def _broke(probe: ProbeResult, index: int, how_far: str = "") -> Verdict:
    """ "outputs broke at LEVEL (KL … > 0.1)", then ``how_far`` (the path the shift took)."""
    kl = level_output_kl(probe)[index]
    how = "task error" if kl is None else f"KL {kl:.3g} nats/token to the unshifted run > {OUTPUT_KL_HELD:g}"
    at = probe.levels[index]
    line = f"outputs broke at {level_text(probe, at)} ({how}){how_far}"
    return Verdict(probe.name, "outputs broke", line, at)


def probe_verdicts(result) -> list[Verdict]:
    """Every probe's verdict: those that tested attention first, each group most severe first (ties:
    the order the probes ran in; see the module docstring). ``result``: a
    :class:`~ssacli.diagnosis.result.DiagnoseResult`, or any sequence of probe results."""
    probes: Sequence[ProbeResult] = getattr(result, "probes", result)
    broken = result.degenerate() if hasattr(result, "degenerate") else None
    verdicts = [_tested(verdict_of(probe, broken), probe) for probe in probes]
    return sorted(verdicts, key=lambda v: (not v.reached, v.severity))


def _tested(verdict: Verdict, probe: ProbeResult) -> Verdict:
    """``verdict`` with :attr:`Verdict.reached` set: False where the shift was absorbed before attention
    (outputs broke through the residual stream included), n/a or skipped."""
    reached = verdict.kind not in UNTESTED and probe.reached() is not False
    return verdict if reached else replace(verdict, reached=False)


def paired_verdicts(a, b) -> list[tuple[str, Verdict | None, Verdict | None]]:
    """A comparison's verdict: per probe that either result ran, A's and B's verdict (None where
    one did not run it), in :func:`probe_verdicts`' order by the pair's worse side (tested attention on
    either side first, then the most severe; ties: A's order, then B's). Each line reads its own
    model's changes from its own unshifted level, so the pair compares what the shift did to each
    model, not where each model started."""
    by_a = {v.probe: v for v in probe_verdicts(a)}
    by_b = {v.probe: v for v in probe_verdicts(b)}
    names = [p.name for p in a.probes] + [p.name for p in b.probes if p.name not in by_a]
    pairs = [(name, by_a.get(name), by_b.get(name)) for name in names]

    def order(pair):
        sides = [v for v in pair[1:] if v is not None]
        return (not any(v.reached for v in sides), min(v.severity for v in sides))

    return sorted(pairs, key=order)
