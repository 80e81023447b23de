"""The command line in-process, and an output folder no one can write in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def run_main(args, monkeypatch, capsys) -> tuple[int, str, str]:
    """ssacli.cli.main in-process, as the `ssacli` console script runs it: (exit code, out, err)."""
    from ssacli.cli import main

    monkeypatch.setattr(sys, "argv", ["ssacli", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def unwritable(tmp_path: Path) -> Path:
    """A folder no one can write in: read-only for a user; for root (who writes anywhere) a path
    under a plain file, which no one can create."""
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("x")
        return blocker
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder
