"""The command line: version, the scorers table and its JSON, and one-line errors with exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.errors import EXIT_INPUT, EXIT_USAGE
from tests.helpers.cli import run_main

runner = CliRunner()


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """The console script's main() in this process, as a shell would see it: exit code, stdout, stderr
    (test_entry_point_runs runs `python -m ssacli` itself, once)."""

    def run(*args) -> subprocess.CompletedProcess:
        code, out, err = run_main(list(args), monkeypatch, capsys)
        return subprocess.CompletedProcess(["ssacli", *args], code, out, err)

    return run


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"ssacli {ssacli.__version__}"


def test_scorers_table_lists_every_registered_scorer():
    result = runner.invoke(app, ["scorers"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    for name in ssacli.SCORERS:
        assert name in result.output
    assert len(ssacli.SCORERS) >= 13


def test_scorers_json_is_valid_and_complete():
    result = runner.invoke(app, ["scorers", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == list(ssacli.SCORERS)
    required = {"name", "trainable", "rows_sum_to_one", "shift_invariant", "limit", "fusable", "options"}
    assert all(required <= set(r) for r in rows)
    ssa = next(r for r in rows if r["name"] == "ssa")
    assert ssa["trainable"] == ["b", "n"] and "init" in ssa["options"]


def test_unknown_command_is_a_usage_error_without_traceback(run_cli):
    result = run_cli("no-such-command")
    assert result.returncode == EXIT_USAGE
    assert "Traceback" not in result.stderr + result.stdout


def test_entry_point_runs():
    """`python -m ssacli` in a fresh interpreter: the one test of this file that starts a process."""
    result = subprocess.run([sys.executable, "-m", "ssacli", "scorers", "--json"], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == len(ssacli.SCORERS)


def test_spec_is_resolved_with_initial_values(run_cli):
    result = run_cli("scorers", "ssa:init=faithful,m=256", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["spec"] == "ssa:init=faithful,m=256"
    assert abs(info["initial_values"]["b"] - 1 / 256) < 1e-6
    assert abs(info["initial_values"]["n"] - 256) < 1e-3
    assert info["learned"] == ["b", "n"]


def test_bad_spec_is_one_line_with_the_valid_keys_and_exit_code(run_cli):
    result = run_cli("scorers", "ssa:bogus=1")
    assert result.returncode == EXIT_USAGE
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "bogus" in lines[0] and "valid keys: init, preset, m, b, n, learn, share" in lines[0]
    assert result.stdout == ""


def test_help_keeps_the_brackets_of_option_grammars():
    """Rich markup would read METRIC[@PROBE] as a style tag and drop it."""
    result = runner.invoke(app, ["diagnose", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Heatmap METRIC[@PROBE], e.g. collapse_rate@outlier." in result.output


def test_every_command_that_loads_a_model_takes_trust_remote_code():
    for command in (["diagnose"], ["check"], ["convert"], ["finetune"], ["report"]):
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "--trust-remote-code" in result.output, command


def test_debug_shows_the_traceback(run_cli):
    result = run_cli("--debug", "scorers", "ssa:bogus=1")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "SpecError" in result.stderr


def test_icl_train_then_eval_writes_json_and_figure(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["icl", "train", "--task", "linear", "--scorer", "ssa", "--steps", "5", "--batch-size", "4",
         "--layers", "1", "--width", "8", "--points-start", "3", "--points-end", "5", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").is_file()
    result = runner.invoke(
        app,
        ["icl", "eval", str(out), "--sigma", "1,4", "--length", "5,9", "--outlier", "100@2",
         "--prompts", "16", "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["task"] == "linear" and data["scorer"] == "ssa"
    settings = {(c["sigma"], c["length"], c["outlier"]) for c in data["cells"]}
    assert settings == {(1, 5, None), (1, 9, None), (4, 5, None), (4, 9, None), (1, 5, 100), (1, 9, 100)}
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_icl_eval_of_a_missing_folder_is_an_input_error(tmp_path, run_cli):
    result = run_cli("icl", "eval", str(tmp_path / "nowhere"))
    assert result.returncode == EXIT_INPUT
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_icl_bad_option_values_are_usage_errors(tmp_path, run_cli):
    for args in (
        ["icl", "train", "--task", "nope", "--out", str(tmp_path / "x")],
        ["icl", "train", "--task", "every", "--scorer", "ssa:zzz=1", "--out", str(tmp_path / "x")],
        ["icl", "eval", "builtin:every-softmax", "--outlier", "big@3"],
        ["icl", "eval", "builtin:every-softmax", "--sigma", "a,b"],
    ):
        result = run_cli(*args)
        assert result.returncode == EXIT_USAGE, (args, result.stderr)
        assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "x").exists()


HELP_PROBE = r"""
import json, sys
from ssacli.cli import main
for args in json.loads(sys.argv[1]):
    sys.argv = ["ssacli", *args]
    print("=====", file=sys.stdout, flush=True)
    try:
        main()
    except SystemExit as done:
        code = done.code
    heavy = sorted(m for m in ("torch", "transformers", "safetensors", "numpy") if m in sys.modules)
    print("HEAVY", ",".join(heavy) or "-", "EXIT", code, file=sys.stderr, flush=True)
"""


def test_help_answers_before_torch_is_imported():
    """`--help` (the root's and every command's, the bundled model names included) needs no model
    stack: neither torch nor transformers is imported, so it answers in a fraction of a second. One
    fresh interpreter asks for each help in turn: none may import them, so neither may all of them."""
    asked = [["--help"], ["diagnose", "--help"], ["convert", "--help"], ["check", "--help"],
             ["report", "--help"], ["train", "--help"], ["icl", "--help"]]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", HELP_PROBE, json.dumps(asked)], capture_output=True, text=True, timeout=120
    )
    answers = [line for line in done.stderr.splitlines() if line.startswith("HEAVY")]
    assert answers == ["HEAVY - EXIT 0"] * len(asked), done.stderr[-2000:]
    helps = done.stdout.split("=====")[1:]
    assert len(helps) == len(asked) and all("Usage:" in text for text in helps), done.stdout[-2000:]
