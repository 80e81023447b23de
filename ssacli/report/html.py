"""Self-contained HTML pages: one per diagnose result, per comparison of two, per ``ssacli report``.

Every page is built the same way: :func:`page` takes a title and a list of :class:`Section`
(a heading and the HTML under it); :func:`diagnose_sections` and :func:`comparison_sections` give a
result's and a comparison's sections, so other pages (the before/after report) compose them.
:func:`escape`, :func:`facts_table` and :func:`html_table` are the shared pieces.

Everything is inline: CSS in a <style> block, figures as base64 PNG data URIs
(:mod:`ssacli.report.figures`), so the page can be mailed or attached to an issue and still open
offline.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..diagnosis.comparison import common_levels, comparison_findings, generation_comparison
from ..diagnosis.generation import GenerationResult
from ..diagnosis.probe_result import ProbeResult
from ..diagnosis.result import DiagnoseResult
from ..diagnosis.shift import shift_lines
from ..diagnosis.verdicts import Verdict, paired_verdicts, probe_verdicts
from .figures import compare_figure, heatmap_figure, line_figure, overview_figure, png_img
from .generation import bin_rows, comparison_figure, comparison_rows, generation_figure, layer_rows
from .generation import title as generation_title
from .positions import class_grid, position_legend, position_rows, profiles_figure
from .replaceable import PAGE_HEAD
from .summary import (
    SATURATED_METRICS,
    SATURATED_TITLE,
    collapse_detail,
    comparison_columns,
    delta_verdict,
    fmt,
    fmt_delta,
    fmt_level,
    heatmap_level_text,
    layer_labels,
    probe_table_rows,
    saturated_rows,
    summary_facts,
    summary_findings,
)

WIDE_TABLE = 10  # columns from which a table is set smaller (a comparison has 1 + 3 per metric)
# Every table fits a 1280-px window (scripts/check_html_width.py, docs/diagnose.md): headers wrap
# after "_" (<wbr>), wide tables get a smaller font; div.scroll is only the last resort.
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1240px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; max-width: 100%; }
div.scroll { max-width: 100%; overflow-x: auto; }
table.wide { font-size: 0.8em; } table.wide th, table.wide td { padding: 0.15em 0.3em; }
table.facts td { overflow-wrap: anywhere; }
ul.findings li { margin: 0.2em 0; }
table.verdict { font-size: 1.05em; } table.verdict th { text-align: left; }
table.verdict td { text-align: left; font-family: inherit; white-space: normal; }
tr.failed td, td.failed { color: #b2182b; font-weight: bold; }
tr.held td, td.held { color: #1a7837; }
th, td { padding: 0.15em 0.6em; border-bottom: 1px solid #e4e4e4; }
th { background: #f4f4f4; text-align: right; } th:first-child { text-align: left; }
td { text-align: right; font-family: ui-monospace, Menlo, Consolas, monospace; white-space: nowrap; }
td:first-child, table.facts td { white-space: normal; } /* labels wrap; numbers never at their "-" */
table.facts th { text-align: left; background: none; }
table.facts td { text-align: left; font-family: inherit; }
td.worse { color: #b2182b; } td.better { color: #1a7837; }
.note { color: #777; } img { max-width: 100%; display: block; margin: 0.5em 0; }
pre { background: #f6f6f6; padding: 0.8em; font-size: 0.8em; white-space: pre-wrap; overflow-wrap: anywhere; }
footer { margin-top: 3em; color: #555; font-size: 0.9em; }
"""


@dataclass(frozen=True)
class Section:
    """One part of a page: a heading (plain text, escaped here; None for none) at ``level`` (1 for
    the page's own head, 2 for its parts) and the HTML fragments under it, in order."""

    heading: str | None
    body: Sequence[str] = ()
    level: int = 2

    def html(self) -> str:
        parts = [f"<h{self.level}>{escape(self.heading)}</h{self.level}>"] if self.heading is not None else []
        return "\n".join([*parts, *self.body])


def page(title: str, sections: Sequence[Section]) -> str:
    """A complete self-contained page: ``title`` in the tab, the sections one after the other."""
    return (
        PAGE_HEAD
        + f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(section.html() for section in sections)
        + "\n</body></html>\n"
    )


def diagnose_html(result: DiagnoseResult) -> str:
    """The full report of one result (see :func:`diagnose_sections`)."""
    return page(f"ssacli diagnose: {result.model}", diagnose_sections(result))


def diagnose_sections(result: DiagnoseResult) -> list[Section]:
    """The verdict (:func:`ssacli.diagnosis.verdicts.probe_verdicts`), summary facts, per probe line
    plots + heatmaps + table, most saturated heads, and versions/settings for reproduction."""
    sections = [Section(f"ssacli diagnose: {result.model}", level=1)]
    verdicts = probe_verdicts(result)
    if verdicts:  # the page opens with it: one line per probe, most severe first
        sections.append(Section("verdict", [verdict_table(verdicts)]))
    sections.append(Section("run" if verdicts else None, [facts_table(summary_facts(result))]))
    findings = summary_findings(result)
    if findings:
        sections.append(Section("findings", [findings_list(findings)]))
    overview = overview_figure(result)
    if overview is not None:
        alt = "collapse point per probe and layer"
        sections.append(Section("collapse point per probe and layer", [png_img(overview, alt)]))
    labels = layer_labels(result.layers)
    for probe in result.probes:
        if probe.skipped:
            why = escape(probe.note or "no countable rows")
            sections.append(Section(probe.name, [f'<p class="note">skipped: {why}</p>']))
            continue
        body = [f'<p class="note">{escape(probe.note)}</p>'] if probe.note else []
        if probe.insensitive:
            body.append(f'<p class="note">n/a: insensitive by construction: {escape(probe.insensitive)}</p>')
        collapsed = probe.baseline_collapsed_heads()
        if collapsed:
            heads = ", ".join(f"L{layer}H{head}" for layer, head in collapsed)
            body.append(f'<p class="note">collapsed at baseline (not counted): {escape(heads)}</p>')
        body.append(f"<p>collapse point: <b>{escape(probe.collapse_status())}</b></p>")
        detail = collapse_detail(probe)
        if detail:
            body.append(f"<p>{escape(detail)}</p>")
        body.extend(f"<p>{escape(line)}</p>" for line in shift_lines(probe))
        if probe.all_overflowed:  # no finite metric at any level: nothing to plot
            level, where = probe.first_overflow()
            at = f"layer {where['layer']}: " if where.get("layer") is not None else ""
            first = escape(f"{fmt_level(level)} in {at}{where.get('where')}")
            body.append(
                f'<p class="note">every level overflowed (first non-finite value at {first}): nothing '
                "was measured, so nothing is plotted</p>"
            )
        else:
            body += [
                png_img(line_figure(probe), f"{probe.name}: metrics vs level"),
                f'<p class="note">{escape(heatmap_level_text(probe))}</p>',
                png_img(heatmap_figure(probe), f"{probe.name}: layer × head heatmaps"),
            ]
        body.append(html_table(*probe_table_rows(probe)))
        sections.append(Section(probe.name, body))
    if result.generation is not None:
        sections.append(Section("generation (KV cache)", generation_body(result.generation, labels)))
    positions = position_rows(result)
    if positions is not None:  # where attention lands: the terminal's table, class grid and legend
        title, header, rows = positions
        profiles = result.position_profiles()
        grid = [[labels[layer], *row] for layer, row in enumerate(class_grid(profiles))]
        heads = max(map(len, profiles.classes), default=0)
        figure = png_img(profiles_figure(profiles), "received and distance profiles")
        body = [html_table(header, rows), figure,
                html_table(["layer \\ head", *map(str, range(heads))], grid),
                f'<p class="note">{escape(position_legend(profiles))}</p>']  # fmt: skip
        sections.append(Section(title, body))
    rows = saturated_rows(result, 10)
    if rows:
        header = ["probe", "level", "layer", "head", *SATURATED_METRICS]
        sections.append(Section(SATURATED_TITLE, [html_table(header, rows)]))
    sections.append(Section(None, [_footer([result])]))
    return sections


def comparison_html(a: DiagnoseResult, b: DiagnoseResult) -> str:
    """A and B overlaid per shared probe (see :func:`comparison_sections`)."""
    return page("ssacli diagnose: comparison", comparison_sections(a, b))


def comparison_sections(a: DiagnoseResult, b: DiagnoseResult, *, head_level: int = 1) -> list[Section]:
    """A and B overlaid per shared probe (A solid, B dashed) and B − A tables on common levels,
    after a head naming both (at ``head_level``: 1 on its own page, lower inside another)."""
    name_a, name_b = _side_label("A", a), _side_label("B", b)
    facts = [("A", f"{a.model} · {a.scorer}"), ("B", f"{b.model} · {b.scorer}"),
             ("Δ", "B − A of the model means (red: B more saturated)")]  # fmt: skip
    sections = [Section("ssacli diagnose: comparison", [facts_table(facts)], level=head_level)]
    sections.append(Section("verdict (A, B)", [paired_verdict_table(a, b)], level=head_level + 1))
    changes = [f["text"] for f in comparison_findings(a, b)]
    if changes:
        sections.append(Section("findings", [findings_list(changes)], level=head_level + 1))
    probes_b = {p.name: p for p in b.probes}
    for pa in a.probes:
        pb = probes_b.get(pa.name)
        if pb is None or pa.skipped or pb.skipped:
            why = (
                "only in A"
                if pb is None
                else "skipped in " + " and ".join(side for side, p in (("A", pa), ("B", pb)) if p.skipped)
            )
            sections.append(Section(pa.name, [f'<p class="note">{escape(why)}</p>']))
            continue
        points = (
            f"<p>collapse point: A <b>{escape(pa.collapse_status())}</b>, "
            f"B <b>{escape(pb.collapse_status())}</b></p>"
        )
        figure = png_img(compare_figure(pa, pb, name_a, name_b), f"{pa.name}: A vs B")
        sections.append(Section(pa.name, [points, figure, _delta_table(pa, pb)]))
    for pb in b.probes:
        if pb.name not in {p.name for p in a.probes}:
            sections.append(Section(pb.name, ['<p class="note">only in B</p>']))
    generating = generation_comparison(a, b)
    if generating is not None:
        sections.append(Section("generation (KV cache)", _generation_comparison_body(a, b, generating)))
    sections.append(Section(None, [_footer([a, b])]))
    return sections


def generation_body(gen: GenerationResult, labels: list[str]) -> list[str]:
    """diagnose --generate (:mod:`ssacli.report.generation`): the title line, the figure, the two
    tables."""
    return [
        f"<p>{escape(generation_title(gen))}</p>",
        png_img(generation_figure(gen), "generation: metrics per decoding step"),
        html_table(*layer_rows(gen, labels)),
        html_table(*bin_rows(gen)),
    ]


def _generation_comparison_body(a: DiagnoseResult, b: DiagnoseResult, comparison: dict) -> list[str]:
    if "only" in comparison:
        return [f'<p class="note">only in {comparison["only"]} (run both with --generate)</p>']
    caption, header, rows = comparison_rows(comparison)
    figure = png_img(comparison_figure(a.generation, b.generation), "generation: A vs B")
    return [f"<p>{escape(caption)}</p>", figure, html_table(header, rows)]


# ---- HTML pieces ------------------------------------------------------------------------------------


def escape(text: Any) -> str:
    """``text`` as HTML text or attribute value (quotes escaped too)."""
    return html.escape(str(text), quote=True)


def _side_label(side: str, result: DiagnoseResult) -> str:
    return f"{side}: {result.model} · {result.scorer}"


def verdict_table(verdicts: list[Verdict]) -> str:
    rows = "".join(
        f'<tr class="{v.tone}"><th>{escape(v.probe)}</th><td>{escape(v.line)}</td></tr>' for v in verdicts
    )
    return f'<table class="verdict">{rows}</table>'


def paired_verdict_table(a: DiagnoseResult, b: DiagnoseResult) -> str:
    def cell(v: Verdict | None) -> str:
        return (
            '<td class="note">not run</td>' if v is None else (f'<td class="{v.tone}">{escape(v.line)}</td>')
        )

    rows = "".join(
        f"<tr><th>{escape(name)}</th>{cell(va)}{cell(vb)}</tr>" for name, va, vb in paired_verdicts(a, b)
    )
    return f'<table class="verdict"><tr><th>probe</th><th>A</th><th>B</th></tr>{rows}</table>'


def findings_list(findings: list[str]) -> str:
    return '<ul class="findings">' + "".join(f"<li>{escape(t)}</li>" for t in findings) + "</ul>"


def facts_table(facts: list[tuple[str, str]]) -> str:
    """(key, value) lines as the two-column table under a page's heading."""
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{rows}</table>'


def html_table(header: list[str], rows: list[list[str]], classes: list[list[str]] | None = None) -> str:
    """A data table; ``classes[r][c]`` is cell (r, c)'s CSS class ("worse", "better", "" for none).
    Headers may wrap after "_" (metric names are long, their values short)."""
    head = "".join(f"<th>{escape(h).replace('_', '_<wbr>')}</th>" for h in header)
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, value in enumerate(row):
            css = classes[r][c] if classes else ""
            cells.append(f'<td class="{css}">{escape(value)}</td>' if css else f"<td>{escape(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    wide = ' class="wide"' if len(header) >= WIDE_TABLE else ""
    table = f"<table{wide}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def _delta_table(pa: ProbeResult, pb: ProbeResult) -> str:
    shared = common_levels(pa, pb)
    if not shared:
        return '<p class="note">no level in common</p>'
    metrics = comparison_columns(pa, pb)
    header = ["level"] + [f"{m} {side}" for m in metrics for side in ("A", "B", "Δ")]
    rows, classes = [], []
    for level, ia, ib in shared:
        row, css = [fmt_level(level)], [""]
        for m in metrics:
            va, vb = float(pa.model_mean(m)[ia]), float(pb.model_mean(m)[ib])
            row += [fmt(va), fmt(vb), fmt_delta(vb - va)]
            css += ["", "", delta_verdict(m, vb - va)]
        rows.append(row)
        classes.append(css)
    return html_table(header, rows, classes)


def _footer(results: list[DiagnoseResult]) -> str:
    blocks = []
    for side, result in zip(("A", "B") if len(results) == 2 else ("",), results):
        data = {"versions": result.versions, "settings": result.settings}
        text = json.dumps(data, indent=2, ensure_ascii=False, default=str, sort_keys=True)
        heading = f"{side} versions and settings".strip()
        blocks.append(f"<h3>{escape(heading)}</h3><pre>{escape(text)}</pre>")
    return "<footer>" + "".join(blocks) + "</footer>"
