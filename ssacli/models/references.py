"""MODEL references as paths, with no torch behind them: ``builtin:NAME`` and local folders resolved,
and a reference that names nothing refused before the model stack is imported (the CLI checks MODEL
here first; :mod:`ssacli.models.loading` resolves references with the same functions)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, UsageError
from .builtins import BUILTIN_DIR, builtin_names
from .kinds import BUILTIN_PREFIX, is_local_reference


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


def local_model_path(ref: str) -> Path | None:
    """The folder MODEL names, when it is a builtin or an existing local path (else None); never
    raises, for cheap checks before loading."""
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        return BUILTIN_DIR / name if name in builtin_names() else None
    path = Path(ref).expanduser()
    return path if path.exists() else None


def check_reference(ref: str, offline: bool = False, revision: str | None = None) -> None:
    """Refuse, as loading would, a ``builtin:NAME`` that is not bundled, a local path that does
    not exist (:func:`ssacli.models.kinds.is_local_reference`: ``./nope``, ``models/nope`` beside a
    ``models/`` folder), and offline a Hub id not in the cache (:func:`ssacli.models.hub.check_available`,
    no network asked); anything that exists (a folder, a .gguf file) passes."""
    if revision is not None and is_local_reference(ref):
        raise UsageError(f"--revision applies to Hub ids (org/name), not to the local model '{ref}'")
    if ref.startswith(BUILTIN_PREFIX) or (is_local_reference(ref) and not Path(ref).expanduser().exists()):
        resolve_model_path(ref)
    elif not is_local_reference(ref):
        from .hub import check_available

        check_available(ref, revision, offline)


def fetch_reference(ref: str, offline: bool = False, revision: str | None = None) -> None:
    """A Hub id downloaded into the cache now, unless it is there (:func:`ssacli.models.hub.fetch`:
    its download bars before any live display); anything else is left to loading."""
    if not ref.startswith(BUILTIN_PREFIX) and not is_local_reference(ref):
        from .hub import fetch

        fetch(ref, revision, offline)
