"""The command line: version, the scorers table and its JSON, and one-line errors with exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.errors import EXIT_USAGE

runner = CliRunner()


def run_cli(*args):
    """Run the real entry point in a subprocess (what a user's shell sees)."""
    return subprocess.run(
        [sys.executable, "-m", "ssacli", *args], capture_output=True, text=True, timeout=120
    )


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


def test_unknown_command_is_a_usage_error_without_traceback():
    result = run_cli("no-such-command")
    assert result.returncode == EXIT_USAGE
    assert "Traceback" not in result.stderr + result.stdout


def test_entry_point_runs():
    result = run_cli("scorers", "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == len(ssacli.SCORERS)


def test_spec_is_resolved_with_initial_values():
    result = run_cli("scorers", "ssa:init=faithful,m=256", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["spec"] == "ssa:init=faithful,m=256"
    assert abs(info["initial_values"]["b"] - 1 / 256) < 1e-6
    assert abs(info["initial_values"]["n"] - 256) < 1e-3
    assert info["learned"] == ["b", "n"]


def test_bad_spec_is_one_line_with_the_valid_keys_and_exit_code():
    result = run_cli("scorers", "ssa:bogus=1")
    assert result.returncode == EXIT_USAGE
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "bogus" in lines[0] and "valid keys: init, m, b, n, learn, share" in lines[0]
    assert result.stdout == ""


def test_debug_shows_the_traceback():
    result = run_cli("--debug", "scorers", "ssa:bogus=1")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "SpecError" in result.stderr
