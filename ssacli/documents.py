"""The JSON documents ssacli writes, by their ``schema`` names, and the one reader of a saved one.

Torch-free, below every stage: ``ssacli render`` refuses a file that is missing, not JSON or not a
diagnose result before the model stack loads (:func:`read_saved`, issue 54); the stages that write
each document import its name from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import InputError

DIAGNOSE_SCHEMA = "ssacli-diagnose"  # DiagnoseResult.to_dict (`ssacli diagnose --json`)
COMPARISON_SCHEMA = "ssacli-diagnose-comparison"  # compare_results (diagnose --compare --json)
REPORT_SCHEMA = "ssacli-report"  # QualityReport.to_dict (`ssacli report --json`)
CHECK_SCHEMA = "ssacli-check"  # CheckReport.to_dict (`ssacli check --json`)
OTHER_SCHEMAS = {REPORT_SCHEMA: "an `ssacli report` JSON", CHECK_SCHEMA: "an `ssacli check` JSON"}


def read_json_file(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``, or an InputError saying in one line why there is none."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"result file '{path}' does not exist; write one with `ssacli diagnose --json`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"cannot read result file '{path}' ({err}); give a `--json` output") from None
    if not isinstance(data, dict):
        raise InputError(
            f"result file '{path}' holds a JSON {type(data).__name__}, not a diagnose result; "
            "give a file written by `ssacli diagnose --json`"
        )
    return data


def read_saved(path: str | Path) -> dict[str, Any]:
    """A saved diagnose result or comparison (``diagnose [--compare …] --json``) as its document:
    anything else (a missing or non-JSON file, a report or check JSON, a comparison without both
    sides) is an InputError naming the file and the fix. Its results are read by
    :func:`ssacli.load_saved`, which checks their versions and fields."""
    data = read_json_file(path)
    schema = data.get("schema")
    if schema == COMPARISON_SCHEMA:
        if not all(isinstance(data.get(side), dict) for side in ("a", "b")):
            raise InputError(f"result file '{path}' is a comparison without both sides (a, b); re-create it")
    elif schema != DIAGNOSE_SCHEMA:
        what = OTHER_SCHEMAS.get(schema, f"not a diagnose result (schema={schema!r})")
        raise InputError(f"'{path}' is {what}; give a file written by `ssacli diagnose --json`")
    return data
