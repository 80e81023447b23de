"""Where a command's outputs go: a file, or stdout when the file is given as ``-``.

``--json -`` (and ``--html -``, ``--csv -``, ``--junit -``, ``--parquet -``) writes that document to
stdout and everything else the command prints (tables, progress, ``wrote …`` lines, a library's
stray ``print``) to stderr, so ``ssacli diagnose --json - | python -m json.tool`` reads one whole
document. The rule lives here once: :class:`~ssacli.cli.options.HelpCommand` (every command) runs
the command inside :func:`stdout_for_data` when one of its output options is ``-``, and every
command writes its outputs with :func:`write_output` (the training commands' ``--json`` document:
:func:`ssacli.cli.training.run_document`). Torch-free at import, like every module of the CLI.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from ..files import write_bytes, write_text

STDOUT = "-"  # an output file given as "-": written to stdout
# The options whose value may be "-": every file output a command renders in memory first. A
# folder (--out, --png, --svg) or a figure file (--plot, whose suffix picks its format) cannot be.
STDOUT_OPTIONS = ("--json", "--html", "--csv", "--parquet", "--junit")

_DATA_OUT: list[Any] = []  # the real stdout while a command that writes a document there runs


def is_stdout(path: Any) -> bool:
    """Whether an output option's value asks for stdout (``-``)."""
    return path is not None and str(path) == STDOUT


@contextmanager
def stdout_for_data(reserved: bool = True) -> Iterator[None]:
    """While a command that writes a document to stdout runs (``reserved``): ``sys.stdout`` is
    stderr, so rich consoles, ``typer.echo`` and ``print`` all print there without each call
    choosing its stream, and :func:`write_output` alone writes to the real stdout."""
    if not reserved:
        yield
        return
    real = sys.stdout
    _DATA_OUT.append(real)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = real
        _DATA_OUT.pop()


def write_output(content: str | bytes, path: str | Path, console: Console | None = None) -> None:
    """Write an output whole: to stdout for ``-`` (nothing else is printed), else to the file
    ``path`` (atomically, :mod:`ssacli.files`) and say so in a ``wrote PATH`` line."""
    if is_stdout(path):
        stream = _DATA_OUT[-1] if _DATA_OUT else sys.stdout
        if isinstance(content, bytes):
            stream.flush()
            stream.buffer.write(content)
            stream.buffer.flush()
        else:
            stream.write(content)
            stream.flush()
        return
    (write_text if isinstance(content, str) else write_bytes)(content, path)
    (console or Console()).print(f"wrote {path}", highlight=False, soft_wrap=True)


def check_figure_outputs(png: str | Path | None, svg: str | Path | None) -> None:
    """``--png DIR`` / ``--svg DIR`` (None: not asked for), before any work: the folder can be
    written, and no file ssacli would write there is someone else's (exit 4, exit 2)."""
    from ..preflight import check_figure_folder  # torch- and matplotlib-free

    check_figure_folder(png, "--png")
    check_figure_folder(svg, "--svg")


def figure_outputs(figures: Callable[[], list], png: Any, svg: Any) -> list[tuple[bytes, Path]]:
    """The figure files of ``--png`` / ``--svg``, rendered in memory (``figures()``: the named
    figures, drawn only when a folder was given), so that they are written with the other outputs,
    after every output has been rendered."""
    if png is None and svg is None:
        return []
    from .. import figure_files

    return figure_files(figures(), {"png": png, "svg": svg})


def write_figure_outputs(files: list[tuple[bytes, Path]], console: Console | None = None) -> None:
    """Write the figure files and say so once per folder: ``wrote DIR/ (N PNG files: …)``."""
    folders: dict[Path, list[Path]] = {}
    for content, path in files:
        write_bytes(content, path)
        folders.setdefault(path.parent, []).append(path)
    for folder, paths in folders.items():
        kinds = sorted({p.suffix.lstrip(".").upper() for p in paths})
        names = ", ".join(dict.fromkeys(p.stem for p in paths))  # once each, with --png and --svg alike
        line = f"wrote {folder}/ ({len(paths)} {'/'.join(kinds)} files: {names})"
        (console or Console()).print(line, highlight=False, soft_wrap=True)
