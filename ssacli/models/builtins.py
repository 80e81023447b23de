"""The checkpoints bundled with ssacli (``builtin:NAME``) and the name of the file that marks an
ssacli folder: facts with no torch behind them, so that ``--help`` lists the bundled models without
importing the model stack (ssacli.models.checkpoint owns the format of that file; ssacli.models.loading
resolves ``builtin:NAME``)."""

from __future__ import annotations

import json
from pathlib import Path

META_FILE = "ssacli.json"  # in every folder ssacli writes (ssacli.models.checkpoint reads and writes it)
ICL_FORMAT = "ssacli-icl"  # the ``format`` in an ICL model's ssacli.json (its kind, read torch-free)
BUILTIN_DIR = Path(__file__).resolve().parents[1] / "checkpoints"


def builtin_names() -> list[str]:
    """The bundled checkpoints' names (``builtin:NAME``): folders of BUILTIN_DIR holding META_FILE."""
    if not BUILTIN_DIR.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if p.is_dir() and (p / META_FILE).is_file())


def folder_format(path: str | Path) -> str | None:
    """The ``format`` in a folder's ssacli.json, or None when there is none or it cannot be read
    (never raises: for cheap checks)."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    value = meta.get("format") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None
