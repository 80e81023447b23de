"""The checkpoints bundled with ssacli (``builtin:NAME``) and the name of the file that marks an
ssacli folder: facts with no torch behind them, so that ``--help`` lists the bundled models without
importing the model stack (ssacli.models.checkpoint owns the format of that file; ssacli.models.loading
resolves ``builtin:NAME``)."""

from __future__ import annotations

from pathlib import Path

META_FILE = "ssacli.json"  # in every folder ssacli writes (ssacli.models.checkpoint reads and writes it)
BUILTIN_DIR = Path(__file__).resolve().parents[1] / "checkpoints"


def builtin_names() -> list[str]:
    """The bundled checkpoints' names (``builtin:NAME``): folders of BUILTIN_DIR holding META_FILE."""
    if not BUILTIN_DIR.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if p.is_dir() and (p / META_FILE).is_file())
