"""Every relative link of README.md and docs/**/*.md leads somewhere: the file exists and, for a
`#fragment` into a markdown page, that page has a heading whose GitHub anchor it is. Sections move
between the README and docs/ (issue 53); a link left behind fails here, by file and target."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.docs_blocks import ROOT, documents

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCED = re.compile(r"^(`{3,}|~{3,}).*?^\1", flags=re.M | re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+)$", FENCED.sub("", page.read_text()), flags=re.M):
        slug = anchor(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")  # GitHub numbers repeated headings
    return found


def test_every_relative_link_resolves():
    broken = []
    for page in documents():
        for target in LINK.findall(FENCED.sub("", page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, …
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)} → {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def test_anchor_follows_github():
    """Headings of this repository's pages whose anchors GitHub gives: backticks, quotes,
    colons and parentheses dropped; hyphens and underscores kept."""
    assert (
        anchor("Start-up: the quick start's `ssacli diagnose`") == "start-up-the-quick-starts-ssacli-diagnose"
    )
    assert anchor('SSA in Triton (`backend="triton"`)') == "ssa-in-triton-backendtriton"
    assert anchor("Instruction sets: `python benchmarks/x_y.py`") == "instruction-sets-python-benchmarksx_ypy"
