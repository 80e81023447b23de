"""How ``ssacli train`` builds a fresh model (:class:`ScratchSettings`), as one frozen value; the loop
that trains it is :class:`~ssacli.train.finetune_config.FinetuneConfig`'s (its ``data`` also trains the
tokenizer, its ``seed`` also seeds the weights). Cheap to import (no torch)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..defaults import SCORER, SCRATCH_SIZE
from ..errors import InputError, UsageError
from ..models.guard_type import plain_config_dict
from ..setting import setting
from . import MIN_VOCAB

ARCHS = ("gpt2", "llama", "roberta")  # what a built-in size builds (ssacli/train/scratch.py: SHAPES)
SIZES = ("tiny", "small")


def check_arch(arch: str | None, size: str | None = None) -> None:
    """A UsageError for an ``arch`` the built-in ``size`` (None: the default) does not build; an
    arch beside a config.json size is held to its model_type when the model is built."""
    if arch is not None and (size or SCRATCH_SIZE) in SIZES and arch not in ARCHS:
        raise UsageError(f"unknown --arch '{arch}'; choose from {', '.join(ARCHS)}")


def read_size(arch: str | None, size: str) -> tuple[dict[str, Any], str | None, Path | None]:
    """(the config.json dict of a file ``size``, else {}; the arch: ``arch``, or that config's
    model_type; the file, or None for a built-in size), torch-free: a built-in size without an
    arch it builds, or a ``size`` that is no config.json (or not the ``arch`` given) is refused
    before the model stack loads. Whether the family has an LM head is the builder's to tell."""
    if size in SIZES:
        if arch is None:
            raise UsageError(f"--arch is needed with --size {size}: choose from {', '.join(ARCHS)}")
        check_arch(arch, size)
        return {}, arch, None
    path = Path(size).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UsageError(f"--size '{size}' is neither {' nor '.join(SIZES)} nor a config.json file")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {path}: {err}") from None
    if isinstance(config, dict):  # a converted folder's config.json: its original model type
        config = plain_config_dict(config)
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if arch is not None and model_type != arch:
        raise UsageError(f"--arch {arch} does not match model_type '{model_type}' of {path}")
    return config, model_type, path


@dataclass(frozen=True)
class ScratchSettings:
    """:func:`ssacli.train_from_scratch`'s build keywords: ``arch`` (gpt2, llama, roberta; None: the
    model_type of a config.json ``size``), ``size`` (tiny, small or a config.json; None: tiny), the
    ``scorer`` spec, ``vocab_size`` (None: the size's) and ``seq_len``, the model's positions and the
    loop's sequence length (None: the size's). A run resumed with settings left None takes the
    recorded ones; any other that differs from them is refused. Each field's help is its ``ssacli
    train`` option's."""

    arch: str | None = setting(
        None, "gpt2 or llama (causal LM), roberta (masked LM); needed unless --size is a config.", type=str
    )
    size: str | None = setting(
        None, f"{SCRATCH_SIZE} (default), small, or a config.json (its model_type: the arch).", type=str
    )
    scorer: str = setting(SCORER, "Scorer spec, e.g. ssa or ssa:init=paper,learn=n.")
    vocab_size: int | None = setting(
        None,
        "Most BPE tokens (default: the size's vocabulary, printed when the model is built).",
        type=int,
        min=MIN_VOCAB,
    )
    seq_len: int | None = setting(
        None, "Tokens per sequence = model positions (default: size's).", type=int, min=2
    )


__all__ = ["ARCHS", "SIZES", "ScratchSettings", "check_arch", "read_size"]
