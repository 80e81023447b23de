"""Check that HTML pages fit a 1280-px-wide browser window: nothing sticks out, nothing scrolls.

    python scripts/check_html_width.py page.html [more.html ...]
    python scripts/check_html_width.py --width 1024 --chromium /usr/bin/chromium page.html

Each page is opened in headless Chromium with a window ``--width`` px wide. A small script,
injected before ``</body>`` of a temporary copy, waits for the load event and the fonts, then
measures the laid-out page and writes what it found into the DOM, which ``--dump-dom`` prints:

* ``scrollWidth``: the document's width; more than the viewport means a horizontal page scrollbar;
* overflow: every element whose right edge lies past the viewport and whose parent's does not
  (where the overflow starts), unless an ancestor clips it;
* scroll: every element with ``overflow-x`` other than visible whose content is wider than its box:
  a table inside an ``overflow-x: auto`` wrapper fits the page but is cut, the reader must scroll it.

One line per file: ``PASS``/``FAIL``, the viewport and scrollWidth, then the offending elements.
Exit 0 if every page fits, 1 if any overflows or scrolls (``--allow-scroll`` accepts scrolling
boxes), 2 if no Chromium was found or a page could not be measured (never a PASS without a
measurement). Standard library only, apart from the browser: ``chromium-headless-shell`` or
``chromium`` (Debian/Ubuntu: ``apt-get install chromium-headless-shell``), or ``--chromium PATH``
or ``$CHROMIUM``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "headless_shell")
MARKER = "ssacli-width-check"
# Runs after load and fonts (images are data URIs; their size is known only once decoded).
MEASURE = """
<script>
(() => {
  const name = (el) => {
    let text = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "");
    if (el.classList.length) text += "." + [...el.classList].join(".");
    const head = el.querySelector("th") || el;
    const words = (head.textContent || "").trim().replace(/\\s+/g, " ").slice(0, 40);
    return (words ? text + ' "' + words + '"' : text) + section(el);
  };
  // The nearest heading above el, so a report line says which section it is in.
  const section = (el) => {
    for (let n = el; n && n !== document.body; n = n.previousElementSibling || n.parentElement)
      if (/^H[1-4]$/.test(n.tagName) && n !== el) return ' under "' + n.textContent.trim().slice(0, 40) + '"';
    return "";
  };
  const clips = (el) => getComputedStyle(el).overflowX !== "visible";
  const measure = () => {
    const root = document.documentElement, limit = root.clientWidth, slack = 0.5;
    const overflow = [], scroll = [];
    for (const el of document.body.querySelectorAll("*")) {
      if (el.id === "MARKER") continue;
      if (clips(el) && el.scrollWidth > el.clientWidth + 1)
        scroll.push({element: name(el), box: el.clientWidth, content: el.scrollWidth});
      const right = el.getBoundingClientRect().right + window.scrollX;
      if (right <= limit + slack) continue;
      const parent = el.parentElement;
      const inside = parent !== document.body;
      if (inside && parent.getBoundingClientRect().right + window.scrollX > limit + slack) continue;
      let clipped = false;
      for (let up = parent; up && up !== document.body; up = up.parentElement) clipped ||= clips(up);
      if (!clipped) overflow.push({element: name(el), right: Math.round(right)});
    }
    const out = document.createElement("script");
    out.type = "application/json";
    out.id = "MARKER";
    // "<" escaped: a script's text is dumped raw, and a closing script tag in it would end it.
    out.textContent = JSON.stringify({
      viewport: limit, scrollWidth: Math.max(root.scrollWidth, document.body.scrollWidth),
      overflow, scroll,
    }).replace(/</g, "\\\\u003c");
    document.body.appendChild(out);
  };
  window.addEventListener("load", () => document.fonts.ready.then(measure));
})();
</script>
""".replace("MARKER", MARKER)
RESULT = re.compile(rf'<script type="application/json" id="{MARKER}">(.*?)</script>', re.S)


def find_chromium(given: str | None) -> str | None:
    """``given`` (a path or a name on PATH), else ``$CHROMIUM``, else the first of :data:`BROWSERS`."""
    for candidate in (given, os.environ.get("CHROMIUM"), *BROWSERS):
        if candidate:
            found = shutil.which(candidate)
            if found or given:
                return found
    return None


def measure(chromium: str, page: Path, width: int, timeout: float) -> dict:
    """The injected script's findings for ``page`` in a ``width``-px window; raises RuntimeError
    when Chromium fails or the script never reported (a page that did not finish loading)."""
    text = page.read_text(encoding="utf-8", errors="replace")
    cut = text.lower().rfind("</body>")
    injected = text[:cut] + MEASURE + text[cut:] if cut >= 0 else text + MEASURE
    with tempfile.TemporaryDirectory(prefix="width-check-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(injected, encoding="utf-8")
        command = [
            chromium,
            "--headless",
            "--no-sandbox",  # root in containers; the page is a local file we just wrote
            "--disable-gpu",
            f"--user-data-dir={Path(tmp) / 'profile'}",
            f"--window-size={width},900",
            "--virtual-time-budget=10000",  # let load and fonts settle before the DOM is dumped
            "--dump-dom",
            copy.as_uri(),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"Chromium did not finish in {timeout:g} s") from None
    found = RESULT.search(done.stdout)
    if found is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"no measurement (Chromium exit {done.returncode}: {last[:200]})")
    try:
        return json.loads(found.group(1))
    except ValueError as error:
        raise RuntimeError(f"unreadable measurement ({error})") from None


def verdict(found: dict, width: int, allow_scroll: bool) -> tuple[bool, str]:
    """(fits, the report line's text after PASS/FAIL)."""
    problems = [f"overflow {o['element']} (right edge {o['right']} px)" for o in found["overflow"]]
    scrolls = [f"scrolls {s['element']} ({s['content']} px in {s['box']} px)" for s in found["scroll"]]
    fits = found["scrollWidth"] <= found["viewport"] and not problems and (allow_scroll or not scrolls)
    detail = "; ".join(problems + scrolls)
    size = f"window {width} px, viewport {found['viewport']} px, scrollWidth {found['scrollWidth']} px"
    return fits, size + (f": {detail}" if detail else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", type=Path, help="HTML files to check")
    parser.add_argument("--width", type=int, default=1280, help="window width in px (default 1280)")
    parser.add_argument("--chromium", help="Chromium binary (default: $CHROMIUM, then PATH)")
    parser.add_argument(
        "--allow-scroll", action="store_true", help="accept boxes that scroll inside the page"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per page (default 60)")
    args = parser.parse_args(argv)
    chromium = find_chromium(args.chromium)
    if chromium is None:
        where = f"at {args.chromium}" if args.chromium else "found (apt-get install chromium-headless-shell)"
        print(f"error: no Chromium {where}; give one with --chromium PATH")
        return 2
    status = 0
    for page in args.pages:
        if not page.is_file():
            print(f"ERROR {page}: no such file")
            status = 2
            continue
        try:
            fits, line = verdict(
                measure(chromium, page, args.width, args.timeout), args.width, args.allow_scroll
            )
        except (RuntimeError, OSError) as error:  # OSError: an unreadable page or browser
            print(f"ERROR {page}: {error}")
            status = 2
            continue
        print(f"{'PASS' if fits else 'FAIL'} {page}: {line}")
        if not fits:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
