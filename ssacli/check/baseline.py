"""A check's baseline, as far as it is checked torch-free: its file is an ``ssacli diagnose`` or
``ssacli check`` JSON, and ``max_regression`` is a gate it can apply. :func:`check_settings
<ssacli.check.settings.check_settings>` refuses both before any model loads (issue 54), and
:func:`~ssacli.check.requirements.run_check` with the same functions, for a caller that skips it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..documents import CHECK_SCHEMA
from ..errors import InputError, UsageError


def read_baseline(path: str | Path) -> dict[str, Any]:
    """The diagnose result (its JSON document) in a ``diagnose --json`` file, or the one a ``check
    --json`` file embeds; a missing file, one that is not JSON or holds neither is an InputError."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"baseline '{path}' does not exist; write one with `ssacli check --json`") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"cannot read baseline '{path}' ({err}); give a --json output") from None
    if isinstance(data, dict) and data.get("schema") == CHECK_SCHEMA:
        data = data.get("result")
    if not isinstance(data, dict):
        raise InputError(f"baseline '{path}' is not an ssacli diagnose or check result")
    return data


def check_regression_gate(max_regression: float | None, baseline: object) -> None:
    """A UsageError for a ``max_regression`` that is not a finite number >= 0, or one without a
    ``baseline`` to compare with."""
    if max_regression is not None and (not math.isfinite(max_regression) or max_regression < 0):
        raise UsageError(f"max-regression must be a finite number >= 0, got {max_regression}")
    if max_regression is not None and baseline is None:
        raise UsageError("--max-regression needs a --baseline to compare with")
