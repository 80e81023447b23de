"""One definition per word (issue 51): Gu et al.'s count (mean weight on the first token > SINK_EPS,
`sink_rate`) and the head class "sink" (at least half the mass on the first k tokens, the first
class that holds) measure different things, so they carry two names: the findings, --compare and
the docs call the first "first-token heads" and keep "sink" for the class, and the class legend says
the two are different counts. A BERT read "37 of 72 heads are attention sinks" beside "12 sink"."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import ssacli
from ssacli.defaults import SINK_EPS
from ssacli.diagnosis.positions import HEAD_CLASSES
from ssacli.report.terminal import render_diagnose

ROOT = Path(__file__).resolve().parents[2]
COUNTED = re.compile(r"\d+ of \d+ heads are ([^(;,]+)")  # "37 of 72 heads are WHAT"


def _class_word(text: str) -> str | None:
    """The head class a phrase names, if any ("attention sinks" names sink)."""
    return next((c for c in HEAD_CLASSES if re.search(rf"\b{c}s?\b", text)), None)


@pytest.fixture(scope="module")
def result():
    return ssacli.diagnose("builtin:wikitext-softmax", ["key-scale:1,4"], samples=2, length=64)


def test_the_findings_count_first_token_heads_not_the_sink_class(result):
    finding = next(f for f in result.findings() if f["kind"] == "sink_heads")
    base = next(p for p in result.probes if "sink_rate" in p.metrics)
    count = int(np.nansum(base.metrics["sink_rate"][0]))  # Gu's heads, from the metric itself
    assert finding["value"] == count and finding["eps"] == SINK_EPS
    named = COUNTED.search(finding["text"]).group(1)
    assert "first-token" in named and _class_word(named) is None, finding["text"]


def test_no_count_of_heads_borrows_a_class_name_in_the_report(result):
    console = Console(record=True, width=80, color_system=None, file=io.StringIO())
    render_diagnose(result, console)
    text = " ".join(console.export_text().split())
    assert result.position_profiles() is not None and "heads: " in text  # the class table is there
    for named in COUNTED.findall(text):
        assert _class_word(named) is None, named
    assert "first-token heads are another count" in text  # the class legend says which is which


def test_docs_give_the_two_measures_two_names():
    text = " ".join((ROOT / "docs/diagnose.md").read_text().split())
    row = text.split("| `sink_rate` |")[1].split("|")[0]  # the metric table's definition cell
    assert "first-token head" in row
    assert "sink heads at baseline" not in text and "share of sink heads" not in text
