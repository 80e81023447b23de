"""Everything a person reads in a terminal reads at 80 columns: every --help page, the report's
fine-tuning trajectory table, the diagnose tables (titled when they split, legends wrapped to the
terminal). Rendered at a fixed width of 80 (COLUMNS for --help, a rich Console of width 80)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ssacli.cli import app

runner = CliRunner()
WIDTH = 80
COMMANDS = [[], ["scorers"], ["diagnose"], ["attribute"], ["render"], ["check"], ["convert"], ["finetune"],
            ["report"], ["train"], ["icl"], ["icl", "train"], ["icl", "eval"], ["icl", "sweep"]]  # fmt: skip


def help_page(command: list[str], width: int) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "ssacli")
def test_help_fits_80_columns_with_flags_as_flags(command):
    page = help_page(command, WIDTH)
    lines = page.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert "<bool>" not in page  # a flag takes no value
    assert "[[" not in page  # optional arguments read [MODEL], not [[MODEL]]
    assert "--help" in page and "Show this message and exit." in page


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "ssacli")
def test_help_examples_are_never_rewrapped(command):
    """An example line is printed as written: the same lines at 80 columns as at 200, every one
    within 80 (a long command continues on the next line after a backslash, as a shell reads it)."""

    def examples(page: str) -> list[str]:
        return [line.rstrip() for line in page.splitlines() if re.match(r" {3,}(ssacli |--|-r )", line)
                and "│" not in line]  # fmt: skip

    narrow, wide = examples(help_page(command, WIDTH)), examples(help_page(command, 200))
    assert narrow == wide
    for first, after in zip(narrow, narrow[1:]):
        if not after.lstrip().startswith("ssacli "):  # a continuation line follows a backslash
            assert first.endswith("\\"), (first, after)


def test_help_text_gets_most_of_the_option_panel():
    """The options' help starts left of the middle of the panel, so no word of it is cut: the
    --scorer help shows its whole example spec (it read `m=2…` with a 30-column text column)."""
    page = help_page(["convert"], WIDTH)
    assert "ssa:init=faithful,m=256." in page and "…" not in page
    for option, text in (
        ("--offline", "Never download"),
        ("--overwrite", "Replace"),
        ("--quiet", "No progress"),
    ):
        line = next(line for line in page.splitlines() if option in line)
        assert line.index(text) < WIDTH // 2 + 6, line
    diagnose = help_page(["diagnose"], WIDTH)
    line = next(line for line in diagnose.splitlines() if "--samples" in line)
    assert line.index("Sequences") <= WIDTH // 2, line


def test_help_prose_is_reflowed_to_the_terminal():
    """Paragraphs wrap at the terminal's width, not at the docstring's line breaks (which left a
    line reading just `Only the` at 80 columns): every line of a paragraph but its last is full."""
    lines = [line.rstrip() for line in help_page(["check"], WIDTH).splitlines()]
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("A requirement is"))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    paragraph = lines[start:end]
    assert len(paragraph) >= 3
    assert all(len(line) >= WIDTH - 15 for line in paragraph[:-1]), paragraph


def render(table_or_tables, width: int = WIDTH) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    for table in table_or_tables if isinstance(table_or_tables, list) else [table_or_tables]:
        console.print(table)
    return console.export_text()


def test_trajectory_table_reads_at_80_columns():
    """The widest cells a run writes (5-digit steps, a KL in scientific notation, n with its
    min–max over layers) fit 80 columns, whole: it read `st…`, `held-out lo…`, `4.9…`."""
    from ssacli.report.before_after import trajectory_columns, trajectory_table

    scorer = {"n": [4.12345, 3.98765, 12.5], "b": [0.243112, 0.25, 0.08]}
    records = [{"step": step, "loss": 4.91234, "heldout_loss": 4.98765, "kl_to_source": 1.23456e-05,
                "top1_agreement": 0.9987, "scorer": scorer} for step in (0, 10000, 20000)]  # fmt: skip
    text = render(trajectory_table(records))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH and "…" not in text
    assert lines[0].startswith("fine-tuning trajectory (AFTER)")
    for cell in trajectory_columns(records)[1][-1]:
        assert cell in text, cell  # every cell whole: "20000", "4.912", "1.23e-05", "6.87 (3.99–12.5)"
    for word in ("step", "held-out", "loss", "KL to", "source", "top-1", "n mean", "(min–max)"):
        assert word in text


def test_diagnose_tables_are_titled_and_legends_wrap_at_the_terminal():
    """A table that splits at 80 columns titles its second part; a legend wraps at 80, not at a
    narrow table's edge (the most-saturated title broke at 52 columns)."""
    from ssacli.report.terminal import render_diagnose
    from tests.helpers.report_fixtures import wide_result

    console = Console(record=True, width=WIDTH, color_system=None, file=io.StringIO())
    render_diagnose(wide_result(), console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH and "…" not in text
    heads = [i for i, line in enumerate(lines) if line.strip().startswith("level ")]
    assert len(heads) >= 2 and "dominant-key · model means (continued)" in text  # it did split
    for i in heads:  # every table's header row has a title just above (a rule and a blank between)
        assert lines[i - 2].strip() and not lines[i - 2].startswith(" "), lines[i - 2 : i + 1]
    title = next(line for line in lines if line.startswith("most saturated heads"))
    assert title.strip().endswith("differ most)")  # one line: it is shorter than the terminal


def test_report_quality_table_with_a_control_reads_at_80_columns():
    """`ssacli report BEFORE AFTER CONTROL`: seven columns, every number as wide as fmt_value and
    fmt_change write them (9 characters) and the longest labels, fit 80 columns with no cell cut;
    only a label wraps."""
    from ssacli.report.before_after import fmt_change, fmt_value, quality_table

    labels = ["minimal pairs (built-in): accuracy", "  determiner_noun_agreement_with_adj_irregular_1",
              "OOD − in-dist. NLL", "in-dist. text: perplexity"]  # fmt: skip
    rows = [{"key": f"k{i}", "label": label, "before": 12345.678, "after": -0.000123456, "control": 1.5e-9,
             "delta": -12345.678123, "delta_control": -0.0001234575, "better": "higher" if i else "lower"}
            for i, label in enumerate(labels)]  # fmt: skip
    report = {"control": {"model": "c"}, "quality": rows}
    text = render(quality_table(report))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH and "…" not in text
    for row in rows:
        cells = [fmt_value(row[k]) for k in ("before", "after", "control")]
        cells += [fmt_change(row["delta"]), fmt_change(row["delta_control"]), row["better"]]
        assert max(map(len, cells[:5])) >= 9  # as wide as numbers get
        assert any(line.split()[-6:] == cells for line in lines), cells  # whole, in order, on one line
    rule = next(i for i, line in enumerate(lines) if "───" in line)
    measure = "".join(re.split(r"\s{2,}", line.strip())[0] for line in lines[rule + 1 :])
    for label in labels:  # a wrapped label keeps every character
        assert label.replace(" ", "") in measure.replace(" ", ""), label
