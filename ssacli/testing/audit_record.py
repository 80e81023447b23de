"""The all-family audit's record: its results, kept with the fingerprint of everything that decides them.

The audit (:mod:`ssacli.testing.audit`) is a pure function of the installed transformers and torch
releases and of ssacli's own source files that it executes: the same three give the same statuses and
reasons. ``scripts/models_table.py`` runs it in a process of its own and writes ``audit-record.json``
beside this file: the results, both releases, and the SHA-256 of every ``ssacli`` module that process
had loaded (a superset of the code the audit ran). The suite reads the record instead of auditing every
family again while the fingerprint matches, and audits in full as soon as any of them differs: another
transformers or torch, or one changed byte in a module the audit loaded (a change that makes it load a
new module changes the importing module first). So a record can only be used for the code and
releases it was measured on; what it cannot see is the CPU (tests/contracts/test_families.py re-audits
a sample every run, and ``SSACLI_FULL_AUDIT=1`` runs the whole audit regardless).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

from .audit import FamilyResult

RECORD = Path(__file__).with_name("audit-record.json")
PACKAGE = Path(__file__).resolve().parents[1]  # ssacli/
FULL_ENV = "SSACLI_FULL_AUDIT"  # set to 1: the suite audits every family even with a current record


def loaded_sources() -> list[str]:
    """The ssacli modules loaded in this process, as paths relative to the package (sorted)."""
    found = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (name == "ssacli" or name.startswith("ssacli.")) and path and Path(path).suffix == ".py":
            found.add(Path(path).resolve().relative_to(PACKAGE).as_posix())
    return sorted(found)


def fingerprint(sources: list[str]) -> dict:
    """The releases and each listed source file's SHA-256 ("missing" for one that is gone)."""
    import torch
    import transformers

    def digest(relative: str) -> str:
        path = PACKAGE / relative
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"

    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "sources": {relative: digest(relative) for relative in sources},
    }


def record_text(results: list[FamilyResult], sources: list[str]) -> str:
    """The record's JSON for ``results`` measured with ``sources`` loaded."""
    data = {"fingerprint": fingerprint(sources), "results": [dataclasses.asdict(r) for r in results]}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def verdicts(results: list[FamilyResult]) -> list[tuple[str, str, str, str]]:
    """What the page and the audited set are made of: (family, kind, status, reason) per family. The
    measured differences are left out: they are rounding, and rounding differs between CPUs."""
    return sorted((r.family, r.kind, r.status, r.reason) for r in results)


def load(path: Path = RECORD) -> tuple[list[FamilyResult] | None, str]:
    """(the recorded results, "") while the record's fingerprint is this installation's, else
    (None, why the audit must run in full)."""
    if not path.is_file():
        return None, f"no audit record at {path}: run `python scripts/models_table.py`"
    data = json.loads(path.read_text())
    recorded = data["fingerprint"]
    now = fingerprint(sorted(recorded["sources"]))
    for release in ("transformers", "torch"):
        if recorded[release] != now[release]:
            return None, f"the record was measured on {release} {recorded[release]}; installed {now[release]}"
    changed = sorted(name for name, sha in recorded["sources"].items() if now["sources"][name] != sha)
    if changed:
        shown = ", ".join(f"ssacli/{name}" for name in changed[:3])
        shown += f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return None, f"{shown} changed since the audit was recorded: run `python scripts/models_table.py`"
    return [FamilyResult(**row) for row in data["results"]], ""
