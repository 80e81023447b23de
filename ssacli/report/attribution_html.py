"""The HTML page of an attribution (``ssacli attribute --html``), built like every page of
:mod:`ssacli.report.html`: sections of facts and tables under :func:`~ssacli.report.html.page`."""

from __future__ import annotations

from ..diagnosis.attribution_result import READINGS, Attribution
from .html import Section, escape, facts_table, html_table, page

HEADER = ["set", "heads", "measured on", "removed", "95 % interval", "share", "null", "beats", "reading"]


def attribution_html(result: Attribution) -> str:
    """The whole page: :func:`attribution_sections` under the title ``ssacli attribute: MODEL``."""
    return page(f"ssacli attribute: {result.model}", attribution_sections(result))


def attribution_sections(result: Attribution) -> list[Section]:
    """The run's facts, one table row per measured set (the ceiling last), each set's heads alone,
    and the text :meth:`Attribution.lines` prints."""
    damage = sum(result.damage) / len(result.damage)
    low_high = "" if result.damage_interval is None else _interval(result.damage_interval)
    facts = [
        ("probe", f"{result.probe} at {result.level:g} against {result.reference_level:g}"),
        ("prompts", f"{len(result.damage)} × {result.settings.get('length')} tokens, seed "
                    f"{result.settings.get('seed')}"),
        ("damage", f"{damage:+.4f} nats/token {low_high}"),
        ("time", f"{result.elapsed_s:.1f} s"),
    ]  # fmt: skip
    rows = []
    for one in [*result.sets, *([result.ceiling] if result.ceiling else [])]:
        label = (
            "every head (ceiling)" if one is result.ceiling else
            "given" if one.chosen_on is None else f"top {len(one.heads)}, chosen on {len(one.chosen_on)}"
        )  # fmt: skip
        rows.append([
            label, " ".join(f"L{layer}H{head}" for layer, head in one.heads) if one is not result.ceiling
            else f"all {len(one.heads)}", str(len(one.measured_on)), f"{one.mean:+.4f}",
            _interval(one.interval), "–" if one.share is None else f"{one.share:.0%}",
            str(len(one.null)) if one.null else "–",
            "–" if one.percentile is None else f"{one.percentile:.0f} %",
            "–" if one.reading is None else READINGS[one.reading],
        ])  # fmt: skip
    sections = [
        Section(f"ssacli attribute: {result.model}", level=1),
        Section("run", [facts_table(facts)]),
        Section(
            "damage removed by patching each set's unshifted attention patterns", [html_table(HEADER, rows)]
        ),
    ]
    alone = [
        [f"{name} (set {n + 1})", f"{value:+.4f}"]
        for n, one in enumerate(result.sets)
        for name, value in one.per_head.items()
    ]
    if alone:  # beside the set's own row: a set that removes less than its parts shows self-repair
        sections.append(Section("each head of a set alone", [html_table(["head", "removed"], alone)]))
    doses = [
        [f"set {n + 1}", f"{dose['temperature']:g}", f"{dose['removed']:+.4f}", _interval(dose["interval"])]
        for n, one in enumerate(result.sets)
        for dose in one.remedy
    ]
    if doses:  # a remedy tried on the same heads, kept apart from the attribution it is not
        table = html_table(["set", "temperature", "removed", "95 % interval"], doses)
        sections.append(Section("remedy: a temperature on each set's heads (not attribution)", [table]))
    sections.append(Section("as printed", [f"<pre>{escape(chr(10).join(result.lines()))}</pre>"]))
    return sections


def _interval(interval: tuple[float, float] | None) -> str:
    return "–" if interval is None else f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


__all__ = ["attribution_html", "attribution_sections"]
