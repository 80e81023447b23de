"""Rich terminal rendering of a diagnose result, and of two results side by side.

What the tables and legends say comes from :mod:`ssacli.report.summary`,
:mod:`ssacli.report.positions` and :mod:`ssacli.report.generation` (shared with the HTML page, so
both always say the same thing); this module lays it out for a terminal of any width with
:mod:`ssacli.report.terminal_layout`: tables split into column groups that fit, never truncating a
cell. Every colored cell also prints its value: with NO_COLOR (or a dumb terminal) the numbers still
carry the information.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..defaults import FINDINGS, HEATMAP
from ..diagnosis.comparison import common_levels, comparison_findings, generation_comparison
from ..diagnosis.findings import level_text
from ..diagnosis.generation import GenerationResult
from ..diagnosis.metrics import METRICS
from ..diagnosis.probe_result import ProbeResult
from ..diagnosis.result import DiagnoseResult
from ..diagnosis.shift import shift_lines
from ..diagnosis.verdicts import Verdict, paired_verdicts, probe_verdicts
from .generation import bin_rows, comparison_rows, layer_rows
from .generation import title as generation_title
from .positions import class_grid, position_legend, position_rows
from .summary import (
    SATURATED_METRICS,
    SATURATED_TITLE,
    collapse_cell,
    collapse_detail,
    collapse_grid_legend,
    collapse_point_grid,
    column_header,
    comparison_columns,
    delta_verdict,
    fmt_level,
    heatmap_index,
    heatmap_legend,
    layer_labels,
    layers_by_heads,
    pick_heatmap,
    probe_table_rows,
    saturated_rows,
    summary_facts,
    summary_findings,
)
from .terminal_layout import grid_tables, split_tables

# ---- terminal rendering ---------------------------------------------------------------------------


def facts_panel(facts: list[tuple[str, str]], title: str) -> Panel:
    """A titled panel of (key, value) lines: the head of every terminal report."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in facts:
        grid.add_row(key, Text(value))
    return Panel(grid, title=title, title_align="left", expand=False)


def render_diagnose(
    result: DiagnoseResult,
    console: Console,
    *,
    heatmap_metric: str = HEATMAP,
    heatmap_probe: str | None = None,
    top: int = 5,
    findings: int | None = FINDINGS,
) -> None:
    """The verdict (one line per probe, most severe first), summary panel, the first ``findings``
    findings (None: all) and a count of the rest, one table
    per probe (split to fit the width), the heads collapsed at baseline, a layer × head grid of
    per-head collapse points and a heatmap at the level where heads differ most, the most
    saturated heads."""
    verdicts = probe_verdicts(result)
    if verdicts:
        console.print(verdict_panel(verdicts))
    console.print(facts_panel(summary_facts(result), "ssacli diagnose"))
    texts = summary_findings(result)
    if texts:
        console.print(findings_panel(texts, findings))
    for probe in result.probes:
        if probe.skipped:
            console.print(Text(f"{probe.name}: skipped — {probe.note or 'no countable rows'}", style="dim"))
            continue
        for table in _probe_tables(probe, console.width):
            console.print(table)
        if probe.insensitive:
            console.print(Text(f"n/a: insensitive by construction: {probe.insensitive}", style="dim"))
        collapsed = probe.baseline_collapsed_heads()
        if collapsed:
            heads = ", ".join(f"L{layer}H{head}" for layer, head in collapsed)
            line = f"collapsed at baseline (not counted in its collapse point): {heads}"
            console.print(Text(line, style="dim"))
        detail = collapse_detail(probe)
        if detail:
            console.print(Text(detail, style="dim"))
        for line in shift_lines(probe):  # the shift probe: per document, against the reference
            console.print(Text(line, style="dim"))
        console.print()  # a blank line before the next probe's title
    if any(not p.skipped for p in result.probes):
        chosen = pick_heatmap(result, heatmap_metric, heatmap_probe)
        points = collapse_point_grid(chosen)
        if points is not None:
            title = f"per-head collapse points · {chosen.name}"
            for table in grid_tables(result, points, None, console.width, text=True, title=title):
                console.print(table)
            console.print(Text(collapse_grid_legend(chosen), style="dim"))
        index = heatmap_index(chosen)
        for table in heatmap_tables(result, chosen, heatmap_metric, console.width, index):
            console.print(table)
        console.print(Text(heatmap_legend(chosen, heatmap_metric, index), style="dim"))
    render_positions(result, console)  # where attention lands (sinks, distance, head classes)
    if result.generation is not None:
        for table in generation_tables(result.generation, layer_labels(result.layers), console.width):
            console.print(table)
    rows = saturated_rows(result, top)
    if rows:
        header = ["probe", "level", "layer", "head", *(METRICS[m].header for m in SATURATED_METRICS)]
        for table in split_tables(SATURATED_TITLE, header, rows, console.width, keep=1, left=(0, 2)):
            console.print(table)


def render_positions(result: DiagnoseResult, console: Console) -> None:
    """Where attention lands (:mod:`ssacli.report.positions`): the per-layer table (split to fit),
    the class grid and the legend; nothing where the run did not measure it."""
    found = position_rows(result)
    if found is None:
        return
    title, header, rows = found
    for table in split_tables(title, header, rows, console.width, keep=1, left=(0, 1, 6)):
        console.print(table)
    profiles = result.position_profiles()
    grid = class_grid(profiles)
    for table in grid_tables(result, grid, None, console.width, text=True, title="head classes"):
        console.print(table)
    console.print(Text(position_legend(profiles), style="dim"))


def generation_tables(gen: GenerationResult, labels: list[str], width: int) -> list[Table]:
    """diagnose --generate (:mod:`ssacli.report.generation`): per layer the first and last step,
    then the model means per bin of generated positions, each split to fit ``width``."""
    header, rows = layer_rows(gen, labels)
    tables = split_tables(generation_title(gen), header, rows, width, keep=1, left=(0,))
    header, rows = bin_rows(gen)
    return tables + split_tables("generation · model means per generated position", header, rows, width)


# The verdict's tones (Verdict.tone): failed (red), could not test (yellow), held (green), no
# collapse with the outputs unmeasured (plain). The kind is also printed, so the colour carries
# nothing that NO_COLOR loses.
VERDICT_STYLES = {"failed": "bold red", "untested": "yellow", "held": "green", "unconfirmed": ""}


def verdict_panel(verdicts: list[Verdict]) -> Panel:
    """The block a report opens with: per probe its name and verdict line, most severe first."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(overflow="fold")
    for verdict in verdicts:
        grid.add_row(verdict.probe, Text(verdict.line, style=VERDICT_STYLES[verdict.tone]))
    return Panel(grid, title="verdict", title_align="left", expand=False)


def paired_verdict_panel(a: DiagnoseResult, b: DiagnoseResult) -> Panel:
    """A comparison opens with both verdicts per probe (A's line, then B's), the most severe first."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for name, va, vb in paired_verdicts(a, b):
        for side, verdict in (("A", va), ("B", vb)):
            line = (
                Text("not run", style="dim")
                if verdict is None
                else Text(verdict.line, style=VERDICT_STYLES[verdict.tone])
            )
            grid.add_row(name if side == "A" else "", side, line)
    return Panel(grid, title="verdict (A, B)", title_align="left", expand=False)


def findings_panel(findings: list[str], budget: int | None = FINDINGS) -> Panel:
    """The first ``budget`` findings (None: all), most important first, and a last line counting the
    rest, so none is dropped without a word (JSON and HTML hold them all)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    shown = findings if budget is None else findings[:budget]
    for text in shown:
        grid.add_row("•", Text(text))
    if len(findings) > len(shown):
        grid.add_row("", Text(f"and {len(findings) - len(shown)} more: --findings all", style="dim"))
    return Panel(grid, title="findings", title_align="left", expand=False)


def render_comparison(
    a: DiagnoseResult, b: DiagnoseResult, console: Console, findings: int | None = FINDINGS
) -> None:
    """A panel naming A and B, the first ``findings`` changes (None: all) and a count of the rest,
    then per shared probe A, B and Δ = B − A of the key metrics on the levels both swept, and both
    collapse points."""
    facts = [
        ("A", f"{a.model} · {a.scorer} · {a.route}"),
        ("B", f"{b.model} · {b.scorer} · {b.route}"),
        ("layers × heads", f"A {layers_by_heads(a)} · B {layers_by_heads(b)}"),
        ("Δ", "B − A of the model means; red = B more saturated, green = B less"),
    ]
    console.print(paired_verdict_panel(a, b))
    console.print(facts_panel(facts, "ssacli diagnose: comparison"))
    changes = [f["text"] for f in comparison_findings(a, b)]
    if changes:
        console.print(findings_panel(changes, findings))
    names_b = {p.name for p in b.probes}
    for pa in a.probes:
        if pa.name not in names_b:
            console.print(Text(f"{pa.name}: only in A", style="dim"))
            continue
        pb = b.probe(pa.name)
        if pa.skipped or pb.skipped:
            which = " and ".join(s for s, p in (("A", pa), ("B", pb)) if p.skipped)
            console.print(Text(f"{pa.name}: skipped in {which}", style="dim"))
            continue
        tables = comparison_tables(pa, pb, console.width)
        if not tables:
            console.print(Text(f"{pa.name}: no level in common", style="dim"))
            continue
        for table in tables:
            console.print(table)
        legend = comparison_legend(pa, pb)
        if legend:  # under the tables, wrapped to the terminal (a caption wraps at the table's edge)
            console.print(Text(legend, style="dim"))
    for pb in b.probes:
        if pb.name not in {p.name for p in a.probes}:
            console.print(Text(f"{pb.name}: only in B", style="dim"))
    render_generation_comparison(generation_comparison(a, b), console)


def render_generation_comparison(comparison: dict | None, console: Console) -> None:
    """diagnose --generate on both sides: A, B and Δ of each metric's mean while generating."""
    if comparison is None:
        return
    if "only" in comparison:
        only = f"generation: only in {comparison['only']} (run both with --generate)"
        console.print(Text(only, style="dim"))
        return
    caption, header, rows = comparison_rows(comparison)
    for table in split_tables(caption, header, rows, console.width, keep=1, left=(0,)):
        console.print(table)


def comparison_tables(pa: ProbeResult, pb: ProbeResult, width: int) -> list[Table]:
    """Rows = common levels; per metric an A, B and Δ column under a two-line header, split into
    tables of whole metrics (A, B, Δ together) that fit ``width``; the level column repeats in each."""
    shared = common_levels(pa, pb)
    if not shared:
        return []
    metrics = comparison_columns(pa, pb)
    title = f"{pa.name} · collapse point A {collapse_cell(pa)} → B {collapse_cell(pb)}"
    header = ["\nlevel"] + [f"{METRICS[m].short}\n{side}" for m in metrics for side in ("A", "B", "Δ")]
    means = {m: (pa.model_mean(m), pb.model_mean(m)) for m in metrics}
    rows = []
    for level, ia, ib in shared:
        cells: list[Text | str] = [fmt_level(level)]
        for m in metrics:
            va, vb = float(means[m][0][ia]), float(means[m][1][ib])
            cells += [_fixed(va), _fixed(vb), _delta_text(m, vb - va)]
        rows.append(cells)
    continued = f"{pa.name} · A, B, Δ (continued)"
    return split_tables(title, header, rows, width, keep=1, group=3, continued=continued)


def comparison_legend(pa: ProbeResult, pb: ProbeResult) -> str | None:
    """What the comparison tables' abbreviated headers stand for ("ent = entropy, …"), or None."""
    metrics = comparison_columns(pa, pb)
    abbreviated = [f"{METRICS[m].short} = {m}" for m in metrics if METRICS[m].short != m]
    return ", ".join(abbreviated) if abbreviated and common_levels(pa, pb) else None


def heatmap_tables(
    result: DiagnoseResult, probe: ProbeResult, metric: str, width: int, index: int | None = None
) -> list[Table]:
    """The layer × head grid at level ``index`` (default: the harshest) as rich tables of colored
    cells, split into column groups that fit the terminal so wide models never wrap mid-cell."""
    index = len(probe.levels) - 1 if index is None else index
    title = f"{metric} per head · {probe.name} at {level_text(probe, probe.levels[index])}"
    return grid_tables(result, probe.metrics[metric][index], metric, width, title=title)


# ---- private helpers ------------------------------------------------------------------------------


def _probe_tables(probe: ProbeResult, width: int) -> list[Table]:
    header, rows = probe_table_rows(probe)
    title = f"{probe.name} · model means · collapse point {collapse_cell(probe)}"
    if probe.note:
        title += f" · {probe.note}"
    names = [column_header(n) for n in header]
    return split_tables(title, names, rows, width, keep=1)


def _fixed(value: float) -> str:
    """Comparison cells: three decimals, so A, B and Δ line up (these metrics lie in [0, 1])."""
    return f"{value:.3f}" if math.isfinite(value) else "–"


def _delta_text(metric: str, delta: float) -> Text:
    """Δ colored by meaning: red where B is more saturated than A, green where it is less."""
    text = f"{delta:+.3f}" if math.isfinite(delta) else "–"
    style = {"worse": "red", "better": "green"}.get(delta_verdict(metric, delta), "")
    return Text(text, style=style) if style else Text(text)
