"""Writing result files atomically: a temp file beside the target, then a rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish(tmp: str | Path, path: str | Path, *, directory: bool = False) -> None:
    """Give a temp file (or a folder and the files in it) the permissions a plain create would
    have, then rename it into place."""
    mask = _umask()
    if directory:
        for file in Path(tmp).iterdir():
            os.chmod(file, 0o666 & ~mask)
    os.chmod(tmp, (0o777 if directory else 0o666) & ~mask)
    os.replace(tmp, path)


def write_text(text: str, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(data: Any, path: str | Path) -> None:
    write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", path)
