"""What the CLI says, on real runs: --debug in either position keeps the documented exit code;
convert --text with binary data is an input error; convert's closing sentence agrees with its own
table; icl sweep says its plan first and a line per run off a terminal; icl eval on a language
model names the kind it needs; scorers SPEC shows the options as they act."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from ssacli.cli import app
from ssacli.cli.convert import fidelity_lines
from ssacli.defaults import MAX_KL_PER_TOKEN
from ssacli.errors import EXIT_INPUT, EXIT_USAGE
from tests.helpers.cli import run_main

runner = CliRunner()


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in stderr, stderr
    return lines[0]


# ---- --debug, before or after the command ------------------------------------------------------------


@pytest.mark.parametrize(
    "args, code, error",
    [
        (["scorers", "ssa:bogus=1"], EXIT_USAGE, "SpecError"),
        (["diagnose", "/nowhere/model"], EXIT_INPUT, "InputError"),
    ],
    ids=["usage error", "input error"],
)
def test_debug_before_or_after_the_command_shows_the_traceback_and_keeps_the_exit_code(
    args, code, error, monkeypatch, capsys
):
    exit_code, _, stderr = run_main(args, monkeypatch, capsys)
    assert exit_code == code
    plain = one_error_line(stderr)
    for where in (["--debug", *args], [*args, "--debug"]):
        exit_code, _, stderr = run_main(where, monkeypatch, capsys)
        assert exit_code == code, where
        assert "Traceback (most recent call last)" in stderr and f"{error}:" in stderr, where
        assert stderr.rstrip().splitlines()[-1] == plain, where  # the same line closes it


def test_debug_after_the_command_is_accepted_on_success():
    result = runner.invoke(app, ["scorers", "ssa", "--debug"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ssa:")


# ---- convert --text with binary data --------------------------------------------------------------


def test_convert_text_with_binary_data_is_an_input_error(tmp_path, monkeypatch, capsys):
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "out"
    args = ["convert", "builtin:every-softmax", "--scorer", "ssa", "--out", str(out), "--text", str(binary)]
    code, stdout, stderr = run_main(args, monkeypatch, capsys)
    assert code == EXIT_INPUT
    line = one_error_line(stderr)
    assert "--text" in line and "not UTF-8" in line and str(binary) in line
    assert stdout == "" and not out.exists()


# ---- convert's closing sentence ------------------------------------------------------------------


def table_rows(output: str) -> list[dict[str, float]]:
    """The per-layer rows convert prints: layer, m, attention-row KL, max |logit|, shift."""
    rows = []
    for line in output.splitlines():
        cells = line.split()
        if len(cells) == 5 and re.fullmatch(r"\d+", cells[0]):
            m, kl, peak = (float(c) for c in cells[1:4])
            rows.append({"m": m, "attention_kl": kl, "max_abs_logit": peak})
    return rows


def closing_sentence(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("m=auto chose"))


def assert_sentence_agrees_with_the_table(output: str) -> str:
    rows, sentence = table_rows(output), closing_sentence(output)
    assert rows
    reaches_m = any(r["max_abs_logit"] >= r["m"] for r in rows)
    rows_moved = any(r["attention_kl"] > MAX_KL_PER_TOKEN for r in rows)
    assert ("Not softmax in practice" in sentence) == reaches_m, sentence
    assert ("softmax in practice until" in sentence) == (not reaches_m and not rows_moved), sentence
    assert ("far above" in sentence) is False  # the old claim, whatever the numbers
    return sentence


@pytest.mark.parametrize("max_error", ["10", "1e-5"], ids=["m=1, logits above m", "large m"])
def test_convert_closing_sentence_says_what_its_table_says(max_error, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = ["convert", "builtin:wikitext-softmax", "--scorer", "ssa:init=faithful", "--out", str(out)]
    code, stdout, stderr = run_main([*args, "--max-error", max_error, "--device", "cpu"], monkeypatch, capsys)
    assert code == 0, stderr
    sentence = assert_sentence_agrees_with_the_table(stdout)
    rows = table_rows(stdout)
    if max_error == "10":  # the loosest target: m = 1 everywhere, every logit past it
        assert {r["m"] for r in rows} == {1.0} and "Not softmax in practice" in sentence
        assert all(f"{i} (" in sentence for i in range(len(rows)))  # names every layer
    else:
        assert min(r["m"] for r in rows) >= 64 and "softmax in practice until" in sentence


def test_convert_closing_sentence_when_only_the_rows_moved():
    layers = [
        {"layer": 0, "m": 32.0, "attention_kl": 0.0033, "max_abs_logit": 13.4, "shift_at_max": 2.2},
        {"layer": 1, "m": 64.0, "attention_kl": 0.0004, "max_abs_logit": 11.7, "shift_at_max": 0.95},
    ]
    target = {"metric": "kl_per_token", "max": 1e-3, "met": True}
    report = {"from": "softmax", "to": "ssa:init=faithful", "kl_per_token": 8e-4, "top1_agreement": 0.98,
              "tokens": 512, "target": target, "layers": layers}  # fmt: skip
    sentence = closing_sentence("\n".join(fidelity_lines(report)))
    assert "m = 32, 64" in sentence and "max |logit| / m ≤ 0.42" in sentence  # 13.4 / 32
    assert "KL up to 0.0033 (layer 0, above 0.001)" in sentence and "by up to 2.2" in sentence
    assert "Not softmax" not in sentence and "softmax in practice until" not in sentence


# ---- icl sweep, icl eval -----------------------------------------------------------------------------


def test_icl_sweep_says_its_plan_first_and_a_line_per_finished_run(tmp_path):
    args = ["icl", "sweep", "--task", "every", "--scorer", "softmax", "--scorer", "ssa", "--seeds", "1"]
    args += ["--steps", "2", "--prompts", "4", "--device", "cpu", "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()  # CliRunner's stdout is no terminal
    assert lines[0] == "2 runs (1 task × 2 arms × 1 seed), 1 at a time; a line as each run finishes"
    assert lines[1].startswith("[1/2] every-softmax-s0: final loss ")
    assert lines[2].startswith("[2/2] every-ssa-s0: final loss ")
    assert lines[3].startswith("wrote ") and len(lines) == 4
    assert (tmp_path / "figures" / "every-sigma-paired.png").stat().st_size > 1000  # drawn by the command
    assert not any("\x1b" in line or "\r" in line for line in lines)  # plain lines, no live display


def test_icl_eval_on_a_language_model_says_it_needs_an_icl_model(tmp_path, monkeypatch, capsys):
    code, stdout, stderr = run_main(["icl", "eval", "builtin:wikitext-softmax"], monkeypatch, capsys)
    assert code == EXIT_INPUT and stdout == ""
    line = one_error_line(stderr)
    assert "builtin:wikitext-softmax is a causal model; icl eval needs an ICL model (" in line
    assert "ssacli icl train" in line and "ssacli.json" not in line


# ---- scorers SPEC ------------------------------------------------------------------------------------


def describe(spec: str) -> list[str]:
    result = runner.invoke(app, ["scorers", spec], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return [line.strip() for line in result.output.splitlines()[1:]]


def test_scorers_spec_shows_the_init_that_applies():
    lines = describe("ssa:b=0.5,n=2")
    assert "init = given (b, n)" in lines
    assert not any(line.startswith(("init = paper", "m =")) for line in lines)  # m: init=faithful only
    assert {"b = 0.5", "n = 2.0", "initial b = 0.5 (learned)", "initial n = 2 (learned)"} <= set(lines)
    lines = describe("ssa:b=0.5")  # n still comes from the paper's preset (1.5)
    assert "init = paper (n; b given)" in lines and "initial n = 1.5 (learned)" in lines
    lines = describe("ssa:init=faithful,m=256")  # m applies here, and sets b = 1/m, n = m
    assert {"init = faithful", "m = 256.0", "b = from init=faithful"} <= set(lines)
    assert "initial n = 256 (learned)" in lines
    lines = describe("ssa:init=authors,b=1,n=2")  # authors still sets share and learn
    assert "init = given (b, n); share and learn from init=authors" in lines and "share = layer" in lines
    assert not any(line.startswith("preset =") for line in describe("ssa"))  # init's other name
    info = json.loads(runner.invoke(app, ["scorers", "ssa:b=0.5,n=2", "--json"]).output)
    assert info["options"]["init"] == "paper" and info["applied"]["init"] == "given (b, n)"
