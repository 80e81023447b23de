"""docs/notebooks.md as a notebook, executed headless (nbclient, an IPython kernel): each python
block is a cell, in order, and each cell must display what the page says it does — the result's
verdict as HTML, the figure as a PNG, the check's pass or fail. The verdict the kernel displays is
compared with a diagnose run here, in this process, with the same arguments."""

from __future__ import annotations

import base64
import html

import pytest

import ssacli
from tests.helpers import docs_blocks as db

nbformat = pytest.importorskip("nbformat", reason='pip install "ssacli[dev]" (nbclient, nbformat, ipykernel)')
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

PAGE = "docs/notebooks.md"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cells() -> list[str]:
    blocks = [b for b in db.all_blocks() if b.id.startswith(PAGE) and b.kind == "python"]
    assert len(blocks) == 3, [b.id for b in blocks]
    return [b.code for b in blocks]


def shown(cell, mime: str) -> str:
    """What a cell displayed as ``mime`` (its result, or display calls), joined."""
    found = [o["data"][mime] for o in cell.outputs if "data" in o and mime in o["data"]]
    assert found, (mime, cell.outputs)
    return "".join(found)


def test_the_notebook_page_runs_headless_and_each_cell_displays_its_result(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in cells()])
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # a cell that raises fails here (CellExecutionError)
    diagnosed, drawn, checked = notebook.cells
    page = shown(diagnosed, "text/html")
    assert page.startswith('<div class="ssacli-output">')
    reference = ssacli.diagnose("builtin:wikitext-softmax", ["key-scale:1,8"], samples=2, length=64)
    verdict = reference.verdicts()["key-scale"]["text"]
    assert html.escape(verdict, quote=True) in page[: page.index("<details>")]
    assert base64.b64decode(shown(drawn, "image/png")).startswith(PNG_MAGIC)
    assert (tmp_path / "key-scale.png").read_bytes().startswith(PNG_MAGIC)
    gate = shown(checked, "text/html")
    assert "collapse_rate@key-scale:8 max &lt;= 0.5" in gate
    assert ("<th>PASS</th>" in gate) != ("<th>FAIL</th>" in gate)  # exactly one of the two
