"""Where models come from. For now: ssacli's bundled checkpoints (``builtin:NAME``) and local
folders; every command that takes a MODEL resolves it here."""

from __future__ import annotations

from pathlib import Path

from .errors import InputError, UsageError

BUILTIN_PREFIX = "builtin:"
BUILTIN_DIR = Path(__file__).resolve().parent / "checkpoints"


def builtin_names() -> list[str]:
    if not BUILTIN_DIR.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if p.is_dir() and (p / "ssacli.json").is_file())


def resolve_model_path(ref: str) -> Path:
    """``builtin:NAME`` -> the bundled folder; anything else must be an existing local folder."""
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        path = BUILTIN_DIR / name
        if name not in builtin_names():
            available = ", ".join(BUILTIN_PREFIX + n for n in builtin_names()) or "(none installed)"
            raise UsageError(f"no bundled model '{ref}'; available: {available}")
        return path
    path = Path(ref).expanduser()
    if not path.exists():
        raise InputError(f"model path '{ref}' does not exist; give a checkpoint folder or builtin:NAME")
    if not path.is_dir():
        raise InputError(f"model path '{ref}' is a file; give the checkpoint folder that contains it")
    return path
