"""The report's figures as files (``--png DIR``, ``--svg DIR`` of diagnose, render and report), and
which files there ssacli may replace.

Every figure file says in its own metadata that ssacli wrote it (PNG: the ``Software`` text chunk,
SVG: the ``dc:creator`` title, PDF: its ``Creator``), which is how a later run tells its own files,
which it replaces, from a user's, which it refuses to touch (:func:`check_figure_folder`, before any
work): the rule every output file follows (:func:`ssacli.report.replaceable.check_replaceable`). Only the
names ssacli writes are checked (:data:`NAMES`); other files in the folder are left alone.
Importing this module imports neither matplotlib nor torch, so a bad folder is refused at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..files import check_writable_folder
from ..version import __version__

FORMATS = ("png", "svg")
CREATOR = f"ssacli {__version__}"
# how each format carries CREATOR (matplotlib's metadata keys), and how it reads in the file's head
# (PDF: `icl eval --plot`, whose suffix picks the format)
METADATA = {
    "png": {"Software": CREATOR},
    "svg": {"Creator": CREATOR, "Date": None},  # no date: same bytes
    "pdf": {"Creator": CREATOR, "CreationDate": None},
}
MARKS = {"png": b"tEXtSoftware\x00ssacli ", "svg": b"<dc:title>ssacli ", "pdf": b"/Creator (ssacli "}
# PNG's text chunk precedes IDAT, SVG's <metadata> the drawing; PDF's info dictionary comes last
HEAD = 8192
DPI = 120  # a little finer than the pages' embedded figures: a file is looked at on its own
# The figure names ssacli writes (:func:`ssacli.report.notebook.figure_set`): overview, lines-PROBE,
# heatmap-PROBE, generation, generation-compare, compare-PROBE, compare-control-PROBE, trajectory,
# monitor.
NAMES = re.compile(r"^(overview|generation(-compare)?|trajectory|monitor|(lines|heatmap|compare)-.+)$")


def file_stem(name: str) -> str:
    """A figure name as a file name: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def figure_written_by_ssacli(path: str | Path) -> bool:
    """Whether the existing file ``path`` (.png, .svg or .pdf) is a figure ssacli wrote, or empty."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return True
        with path.open("rb") as handle:
            head = handle.read(HEAD)
            handle.seek(max(0, path.stat().st_size - HEAD))
            tail = handle.read(HEAD)
    except OSError:
        return False
    mark = MARKS.get(path.suffix.lstrip(".").lower(), b"\0never")
    return mark in head or mark in tail


def check_figure_folder(folder: str | Path | None, option: str) -> None:
    """Before any work: ``folder`` (``--png`` / ``--svg``; None: not asked for) can be written, and
    holds no file under a name ssacli would write there that ssacli did not write (UsageError,
    exit 2, naming it); an unwritable folder is an OutputError (exit 4)."""
    if folder is None:
        return
    check_writable_folder(folder, option)
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return
    suffix = "." + option.lstrip("-")
    foreign = sorted(
        p.name
        for p in folder.iterdir()
        if p.suffix == suffix and NAMES.match(p.stem) and p.is_file() and not figure_written_by_ssacli(p)
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (f", … ({len(foreign)} files)" if len(foreign) > 3 else "")
        raise UsageError(
            f"{option} {folder} holds {shown}, which ssacli did not write and would replace; ssacli "
            "replaces only its own figures: move those files or choose another folder"
        )


def figure_bytes(figure: Any, fmt: str) -> bytes:
    """A matplotlib Figure as the bytes of a ``fmt`` file ("png", "svg") marked as ssacli's."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=DPI, bbox_inches="tight", metadata=METADATA[fmt])
    return buffer.getvalue()


def figure_files(
    figures: list[tuple[str, Any]], folders: dict[str, str | Path | None]
) -> list[tuple[bytes, Path]]:
    """Every file to write, rendered in memory first: ``(content, path)`` for each named figure in
    each asked format (``folders``: format → folder, None where not asked). Each path is checked
    again here (another process may have put a file there since :func:`check_figure_folder`)."""
    files = []
    for fmt, folder in folders.items():
        if folder is None:
            continue
        for name, figure in figures:
            path = Path(folder).expanduser() / f"{file_stem(name)}.{fmt}"
            if path.is_file() and not figure_written_by_ssacli(path):
                check_figure_folder(folder, f"--{fmt}")  # raises, naming every such file
            files.append((figure_bytes(figure, fmt), path))
    return files


__all__ = ["FORMATS", "check_figure_folder", "figure_bytes", "figure_files", "figure_written_by_ssacli"]
