"""Nothing hidden (issue 51): the terminal lists the first --findings findings (default
defaults.FINDINGS, most important first) and counts the rest on a last line; JSON and HTML hold all;
the model's own facts (massive activations, sink heads) outrank a probe that cannot test the model."""

from __future__ import annotations

import json
import re

import pytest

import ssacli
from ssacli.defaults import FINDINGS
from ssacli.diagnosis.findings import FINDING_ORDER
from ssacli.errors import EXIT_USAGE
from ssacli.report.html import escape
from tests.helpers.cli import run_main

MORE = re.compile(r"and (\d+) more: --findings all")


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─•]", " ", text).split())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The bundled LM's default probes, saved: a result with more findings than the terminal lists."""
    result = ssacli.diagnose("builtin:wikitext-softmax", samples=2)
    path = tmp_path_factory.mktemp("findings") / "result.json"
    path.write_text(json.dumps(result.to_dict()))
    return result, path


def test_every_finding_is_listed_or_counted(saved, monkeypatch, capsys):
    result, path = saved
    texts = [f["text"] for f in json.loads(path.read_text())["findings"]]
    assert len(texts) > FINDINGS, "the run must have findings beyond the default budget"
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(["render", str(path)], monkeypatch, capsys)
    assert code == 0
    flat = _flat(out)
    assert all(_flat(t) in flat for t in texts[:FINDINGS])
    assert not any(_flat(t) in flat for t in texts[FINDINGS:])
    assert [int(n) for n in MORE.findall(out)] == [len(texts) - FINDINGS]
    code, out, _ = run_main(["render", str(path), "--findings", "all"], monkeypatch, capsys)
    assert code == 0 and all(_flat(t) in _flat(out) for t in texts) and not MORE.search(out)
    code, out, _ = run_main(["render", str(path), "--findings", "1"], monkeypatch, capsys)
    assert code == 0 and _flat(texts[0]) in _flat(out) and _flat(texts[1]) not in _flat(out)
    assert [int(n) for n in MORE.findall(out)] == [len(texts) - 1]


def test_json_and_html_hold_every_finding(saved, tmp_path, monkeypatch, capsys):
    result, path = saved
    texts = [f["text"] for f in result.findings()]
    # one finding per probe the shift did not reach, and the model's own: none may be cut
    absorbed = {p.name for p in result.probes if not p.skipped and p.reached() is False}
    assert absorbed <= {f["probe"] for f in result.findings() if f["kind"] == "absorbed"}
    kinds = {f["kind"] for f in result.findings()}
    assert "massive_activations" in kinds
    if any(p.fading() is not None for p in result.probes):
        assert "fading" in kinds
    html = tmp_path / "out.html"
    code, _, _ = run_main(["render", str(path), "--html", str(html), "--quiet"], monkeypatch, capsys)
    assert code == 0
    page = html.read_text()
    assert page.count("<li>") >= len(texts)
    assert all(escape(t) in page for t in texts)


def test_the_model_facts_outrank_probes_that_cannot_test_it(saved):
    result, _ = saved
    kinds = [f["kind"] for f in result.findings()]
    assert kinds == sorted(kinds, key=FINDING_ORDER.index)
    for fact in ("massive_activations", "sink_heads"):
        if fact in kinds and "absorbed" in kinds:
            assert kinds.index(fact) < kinds.index("absorbed")


@pytest.mark.parametrize("value", ["some", "-1", "1.5"])
def test_a_bad_findings_value_is_a_usage_error(value, saved, monkeypatch, capsys):
    _, path = saved
    code, _, err = run_main(["render", str(path), f"--findings={value}"], monkeypatch, capsys)
    assert code == EXIT_USAGE and "--findings" in err and "all" in err


def test_diagnose_takes_findings(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    args = ["diagnose", "builtin:wikitext-softmax", "--samples", "1", "--length", "16", "--probe",
            "key-scale:1,4", "--findings", "0"]  # fmt: skip
    code, out, _ = run_main(args, monkeypatch, capsys)
    assert code == 0
    counted = [int(n) for n in MORE.findall(out)]
    assert len(counted) == 1 and counted[0] >= 1
