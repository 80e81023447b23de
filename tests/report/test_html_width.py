"""The HTML pages fit a 1280-px browser window, measured in headless Chromium by
scripts/check_html_width.py. Marked ``slow`` and skipped without a Chromium binary (CI has none):
``apt-get install chromium-headless-shell``, then
``python -m pytest -m slow tests/report/test_html_width.py``.

The checker is first held to pages whose geometry is known by hand; then the real page builders
render the committed SmolLM2 result with every metric set to the longest number ``fmt`` writes,
so every column a table can have is there at its widest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ssacli import DiagnoseResult
from ssacli.report.html import comparison_html, diagnose_html

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "scripts" / "check_html_width.py"
SMOLLM2 = ROOT / "docs" / "examples" / "smollm2-diagnose.json"
sys.path.insert(0, str(CHECKER.parent))
from check_html_width import find_chromium  # noqa: E402

if find_chromium(None) is None:
    pytest.skip("no Chromium binary (apt-get install chromium-headless-shell)", allow_module_level=True)

# Forces a vertical scrollbar, so the page is laid out in less than the window's 1280 px.
TALL = '<div style="height: 3000px"></div>'


def check(*pages: Path, options: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, str(CHECKER), *options, *map(str, pages)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout.splitlines()


def write(path: Path, body: str) -> Path:
    path.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>", encoding="utf-8")
    return path


def test_checker_measures_overflow_and_scrolling_boxes(tmp_path):
    # Default body margin 8 px: a 1500-px block ends at 1508 px; a 1272-px one at 1280 px.
    wide = write(tmp_path / "wide.html", '<div id="w" style="width: 1500px">x</div>')
    exact = write(tmp_path / "exact.html", '<div style="width: 1272px">x</div>')
    boxed = write(
        tmp_path / "boxed.html",
        '<div style="overflow-x: auto"><table style="width: 1500px"><tr><td>x</table></div>',
    )
    code, lines = check(wide, exact, boxed)
    assert code == 1
    assert lines[0].startswith(f"FAIL {wide}:") and "scrollWidth 1508 px" in lines[0]
    assert 'overflow div#w "x" (right edge 1508 px)' in lines[0]
    assert lines[1] == f"PASS {exact}: window 1280 px, viewport 1280 px, scrollWidth 1280 px"
    assert lines[2].startswith(f"FAIL {boxed}:") and 'scrolls div "x" (1500 px in 1264 px)' in lines[2]
    assert check(boxed, options=("--allow-scroll",))[0] == 0
    narrow = check(exact, options=("--width", "1000"))
    assert narrow[0] == 1 and "viewport 1000 px, scrollWidth 1280 px" in narrow[1][0]


def test_checker_never_passes_a_page_it_could_not_measure(tmp_path):
    code, lines = check(tmp_path / "missing.html")
    assert code == 2 and lines == [f"ERROR {tmp_path / 'missing.html'}: no such file"]


def longest_numbers(sign: float) -> DiagnoseResult:
    """The SmolLM2 result with every metric of every probe a constant whose ``fmt`` is 9 characters
    (e.g. -1.23e-05): every column defined, every cell as wide as a number gets."""
    data = json.loads(SMOLLM2.read_text(encoding="utf-8"))
    for probe in data["probes"]:
        for name, grid in probe["metrics"].items():
            probe["metrics"][name] = [[[sign * 1.2345e-05] * len(row) for row in level] for level in grid]
    return DiagnoseResult.from_dict(data)


def test_the_widest_pages_fit_1280_px(tmp_path):
    a, b = longest_numbers(-1.0), longest_numbers(-2.0)
    pages = []
    for name, text in (("diagnose", diagnose_html(a)), ("comparison", comparison_html(a, b))):
        assert "<td>-1.23e-05</td>" in text
        path = tmp_path / f"{name}.html"
        path.write_text(text.replace("</body>", TALL + "</body>"), encoding="utf-8")
        pages.append(path)
    assert "<td>-2.47e-05</td>" in pages[1].read_text(encoding="utf-8")  # B; A − B is 9 wide as well
    code, lines = check(*pages)
    assert code == 0, "\n".join(lines)
