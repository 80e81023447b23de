"""`ssacli attribute` (issue 52, item 5): the command is ``ssacli.attribute_with`` and nothing more
(its lines, its JSON and its table are the API's result for the same settings), the JSON validates
against ssacli/diagnosis/attribution.schema.json and reads back whole, and what the command line
alone decides is refused in one line, with exit 2, before any model loads."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

import ssacli
import ssacli.models.loading
import ssacli.preflight
from ssacli.diagnosis.attribution_result import SCHEMA_FILE, Attribution, SetAttribution
from ssacli.errors import EXIT_UNSUPPORTED, EXIT_USAGE, InputError
from ssacli.report.replaceable import PAGE_HEAD
from tests.helpers.cli import run_main

LM = "builtin:wikitext-softmax"
# 4 prompts of 16 tokens: two halves of 2, sets of 2 heads, 3 random sets each (seconds, not minutes)
SMALL = dict(samples=4, length=16, k=2, null=3, resamples=200, per_head=False, remedy=(2.0,))
FLAGS = ["--samples", "4", "--length", "16", "--k", "2", "--null", "3", "--resamples", "200", "--no-per-head",
         "--remedy", "2"]  # fmt: skip


def _timeless(document: dict) -> dict:
    return {key: value for key, value in document.items() if key != "elapsed_s"}


def test_the_command_prints_writes_and_reads_back_what_the_api_returns(tmp_path, monkeypatch, capsys):
    out, page = tmp_path / "a.json", tmp_path / "a.html"
    args = ["attribute", LM, "--probe", "key-scale:1,8", *FLAGS, "--json", str(out), "--html", str(page)]
    code, stdout, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    expected = ssacli.attribute(LM, "key-scale:1,8", **SMALL)
    printed = stdout.splitlines()
    assert max(len(line) for line in printed if not line.startswith("wrote ")) <= 80  # a path is a path
    for line in expected.lines():  # every set's row, its removed damage, where it falls in its null
        assert line in printed, (line, stdout)
    assert sum("of 3 random layer-matched sets" in line for line in printed) == 2
    assert sum(line.lstrip().startswith("remedy, not attribution: T=") for line in printed) == 2
    document = json.loads(out.read_text())
    assert list(Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).iter_errors(document)) == []
    assert (document["schema"], document["schema_version"]) == ("ssacli-attribution", 1)
    assert _timeless(document) == _timeless(expected.to_dict())
    loaded = Attribution.load(out)
    assert loaded.to_dict() == document and loaded.lines() == expected.lines()
    frame = loaded.to_frame()
    assert list(frame["set"]) == ["chosen on 2", "chosen on 2", "ceiling"]
    assert frame["removed"].tolist() == [one.mean for one in [*expected.sets, expected.ceiling]]
    assert frame["percentile"].tolist()[:2] == [one.percentile for one in expected.sets]
    html = page.read_text()
    assert html.startswith(PAGE_HEAD + "<title>ssacli attribute: " + LM)
    assert "L{}H{}".format(*expected.sets[0].heads[0]) in html
    for option, path in (("--json", out), ("--html", page)):  # its own: the next run may replace them
        ssacli.preflight.check_replaceable_file(path, option)


def test_a_document_of_another_kind_is_not_read_as_an_attribution(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "ssacli-diagnose", "schema_version": 3}))
    with pytest.raises(InputError, match="not an ssacli attribution"):
        Attribution.load(other)
    with pytest.raises(InputError, match="does not exist; write one with `ssacli attribute --json`"):
        Attribution.load(tmp_path / "missing.json")
    newer = {"schema": "ssacli-attribution", "schema_version": 99}
    with pytest.raises(InputError, match="newer ssacli"):
        Attribution.from_dict(newer)


def _no_model_loads(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the command line was checked")

    monkeypatch.setattr(ssacli.models.loading, "load_with", refuse)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--probe", "no-such-probe:1,2"], "unknown probe"),
        (["--probe", "numeric:2,4"], "same tokens at every level"),
        (["--probe", "key-scale:2,8"], "give it, e.g. key-scale:1,8"),
        (["--probe", "key-scale:1,8", "--level", "4"], "level 4 is not among"),
        (["--heads", "2:1"], "head '2:1' is not a head name"),
        (["--probe", "length:1,2", "--random"], "needs text"),
        (["--probe", "logit-scale:1,4", "--remedy", "4"], "undoes logit-scale exactly"),
        (["--remedy", "2,x"], "--remedy '2,x' is not a list of temperatures"),
    ],
)
def test_what_the_command_line_decides_is_refused_in_one_line_before_the_model_loads(
    args, message, monkeypatch, capsys
):
    _no_model_loads(monkeypatch)
    code, _, stderr = run_main(["attribute", LM, *args], monkeypatch, capsys)
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert code == EXIT_USAGE and len(lines) == 1 and "Traceback" not in stderr, (code, stderr)
    assert message in " ".join(lines[0].split()), lines[0]


def test_a_model_that_is_not_a_causal_lm_is_refused_in_one_line(monkeypatch, capsys):
    code, _, stderr = run_main(["attribute", "builtin:every-softmax"], monkeypatch, capsys)
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert code == EXIT_UNSUPPORTED and len(lines) == 1, (code, stderr)
    assert "causal LMs only" in lines[0]


def test_long_head_lists_wrap_within_80_columns():
    """A SmolLM2-sized set (27 heads named like L29H8) with its parts and a remedy: every line fits
    80 columns and no word is lost to the wrapping."""
    heads = [(layer, head) for layer in range(27, 30) for head in range(9)]
    alone = {f"L{layer}H{head}": 0.001 * head for layer, head in heads}
    doses = [{"temperature": t, "removed": 0.01, "interval": (0.0, 0.02)} for t in (2, 4, 8, 16)]
    one = SetAttribution(heads=heads, chosen_on=[0, 1], measured_on=[2, 3], removed=[0.1, 0.2], mean=0.15,
                         interval=(0.1, 0.2), damage=0.3, damage_interval=(0.2, 0.4), share=0.5,
                         per_head=alone, remedy=doses)  # fmt: skip
    result = Attribution(model="m", probe="key-scale", level=8.0, reference_level=1.0, k=27, layers=["a"] * 3,
                         heads=[9] * 3, loss_reference=[1.0] * 4, loss_shifted=[1.3] * 4, damage=[0.3] * 4,
                         damage_interval=(0.2, 0.4), rise=[[0.0] * 9] * 3, sets=[one], ceiling=None,
                         elapsed_s=1.0, settings={})  # fmt: skip
    lines = result.lines()
    assert max(map(len, lines)) <= 80
    words = " ".join(lines).split()
    assert all(name in words for name in (f"L{layer}H{head}" for layer, head in heads))
    assert "T=16" in words and len(lines) > 8
