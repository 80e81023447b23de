"""The decision block of ``ssacli report BEFORE AFTER CONTROL`` (``report["decision"]``): one entry
per question, AFTER against CONTROL with an interval over this run's windows or prompts
(:mod:`ssacli.quality.tradeoff`), and the rule's recommendation applied to them.

Questions, each where it was measured (else a note says why not):

* quality: perplexity in domain (``--text-id`` / ``--heldout-of``, else the built-in texts), out of
  domain (``--text-ood``), and at twice the window on the in-domain text where the model's positions
  allow (:func:`longer_window`);
* robustness: the output KL under each probe whose shift reached attention in both models, at the
  rule's level (σ = 8) where the probe has it, else its top level.
"""

from __future__ import annotations

from typing import Any

from ..diagnosis.result import DiagnoseResult
from ..stats import LEVEL
from .tradeoff import RULE_LEVEL, RULE_PROBE, apply_rule, change_interval, ratio_interval

LONG_FACTOR = 2  # the longer context: twice the report's window
NO_DIFFERENCE = "no difference shown"


def longer_window(max_positions: int | None, seq_len: int) -> int | None:
    """The longer context the decision measures, in tokens: twice the report's window (capped at the
    model's positions), where the model's positions hold it; None where they do not."""
    window = min(seq_len, max_positions or seq_len)
    longer = LONG_FACTOR * window
    return longer if max_positions is None or longer <= max_positions else None


def in_domain_key(measured: dict[str, Any]) -> str | None:
    """The text the decision reads as in-domain: ``lm_id`` where given, else the built-in texts."""
    return next((k for k in ("lm_id", "lm_builtin") if k in measured), None)


def conversion_decision(
    measured: dict[str, dict[str, Any]], after: DiagnoseResult, control: DiagnoseResult, seq_len: int
) -> dict[str, Any]:
    """The decision block (see the module docstring): ``questions`` (key, label, value, low, high,
    units, unit, reads), ``notes`` (what was not measured, and why) and ``rule`` (:func:`apply_rule`
    on the in-domain ratio and the output KL under key-scale σ = 8)."""
    a, c = measured["after"], measured["control"]
    questions, notes = [], []
    key = in_domain_key(c)
    labels = {"lm_id": "in-domain ppl", "lm_builtin": "built-in texts' ppl"}
    if key is None:
        notes.append("no quality measured: give --heldout-of DATA (or --text-id)")
    else:
        questions.append(_quality(key, labels[key], c, a))
    if key == "lm_builtin":  # the rule's quality is then read on general English, not the user's text
        notes.append("in-domain: the built-in texts stand in; --heldout-of DATA measures your own")
    if "lm_ood" in c and "lm_ood" in a:
        questions.append(_quality("lm_ood", "out-of-domain ppl", c, a))
    elif key is not None:
        notes.append("out-of-domain: not measured (--text-ood FILE)")
    long_key = f"{key}_long"
    if key is not None and long_key in c and long_key in a:
        questions.append(_quality(long_key, f"{c[long_key]['seq_len']}-token context ppl", c, a))
    elif key is not None:
        window = c[key].get("seq_len", seq_len)
        notes.append(f"longer context: not measured, the {window}-token windows already fill the model's "
                     "positions (a smaller --seq-len leaves room for 2×)")  # fmt: skip
    skipped = []
    for probe_a, probe_c in _paired_probes(after, control):
        if False in (probe_a.reached(), probe_c.reached()):
            skipped.append(probe_a.name)
            continue
        entry = _robustness(probe_c, probe_a)
        if entry is not None:
            questions.append(entry)
    if skipped:
        notes.append(f"not in the decision: {', '.join(skipped)} (the shift did not reach attention)")
    by_key = {q["key"]: q for q in questions}
    rule_key = f"output_kl.{RULE_PROBE}@{RULE_LEVEL:g}"
    rule = apply_rule(by_key.get(f"{key}"), by_key.get(rule_key))
    if RULE_PROBE in skipped:  # e.g. a norm on the keys: the rule's measure cannot apply
        rule["why"] = f"{RULE_PROBE}'s shift did not reach attention, so the rule's output KL does not apply"
    elif rule_key not in by_key:
        asked = f"{RULE_PROBE}:1,{RULE_LEVEL:g}"
        rule["why"] = f"no output KL under {RULE_PROBE} σ = {RULE_LEVEL:g} (--probe {asked})"
    rule.update(quality=key, robustness=rule_key)
    return {"level": LEVEL, "questions": questions, "notes": notes, "rule": rule}


def _quality(key: str, label: str, control: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    entry = {"key": key, "label": label, "kind": "ratio", **_empty()}
    found = ratio_interval(control[key], after[key])
    if found is not None:
        entry.update(found)
    entry["reads"] = _reads(entry, no_change=1.0)
    return entry


def _robustness(control, after) -> dict[str, Any] | None:
    """The output-KL entry of one probe (CONTROL's and AFTER's ProbeResult), at σ = 8 where the probe
    has that level, else its top level with per-prompt values on both sides."""
    a_rows, c_rows = after.per_input.get("output_kl") or [], control.per_input.get("output_kl") or []
    levels = [i for i, v in enumerate(after.levels) if i < min(len(a_rows), len(c_rows))
              and a_rows[i] and c_rows[i] and v != after.kind.neutral]  # fmt: skip
    if not levels:
        return None
    index = next((i for i in levels if after.levels[i] == RULE_LEVEL), levels[-1])
    level = after.levels[index]
    label = f"output KL {after.name} {after.kind.symbol}={level:g}"
    entry = {"key": f"output_kl.{after.name}@{level:g}", "label": label, "kind": "change",
             "probe": after.name, "level": level, **_empty()}  # fmt: skip
    found = change_interval(c_rows[index], a_rows[index])
    if found is not None:
        entry.update(found)
    entry["reads"] = _reads(entry, no_change=0.0)
    return entry


def _empty() -> dict[str, Any]:
    return {"value": None, "low": None, "high": None, "units": 0, "unit": None}


def _reads(entry: dict[str, Any], no_change: float) -> str:
    """Which side the interval favours (lower is better for both kinds), or that it cannot tell."""
    low, high = entry["low"], entry["high"]
    if low is None or high is None:
        return "no interval"
    if high < no_change:
        return "AFTER better"
    if low > no_change:
        return "CONTROL better"
    return NO_DIFFERENCE


def _paired_probes(after: DiagnoseResult, control: DiagnoseResult):
    """(AFTER's, CONTROL's) result of each probe both ran, in AFTER's order."""
    theirs = {p.name: p for p in control.probes}
    return [(p, theirs[p.name]) for p in after.probes if p.name in theirs and not p.skipped]


__all__ = ["LONG_FACTOR", "conversion_decision", "in_domain_key", "longer_window"]
