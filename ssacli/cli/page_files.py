"""The files of a command that reports as a page (diagnose, report): its JSON document (``--json``),
its HTML page (``--html``), its figures (``--png`` / ``--svg``) and ``--overwrite``, as one value
of options (:class:`PageFiles`), checked before any work and written only once every one of them
has been rendered, so a failure leaves no file behind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from .options import check_outputs, figure_folder, output_file, overwrite_files
from .outputs import check_figure_outputs, figure_outputs, write_figure_outputs, write_output


@dataclass(frozen=True)
class PageFiles:
    """A page's files, each None when not asked for; the JSON and HTML help name what each command
    writes (its ``options(PageFiles, json_out={"help": …}, …)``)."""

    json_out: Path | None = output_file("--json", "Write the result as JSON to this file; - for stdout.")
    html_out: Path | None = output_file("--html", "Write a self-contained HTML page to this file.")
    overwrite: bool = overwrite_files()
    png: Path | None = figure_folder("PNG")
    svg: Path | None = figure_folder("SVG")

    def check(self) -> None:
        """Each file can be written, and replaces no file ssacli did not write (unless --overwrite):
        checked before anything heavy is imported."""
        check_outputs(("--json", self.json_out), ("--html", self.html_out), overwrite=self.overwrite)
        check_figure_outputs(self.png, self.svg)

    def write(
        self,
        console: Console,
        document: Callable[[], str],
        page: Callable[[], str],
        figures: Callable[[], list],
    ) -> None:
        """Render the files asked for (``document()``: the JSON text, ``page()``: the HTML,
        ``figures()``: the named figures), then write them all."""
        outputs = []
        if self.json_out is not None:
            outputs.append((document(), self.json_out))
        if self.html_out is not None:
            outputs.append((page(), self.html_out))
        rendered = figure_outputs(figures, self.png, self.svg)
        for text, path in outputs:
            write_output(text, path, console)
        write_figure_outputs(rendered, console)
