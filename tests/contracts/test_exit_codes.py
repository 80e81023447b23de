"""`ssacli check`'s exit codes have one owner (ssacli.errors.CHECK_EXIT_CODES): its --help, README
and docs (ci.md's table, commands.md) list the same codes with the same meanings (issue 51)."""

from __future__ import annotations

import re
from pathlib import Path

from ssacli.errors import CHECK_EXIT_CODES, check_exit_codes_text
from tests.helpers.cli import run_main

ROOT = Path(__file__).resolve().parents[2]


def _flat(text: str) -> str:
    """Text with rich's box drawing and every run of whitespace as one space (help wraps lines)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_check_help_lists_every_exit_code_of_the_owner(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(["check", "--help"], monkeypatch, capsys)
    assert code == 0
    assert f"Exit codes: {check_exit_codes_text()}." in _flat(out)


def test_readme_and_commands_say_the_owners_codes():
    for doc in ("README.md", "docs/commands.md"):
        text = _flat((ROOT / doc).read_text())
        # the sentence that lists check's codes, from its first code to its last
        first, last = CHECK_EXIT_CODES[0], CHECK_EXIT_CODES[-1]
        said = re.search(rf"own exit codes[^:]*: ({first[0]} .*?{last[0]} {re.escape(last[1])})", text)
        assert said is not None, f"{doc} does not list check's exit codes up to {last}"
        assert said.group(1) == check_exit_codes_text(), doc


def test_ci_table_has_a_row_per_code_of_the_owner():
    text = (ROOT / "docs/ci.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = [int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)]
    assert rows == [code for code, _ in CHECK_EXIT_CODES]
