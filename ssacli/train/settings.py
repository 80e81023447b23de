"""How ``ssacli train`` builds a fresh model (:class:`ScratchSettings`), as one frozen value; the loop
that trains it is :class:`~ssacli.train.finetune_config.FinetuneConfig`'s (its ``data`` also trains the
tokenizer, its ``seed`` also seeds the weights). Cheap to import (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import SCORER, SCRATCH_SIZE
from ..errors import UsageError
from ..setting import setting
from . import MIN_VOCAB

ARCHS = ("gpt2", "llama", "roberta")  # what a built-in size builds (ssacli/train/scratch.py: SHAPES)
SIZES = ("tiny", "small")


def check_arch(arch: str | None, size: str | None = None) -> None:
    """A UsageError for an ``arch`` the built-in ``size`` (None: the default) does not build; an
    arch beside a config.json size is held to its model_type when the model is built."""
    if arch is not None and (size or SCRATCH_SIZE) in SIZES and arch not in ARCHS:
        raise UsageError(f"unknown --arch '{arch}'; choose from {', '.join(ARCHS)}")


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


__all__ = ["ARCHS", "SIZES", "ScratchSettings", "check_arch"]
