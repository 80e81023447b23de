"""What an ICL prompt's settings may say, torch-free, so that a command refuses a task that is
none or an outlier that does not parse before the model stack loads (issue 54): the task names,
:func:`check_task` and :func:`parse_outlier`. The prompts themselves are
:mod:`ssacli.models.icl_task`'s, which re-exports these names.
"""

from __future__ import annotations

from ..errors import UsageError

TASKS = ("every", "some", "linear")
CLASSIFICATION = ("every", "some")
TOKENS_PER_POINT = 2  # x_i, then y_i
FIRST_SCORED = 3  # 1-based: points 1 and 2 have too little context to be judged


def check_task(task: str) -> str:
    if task not in TASKS:
        raise UsageError(f"unknown task '{task}'; choose one of: {', '.join(TASKS)}")
    return task


def parse_outlier(text: str) -> tuple[float, int]:
    """'1000@3' -> (1000.0, 3); a bare value means position 3."""
    value, _, position = text.partition("@")
    try:
        return float(value), int(position) if position else FIRST_SCORED
    except ValueError:
        raise ValueError(f"bad outlier {text!r}; write VALUE@POSITION, e.g. 1000@3") from None
