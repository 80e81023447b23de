"""The checkpoints bundled with ssacli (``builtin:NAME``) and the torch-free part of the checkpoint
format: the file that marks an ssacli folder, its formats and versions, and its reader
(:func:`read_meta`), so that ``--help`` lists the bundled models and a folder's record is checked
without importing the model stack (ssacli.models.checkpoint owns the rest of the format and re-exports
these names; ssacli.models.loading resolves ``builtin:NAME``), and what a command may replace: a
folder ssacli wrote (:func:`is_ssacli_folder`, :func:`check_replaceable`), checked torch-free."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError
from ..files import output_error

META_FILE = "ssacli.json"  # in every folder ssacli writes (ssacli.models.checkpoint reads and writes it)
ICL_FORMAT = "ssacli-icl"  # the ``format`` in an ICL model's ssacli.json (its kind, read torch-free)
MODEL_FORMAT = "ssacli-model"
# The newest version of each this ssacli reads. The model format stays 1 across issues 38 and 51's
# changes of config.json's guard (model_type ssacli-<type> -> attn_implementation "ssacli" -> both
# a guarded model_type and that, .guard): ssacli.json did not change, every guard is read, and an
# ssacli that knows only an older one reads a newer folder as a folder with a saved scorer, which it
# is (layout 3 keeps layout 1's ORIGINAL_TYPE_KEY, which every earlier ssacli maps back; only plain
# transformers needed the changes).
FORMAT_VERSIONS = {MODEL_FORMAT: 1, ICL_FORMAT: 1}
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


def read_meta(path: str | Path, format: str = MODEL_FORMAT) -> dict[str, Any] | None:
    """ssacli.json of a folder in ``format``, or None for any other folder (no ssacli.json, or
    another format). Invalid JSON, or a version newer than this ssacli reads, is an InputError."""
    file = Path(path) / META_FILE
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{file} is not valid JSON ({err}); re-create the folder") from None
    if not isinstance(meta, dict) or meta.get("format") != format:
        return None
    check_format_version(meta, path, format)
    return meta


def check_format_version(meta: dict[str, Any], path: str | Path, format: str) -> None:
    """Refuse (InputError) a record written in a newer version of ``format`` than this ssacli reads."""
    if meta.get("format_version", 0) > FORMAT_VERSIONS[format]:
        raise InputError(
            f"{path} was written by a newer ssacli (format {meta['format_version']}); upgrade ssacli"
        )


def is_ssacli_folder(path: str | Path) -> bool:
    """Whether ssacli wrote the folder: its ssacli.json names one of ssacli's formats."""
    return folder_format(path) in FORMAT_VERSIONS


def check_replaceable(out: str | Path, option: str = "--out") -> None:
    """Refuse (UsageError) to replace ``out`` unless it is missing, empty, or a folder ssacli wrote
    (:func:`is_ssacli_folder`): anything else may hold the user's files, which a replace would
    delete. The message names the first few entries and their count; nothing is touched."""
    out = Path(out)
    if not out.is_dir() or is_ssacli_folder(out):
        return
    try:
        entries = sorted(entry.name for entry in out.iterdir())
    except OSError as err:
        raise output_error(out, err) from err
    if not entries:
        return
    shown = ", ".join(entries[:3]) + (f", … ({len(entries)} entries)" if len(entries) > 3 else "")
    raise UsageError(
        f"{option} {out} holds files ssacli did not write ({shown}); ssacli replaces only a folder it "
        f"wrote or an empty one, so nothing was touched: move those files or choose another {option}"
    )
