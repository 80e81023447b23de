"""The JSON Schema of a diagnose result (ssacli/diagnosis/diagnose.schema.json), as the tests use it.

:func:`schema_errors` validates every diagnose result inside a JSON document: the document itself
(``diagnose --json``), the sides of a comparison, the result of a check, the diagnose comparison of
a report. conftest.py runs it on every ``.json`` file ssacli writes during the suite.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from ssacli.diagnosis.result import SCHEMA, SCHEMA_FILE

RESULT_SCHEMA = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
Draft202012Validator.check_schema(RESULT_SCHEMA)
VALIDATOR = Draft202012Validator(RESULT_SCHEMA)


def diagnose_results(document: Any) -> Iterator[dict[str, Any]]:
    """Every object in ``document`` (nested anywhere) whose ``schema`` is the diagnose result's."""
    if isinstance(document, dict):
        if document.get("schema") == SCHEMA:
            yield document
            return
        for value in document.values():
            yield from diagnose_results(value)
    elif isinstance(document, list):
        for value in document:
            yield from diagnose_results(value)


def schema_errors(document: Any) -> list[str]:
    """One line per schema violation of every diagnose result in ``document`` (empty: all valid)."""
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message[:200]}"
        for result in diagnose_results(document)
        for error in VALIDATOR.iter_errors(result)
    ]


def written_file_errors(path: str | Path, target: str | Path) -> list[str]:
    """Schema violations of the diagnose results in the JSON file ``path`` about to become ``target``."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return []  # not JSON (or not readable): no result to validate
    return [f"{target}: {line}" for line in schema_errors(document)]
