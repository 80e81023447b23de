"""The decision block that opens ``ssacli report BEFORE AFTER CONTROL`` (terminal and HTML): one
line per question with its interval, then the recommendation by the rule of
docs/results/convert-tradeoff.md. It reads only ``report["decision"]``
(:func:`ssacli.quality.decision.conversion_decision`), so ``--json`` holds the same decision.
"""

from __future__ import annotations

from html import escape
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..quality.tradeoff import MAX_RATIO, MIN_KL_DROP, percent
from .html import Section, html_table

STYLES = {"AFTER better": "green", "CONTROL better": "red"}
RULE_TEXT = (f"the rule of docs/results/convert-tradeoff.md: output KL under key-scale σ = 8 lower "
             f"(interval below 0) by ≥ {percent(MIN_KL_DROP, sign=False)} on average, and in-domain "
             f"perplexity at most ×{MAX_RATIO:g} the control's (upper bound)")  # fmt: skip


def decision_columns(decision: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, one row per question (question, AFTER vs CONTROL, 95 % interval, over, reads) and
    each row's reading ("AFTER better", "CONTROL better", "no difference shown", "no interval").
    The terminal leaves "over" to :func:`units_text`, so that 80 columns hold a row on one line."""
    level = percent(decision.get("level", 0.95), sign=False)
    header = ["question", "AFTER vs\nCONTROL", f"{level}\ninterval", "over", "reads"]
    rows, reads = [], []
    for q in decision["questions"]:
        value, low, high = q["value"], q["low"], q["high"]
        if q["kind"] == "ratio":
            shown = "–" if value is None else f"×{value:.3f}"
            interval = "–" if low is None else f"[{low:.3f}, {high:.3f}]"
        else:
            shown = "–" if value is None else percent(value)
            interval = "–" if low is None else f"[{percent(low)[:-2]}, {percent(high)}]"
        over = f"{q['units']} {q['unit']}" if q.get("unit") else "–"
        rows.append([q["label"], shown, interval, over, q["reads"]])
        reads.append(q["reads"])
    return header, rows, reads


def units_text(decision: dict[str, Any]) -> str:
    """What the intervals are over: "intervals paired over the same 261, 130 text windows (ppl) and
    8 prompts (output KL)"."""
    over: dict[str, list[str]] = {}
    for q in decision["questions"]:
        if q.get("unit"):
            over.setdefault(q["unit"], []).append(str(q["units"]))
    what = {"windows": "text windows (ppl)", "prompts": "probe prompts (output KL)"}
    parts = [f"{', '.join(dict.fromkeys(n))} {what.get(unit, unit)}" for unit, n in over.items()]
    level = percent(decision.get("level", 0.95), sign=False)
    head = f"{level} intervals, AFTER − CONTROL paired over the same "
    return head + " and ".join(parts) + "; ratio < 1 or change < 0: AFTER better" if parts else ""


def recommendation_text(decision: dict[str, Any]) -> str:
    """The recommendation line: the rule's verdict on these numbers, and why."""
    rule = decision["rule"]
    if rule["recommended"] is True:
        head = "SSA (AFTER) is recommended over the control"
    elif rule["recommended"] is False:
        head = f"not recommended ({rule['verdict']}): fine-tune softmax (CONTROL) instead"
    else:
        head = "undecided: this run's intervals cannot decide"
    return f"{head}; {rule['why']}"


def decision_panel(decision: dict[str, Any]) -> Panel:
    """The block: the questions' table, what was not measured, the recommendation and the rule."""
    header, rows, reads = decision_columns(decision)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column(header[0], overflow="fold")
    for name in header[1:3]:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column(header[4], overflow="fold")
    for row, read in zip(rows, reads):
        table.add_row(*row[:3], Text(row[4], style=STYLES.get(read, "")))
    parts: list[Any] = [table]
    units = units_text(decision)
    parts += [Text(line, style="dim") for line in ([units] if units else []) + decision["notes"]]
    style = {True: "bold green", False: "bold red"}.get(decision["rule"]["recommended"], "bold yellow")
    parts.append(Text("recommendation: " + recommendation_text(decision), style=style))
    parts.append(Text(RULE_TEXT, style="dim"))
    title = "decision: AFTER against CONTROL, from this run"
    return Panel(Group(*parts), title=title, title_align="left")


def decision_section(decision: dict[str, Any]) -> Section:
    """The block as an HTML section: the questions' table, the notes, the recommendation."""
    header, rows, reads = decision_columns(decision)
    css = {"AFTER better": "better", "CONTROL better": "worse"}
    classes = [["", "", "", "", css.get(r, "")] for r in reads]
    body = [html_table([h.replace("\n", " ") for h in header], rows, classes)]
    body += [f'<p class="note">{escape(note)}</p>' for note in decision["notes"]]
    body.append(f"<p><b>recommendation:</b> {escape(recommendation_text(decision))}</p>")
    body.append(f'<p class="note">{escape(RULE_TEXT)}</p>')
    return Section("decision: AFTER against CONTROL, from this run", body)


def render_decision(report: dict[str, Any], console: Console) -> None:
    if report.get("decision"):
        console.print(decision_panel(report["decision"]))


__all__ = [
    "decision_columns",
    "decision_panel",
    "decision_section",
    "recommendation_text",
    "render_decision",
    "units_text",
]
