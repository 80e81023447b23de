"""Files a user hands to ssacli's measures, read and checked with errors that name the option.

* :func:`read_text_file`: a UTF-8 text with some text in it (``diagnose --text``, ``report
  --text-id`` / ``--text-ood``);
* :func:`read_pairs`: BLiMP-style minimal pairs (``report --pairs``), one ``.jsonl`` file or a
  folder of them, every line checked by :func:`check_pair_record`;
* :func:`read_report_files`: every file a report measures on, by the two above;
* :func:`check_language_models`: texts and pairs only for models a folder does not declare of
  another kind than a language model (:data:`LM_KINDS`).

Training data (``--data``) has its own reader, :func:`ssacli.train.data.read_documents`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError

LM_KINDS = ("causal", "masked")  # the kinds a report measures texts and minimal pairs on


def not_a_language_model(option: str, name: str, kind: str) -> UsageError:
    """Texts (``--text-id/--text-ood``) or ``--pairs`` given for model ``name`` of ``kind``."""
    return UsageError(f"{option} needs causal or masked language models; '{name}' is {kind}")


def check_language_models(refs: Iterable[str | None], *, text: bool, pairs: bool) -> None:
    """Refuse, before the model stack, texts or pairs for a model whose local folder declares a kind
    that is no language model: an ICL model or an encoder-decoder (:func:`~ssacli.models.kinds.declared_kind`;
    an encoder's folder may still load with an LM head, so loading decides for it)."""
    from ..models.kinds import ModelKind, declared_kind
    from ..models.references import local_model_path

    asked = [option for option, given in (("--text-id/--text-ood", text), ("--pairs", pairs)) if given]
    for ref in refs if asked else ():
        path = local_model_path(ref) if ref is not None else None
        kind = declared_kind(path) if path is not None and path.is_dir() else None
        if kind in (ModelKind.ICL, ModelKind.SEQ2SEQ):
            raise not_a_language_model(asked[0], ref, kind)


def read_text_file(path: str | Path, option: str = "--text") -> str:
    """A UTF-8 text file with some text in it, or an InputError naming the option and the file."""
    path = Path(path)
    try:
        content = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{option} file '{path}' does not exist; give a UTF-8 text file") from None
    except IsADirectoryError:
        raise InputError(f"{option} '{path}' is a folder; give a UTF-8 text file") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{option} file '{path}' is not UTF-8 (byte {err.start}); re-encode it") from None
    except OSError as err:
        raise InputError(f"cannot read {option} file '{path}': {err.strerror}") from None
    if not content.strip():
        raise InputError(f"{option} file '{path}' is empty; give a file with some text")
    return content


def read_pairs(source: str | Path, limit: int | None = None) -> dict[str, list[dict]]:
    """BLiMP-style records from one ``.jsonl`` file or every ``*.jsonl`` in a folder, by file stem.

    Every line is checked (a bad line names its file and line number); ``limit`` then keeps each
    file's first N pairs (BLiMP files are in pairID order, so this is a fixed, reproducible subset).
    """
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise InputError(f"--pairs folder '{path}' holds no .jsonl files")
    elif path.is_file():
        files = [path]
    else:
        raise InputError(f"--pairs '{path}' does not exist; give a .jsonl file or a folder of them")
    groups = {}
    for file in files:
        records = list(_jsonl_records(file))
        if not records:
            raise InputError(f"--pairs file '{file}' holds no pairs")
        groups[file.stem] = records[:limit] if limit else records
    return groups


def read_report_files(
    text_id, text_ood, pairs, pairs_limit: int | None, *, heldout_of=None
) -> tuple[dict[str, str | None], Any, dict[str, str | None]]:
    """What a report measures on from the files given, every one read before a model loads (``ssacli
    report`` reads them before the model stack too): (the texts by key, text_id and text_ood: a
    file's content, or the string given; the minimal-pair groups: read from a file or folder, or as
    given; the names recorded for them: ``pairs`` when a file or folder, then ``text_id``,
    ``text_ood``: a file's path, else None). ``heldout_of`` (a text cut from training data, which the
    report reads where it is measured) is refused beside ``text_id``."""
    if heldout_of is not None and text_id is not None:
        raise UsageError("give either --text-id or --heldout-of, not both")
    texts, names = {}, {}
    for key, value, option in (("text_id", text_id, "--text-id"), ("text_ood", text_ood, "--text-ood")):
        texts[key] = read_text_file(value, option) if isinstance(value, Path) else value
        names[key] = str(value) if isinstance(value, Path) else None
    named = isinstance(pairs, str | Path)
    groups = read_pairs(pairs, pairs_limit) if named else pairs
    return texts, groups, {**({"pairs": str(pairs)} if named else {}), **names}


def check_pair_record(record: Any, where: str) -> None:
    """An InputError, naming ``where``, unless ``record`` has non-empty sentence_good/sentence_bad."""
    if not isinstance(record, dict):
        raise InputError(f"{where} is not a JSON object with sentence_good and sentence_bad")
    for key in ("sentence_good", "sentence_bad"):
        value = record.get(key)
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{where} has no non-empty string '{key}'")


def _jsonl_records(file: Path) -> Iterable[dict]:
    try:
        raw = file.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read --pairs file '{file}': {err.strerror}") from None
    for number, line in enumerate(raw.splitlines(), start=1):
        where = f"--pairs file '{file}', line {number}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{where} is not UTF-8; re-encode the file") from None
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except ValueError as err:
            raise InputError(f"{where} is not JSON ({err.msg}, column {err.colno})") from None
        check_pair_record(record, where)
        yield record


__all__ = [
    "LM_KINDS",
    "check_language_models",
    "check_pair_record",
    "not_a_language_model",
    "read_pairs",
    "read_report_files",
    "read_text_file",
]
