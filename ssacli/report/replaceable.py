"""Which existing output files ssacli may replace: the one owner of that rule, torch-free, so every
command checks its outputs before the model stack loads (``ssacli.preflight.check_replaceable_file``).

A file is ssacli's to replace when it is empty or ssacli wrote it, as told by what ssacli puts at its
start: a JSON document whose ``schema`` is one of ssacli's (every one is named ``ssacli-…``), an HTML
page that begins as :data:`PAGE_HEAD` with a title starting "ssacli", a frame CSV with its header
line or a Parquet file with ssacli's metadata (:func:`ssacli.diagnosis.frames.frame_written_by_ssacli`),
a JUnit file whose suite is :data:`ssacli.check.JUNIT_SUITE`, a figure with ssacli's mark
(:func:`ssacli.report.figure_files.figure_written_by_ssacli`). Anything else is the user's: replaced
only when they say so (``overwrite``, ``--overwrite``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..check import JUNIT_SUITE
from ..errors import UsageError
from .figure_files import figure_written_by_ssacli

# How every page ssacli writes begins (its titles start with "ssacli"; ssacli.report.html.page).
PAGE_HEAD = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
SCHEMA_PREFIX = "ssacli-"  # every JSON document ssacli writes names its schema so
HEAD = 4096  # what is read of a file to tell whose it is
_SCHEMA_FIRST = re.compile(r'\A\s*\{\s*"schema"\s*:\s*"' + re.escape(SCHEMA_PREFIX))
_WHAT = {
    "json": "a JSON document", "html": "an HTML page", "csv": "a table CSV", "parquet": "a Parquet table",
    "junit": "a JUnit report", "plot": "a figure",
}  # fmt: skip


def output_kind(option: str) -> str:
    """The kind of file an output option writes: ``--json`` → "json", …"""
    kind = option.lstrip("-")
    if kind not in _WHAT:
        raise ValueError(f"no rule for which {option} files ssacli wrote")
    return kind


def written_by_ssacli(path: str | Path, kind: str) -> bool:
    """Whether the existing file ``path`` is an output of ``kind`` (an option's name without dashes:
    "json", "html", "csv", "parquet", "junit", "plot") that ssacli wrote, or empty."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return True
        if kind in ("csv", "parquet"):
            from ..diagnosis.frames import frame_written_by_ssacli  # numpy: only for a table

            return frame_written_by_ssacli(path, kind)
        if kind == "plot":
            return figure_written_by_ssacli(path)
        with path.open("rb") as handle:
            head = handle.read(HEAD).decode("utf-8", errors="replace")
    except OSError:
        return False
    if kind == "html":
        return head.startswith(PAGE_HEAD + "<title>ssacli")
    if kind == "junit":
        return f'<testsuite name="{JUNIT_SUITE}"' in head
    if _SCHEMA_FIRST.match(head):
        return True
    return _schema(path).startswith(SCHEMA_PREFIX)


def check_replaceable(path: str | Path | None, option: str, overwrite: bool = False) -> None:
    """Refuse (UsageError, exit 2) before any work when the output ``path`` of ``option`` exists and
    ssacli did not write it, unless ``overwrite``; None, ``-`` (stdout) or a new path passes."""
    if overwrite or path is None or str(path) == "-":
        return
    path = Path(path).expanduser()
    if not path.is_file():
        return
    kind = output_kind(option)
    if not written_by_ssacli(path, kind):
        raise UsageError(
            f"{option} '{path}' exists and is not {_WHAT[kind]} ssacli wrote; ssacli replaces only its own "
            "outputs: choose another name, remove it, or pass --overwrite to replace it"
        )


def _schema(path: Path) -> str:
    """The ``schema`` of a JSON document whose keys another writer ordered (a document of ssacli's
    that a user reformatted); "" for anything else."""
    try:
        if path.stat().st_size > 64 * 2**20:  # no document of ssacli's is that large
            return ""
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    schema = data.get("schema") if isinstance(data, dict) else None
    return schema if isinstance(schema, str) else ""
