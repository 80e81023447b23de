"""Rendering an ``ssacli report`` (BEFORE vs AFTER, and a CONTROL when given) for the terminal and
as one HTML page.

Both read only the JSON-ready report of :func:`ssacli.quality.compare.compare_models`, so a report
written with ``--json`` renders the same later. The probe half reuses the diagnose comparison
(:func:`render_comparison`, :func:`comparison_sections`) so both commands show probes identically.
"""

from __future__ import annotations

import math
from html import escape as escape_html
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..diagnosis.result import DiagnoseResult
from ..models.kinds import ModelKind
from .benchmarks import benchmark_section, benchmark_table
from .conversion_facts import conversion_facts, scorer_text
from .decision import decision_section, render_decision
from .figures import REPORT_DPI, png_img
from .html import Section, comparison_sections, facts_table, html_table, page
from .monitor import monitor_section, monitor_table
from .terminal import facts_panel, render_comparison


def report_results(report: dict[str, Any], key: str = "diagnose") -> tuple[DiagnoseResult, DiagnoseResult]:
    """The two diagnose results inside a report: (BEFORE, AFTER), or with ``key``
    "diagnose_control" (CONTROL, AFTER)."""
    diagnose = report[key]
    return DiagnoseResult.from_dict(diagnose["a"]), DiagnoseResult.from_dict(diagnose["b"])


def report_title(report: dict[str, Any]) -> str:
    return "ssacli report: before → after" + (" vs control" if has_control(report) else "")


CONTROL_PROBES = "attention probes: AFTER against CONTROL (A = CONTROL, B = AFTER)"


def fmt_value(value: float | None) -> str:
    """Four significant digits: perplexities and accuracies differ in the third after a change."""
    return "–" if value is None or not math.isfinite(value) else f"{value:.4g}"


def fmt_change(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return "0" if value == 0 else f"{value:+.3g}"


def verdict(row: dict[str, Any], key: str = "delta") -> str:
    """ "better", "worse" or "" for AFTER relative to BEFORE (``key`` "delta") or to CONTROL
    ("delta_control"), by the measure's direction."""
    delta = row.get(key)
    if delta is None or not math.isfinite(delta) or abs(delta) < 1e-12:
        return ""
    improved = delta < 0 if row["better"] == "lower" else delta > 0
    return "better" if improved else "worse"


def has_control(report: dict[str, Any]) -> bool:
    """Whether the report measured a third model, CONTROL, beside BEFORE and AFTER."""
    return report.get("control") is not None


def header_facts(report: dict[str, Any]) -> list[tuple[str, str]]:
    facts = []
    for side in ("before", "after", "control") if has_control(report) else ("before", "after"):
        info = report[side]
        facts.append(
            (side.upper(), f"{info['model']} · {info['kind']} · {info['family']} · {scorer_text(info)}")
        )
    settings = report.get("settings", {})
    facts.append(("seed", str(settings.get("seed", "–"))))
    if has_control(report):
        facts.append(("Δ", "vs BEFORE: AFTER − BEFORE, vs CONTROL: AFTER − CONTROL; "
                      "green = AFTER better, red = worse"))  # fmt: skip
    else:
        facts.append(("Δ", "AFTER − BEFORE; green = AFTER better, red = worse"))
    facts += conversion_facts(report)
    facts += [("note", note) for note in report.get("notes", [])]
    return facts


# With a CONTROL: two-line headers (bottom-aligned), so that 80 columns hold every number whole.
CONTROL_HEADER = ("\nmeasure", "\nBEFORE", "\nAFTER", "\nCONTROL", "Δ vs\nBEFORE", "Δ vs\nCONTROL",
                  "better\nif")  # fmt: skip


def quality_columns(report: dict[str, Any]) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """The quality table's header, cells and each cell's verdict class ("better", "worse", ""):
    measure, BEFORE, AFTER, Δ, better if; with a CONTROL measure, BEFORE, AFTER, CONTROL, Δ vs
    BEFORE, Δ vs CONTROL (AFTER − CONTROL), better if, under two-line headers."""
    rows = report.get("quality", [])
    if not has_control(report):
        cells = [[r["label"], fmt_value(r["before"]), fmt_value(r["after"]), fmt_change(r["delta"]),
                  r["better"]] for r in rows]  # fmt: skip
        classes = [["", "", "", verdict(r), ""] for r in rows]
        return ["measure", "BEFORE", "AFTER", "Δ", "better if"], cells, classes
    cells = [[r["label"], fmt_value(r["before"]), fmt_value(r["after"]), fmt_value(r["control"]),
              fmt_change(r["delta"]), fmt_change(r["delta_control"]), r["better"]] for r in rows]  # fmt: skip
    classes = [["", "", "", "", verdict(r), verdict(r, "delta_control"), ""] for r in rows]
    return list(CONTROL_HEADER), cells, classes


def quality_table(report: dict[str, Any]) -> Table | None:
    if not report.get("quality"):
        return None
    header, cells, classes = quality_columns(report)
    control = has_control(report)  # seven columns: padding collapsed to one space between them
    table = Table(title="quality", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=control)  # fmt: skip
    table.add_column(header[0], overflow="fold" if control else "ellipsis")  # a long label wraps
    for name in header[1:-1]:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column(header[-1], justify="left", style="dim", no_wrap=control)
    styles = {"better": "green", "worse": "red"}
    changes = [i for i, name in enumerate(header) if name.startswith("Δ")]
    for row, css in zip(cells, classes):
        table.add_row(*(Text(cell, style=styles.get(css[i], "")) if i in changes else cell
                        for i, cell in enumerate(row)))  # fmt: skip
    return table


def trajectory_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """AFTER's fine-tuning trajectory (``report["conversion"]["after"]``), or []."""
    return ((report.get("conversion") or {}).get("after") or {}).get("trajectory") or []


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


# Two-line headers: the trajectory table's widest cells are numbers, so at 80 columns nothing is cut.
TRAJECTORY_HEADER = ("step", "loss", "held-out\nloss", "KL to\nsource", "top-1", "n mean\n(min–max)",
                     "b\nmean")  # fmt: skip


def trajectory_table(records: list[dict[str, Any]]) -> Table | None:
    """Step, loss, held-out loss, KL to the source model, n and b (mean over layers, min–max):
    never a truncated cell (no_wrap columns under short two-line headers; about 70 columns)."""
    if not records:
        return None
    table = Table(title="fine-tuning trajectory (AFTER)", title_justify="left", box=box.SIMPLE_HEAD)
    header, rows = trajectory_columns(records)
    for name in header:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def trajectory_columns(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The trajectory's header and rows: a recipe conversion's records name their stage first, and
    a column no record fills (a recipe has no top-1 agreement) is left out, so that 80 columns
    hold the rest uncut."""
    staged = any(r.get("stage") for r in records)
    header = (["stage"] if staged else []) + list(TRAJECTORY_HEADER)
    rows = []
    for r in records:
        n, b = r.get("scorer", {}).get("n"), r.get("scorer", {}).get("b")
        n_text = f"{_mean(n):.4g} ({min(n):.3g}–{max(n):.3g})" if n else "–"
        kl = r.get("kl_to_source")
        rows.append(([r.get("stage") or ""] if staged else []) + [
            str(r["step"]), fmt_value(r.get("loss")), fmt_value(r.get("heldout_loss")),
            "–" if kl is None else f"{kl:.3g}",
            "–" if r.get("top1_agreement") is None else f"{r['top1_agreement']:.1%}",
            n_text, fmt_value(_mean(b)),
        ])  # fmt: skip
    keep = [i for i, name in enumerate(header) if name == "step" or any(row[i] != "–" for row in rows)]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def trajectory_figure(records: list[dict[str, Any]]):
    """Panels over the steps, only those with something to draw (a page says which are left out):
    losses, KL to the source (log scale), n and b per layer (coloured by layer, with a colour bar)."""
    from matplotlib.figure import Figure

    from .figures import LAYERS, layer_bar, plain_y

    steps = [r["step"] for r in records]
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    held = [(r["step"], r["heldout_loss"]) for r in records if r.get("heldout_loss") is not None]
    kl = [(r["step"], max(r["kl_to_source"], 1e-12)) for r in records if r.get("kl_to_source") is not None]
    scorer = {name: [r.get("scorer", {}).get(name) or [] for r in records] for name in ("n", "b")}
    panels = [name for name, present in (("loss", train or held), ("kl", kl),
              ("n", any(scorer["n"])), ("b", any(scorer["b"]))) if present]  # fmt: skip
    fig = Figure(figsize=(2.9 * max(len(panels), 1) + 0.6, 2.9))
    axes = dict(zip(panels, fig.subplots(1, len(panels), squeeze=False)[0])) if panels else {}
    if "loss" in axes:
        ax = axes["loss"]
        if train:
            ax.plot(*zip(*train), marker=".", label="train (that step)")
        if held:
            ax.plot(*zip(*held), marker=".", label="held-out")
        ax.set_title("loss", size=9)
        ax.set_ylabel("loss (nats/token)", size=8)
        ax.legend(fontsize=7)
        plain_y(ax)
    if "kl" in axes:
        axes["kl"].semilogy(*zip(*kl), marker=".")
        axes["kl"].set_title("KL to the source model", size=9)
        axes["kl"].set_ylabel("KL (nats/token)", size=8)
    for name in ("n", "b"):
        if name not in axes:
            continue
        ax, per_step = axes[name], scorer[name]
        layers = max(len(v) for v in per_step)
        for layer in range(layers):
            values = [v[layer] if layer < len(v) else float("nan") for v in per_step]
            ax.plot(steps, values, lw=0.8, color=LAYERS(layer / max(layers - 1, 1)))
        finite = [x for v in per_step for x in v if x > 0]
        if finite and max(finite) > 10 * min(finite):  # log only for a wide range; else ticks read 1.7×10⁰
            ax.set_yscale("log")
        ax.set_title(f"SSA {name} per layer", size=9)
        ax.set_ylabel(name, size=8)
        plain_y(ax)
        if layers > 1:
            layer_bar(fig, [ax], layers)
    for ax in axes.values():
        ax.set_xlabel("step", size=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def trajectory_notes(records: list[dict[str, Any]]) -> list[str]:
    """What the trajectory figure leaves out, and why (no panel is drawn empty)."""
    notes = []
    if not any(r.get("kl_to_source") is not None for r in records):
        notes.append("no KL to the source model was recorded (not a language model, or no source)")
    if not any((r.get("scorer") or {}).get("n") for r in records):
        notes.append("no SSA n or b per layer (the scorer has none)")
    return notes


def no_quality_note(report: dict[str, Any]) -> str:
    """Why a report has no quality table: which models get which measures, and what these are."""
    kind = report.get("before", {}).get("kind", "?")
    if kind in (ModelKind.CAUSAL, ModelKind.MASKED):
        why = "--no-builtin and no --text-id / --text-ood / --pairs"
        if report.get("notes"):
            why = "; ".join(report["notes"])
        return f"no quality measures: {why}"
    return (
        f"no quality measures for {kind} models: language models get perplexity and minimal pairs, "
        "ICL models their error"
    )


def render_report(report: dict[str, Any], console: Console) -> None:
    """Header, the quality table (BEFORE, AFTER, Δ per measure; with CONTROL its values and AFTER's
    change relative to it too), the lm-eval benchmarks (when run), then the probe comparison (and
    with CONTROL a second one: CONTROL as A, AFTER as B). With CONTROL the report opens with the
    decision (:mod:`ssacli.report.decision`), the detail after it."""
    render_decision(report, console)
    console.print(facts_panel(header_facts(report), report_title(report)))
    table = quality_table(report)
    if table is None:
        console.print(Text(no_quality_note(report), style="dim"))
    else:
        console.print(table)
    for against in ("before", "control"):
        benchmarks = benchmark_table(report, against)
        if benchmarks is not None:
            console.print(benchmarks)
    trajectory = trajectory_table(trajectory_of(report))
    if trajectory is not None:
        console.print(trajectory)
    monitored = monitor_table(report)
    if monitored is not None:
        console.print(monitored)
    render_comparison(*report_results(report), console)
    if report.get("diagnose_control") is not None:
        console.print(Text(CONTROL_PROBES, style="bold"))
        render_comparison(*report_results(report, "diagnose_control"), console)


def report_html(report: dict[str, Any]) -> str:
    """One page: the report's head, the quality table, then the diagnose comparison's sections."""
    sections = [Section(report_title(report), [facts_table(header_facts(report))], level=1)]
    if report.get("decision"):
        sections.append(decision_section(report["decision"]))
    if report.get("quality"):
        header, cells, classes = quality_columns(report)
        header = [name.strip().replace("\n", " ") for name in header]
        sections.append(Section("quality", [html_table(header, cells, classes)]))
    else:
        note = f'<p class="note">{escape_html(no_quality_note(report))}</p>'
        sections.append(Section(None, [note]))
    for against in ("before", "control"):
        benchmarks = benchmark_section(report, against)
        if benchmarks is not None:
            sections.append(benchmarks)
    records = trajectory_of(report)
    if records:
        header, rows = trajectory_columns(records)
        header = [name.replace("\n", " ") for name in header]
        figure = png_img(trajectory_figure(records), "fine-tuning trajectory", dpi=REPORT_DPI)
        notes = [f'<p class="note">{escape_html(note)}</p>' for note in trajectory_notes(records)]
        body = [figure, *notes, html_table(header, rows)]
        sections.append(Section("fine-tuning trajectory (AFTER)", body))
    monitored = monitor_section(report)
    if monitored is not None:
        sections.append(monitored)
    sections.append(Section("attention probes (A = BEFORE, B = AFTER)"))
    sections += comparison_sections(*report_results(report), head_level=3)
    if report.get("diagnose_control") is not None:
        sections.append(Section(CONTROL_PROBES))
        sections += comparison_sections(*report_results(report, "diagnose_control"), head_level=3)
    title = f"ssacli report: {report['before']['model']} → {report['after']['model']}"
    return page(title + (f" vs {report['control']['model']}" if has_control(report) else ""), sections)
