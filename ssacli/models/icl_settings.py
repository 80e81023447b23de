"""What an ICL prompt's settings and a new ICL model's build may say, torch-free, so that a
command refuses a task that is none, an outlier that does not parse, a backbone or size preset that
is none before the model stack loads (issue 54): the task names, :func:`check_task`,
:func:`parse_outlier`, :data:`ARCHS` and :func:`check_arch`, :data:`PRESETS` and
:func:`check_preset`. The prompts themselves are :mod:`ssacli.models.icl_task`'s, the model
:mod:`ssacli.models.icl`'s and the presets' use :mod:`ssacli.icl.train`'s, which re-export these names.
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


ARCHS = ("gpt2", "attn-only")  # an ICL model's backbones (ssacli.models.icl)
# name -> (layers, heads, width). "cpu" is the size the bundled checkpoints and the study use.
PRESETS = {"cpu": (3, 4, 32), "small": (4, 4, 64), "paper": (12, 8, 256)}


def check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise UsageError(f"unknown ICL arch '{arch}'; choose one of: {', '.join(ARCHS)}")
    return arch


def check_preset(preset: str) -> tuple[int, int, int]:
    """(layers, heads, width) of a size preset, or a UsageError naming the presets."""
    if preset not in PRESETS:
        raise UsageError(f"unknown preset '{preset}'; choose one of: {', '.join(PRESETS)}")
    return PRESETS[preset]
