"""How ``ssacli train`` builds a fresh model (:class:`ScratchSettings`), as one frozen value; the loop
that trains it is :class:`~ssacli.train.finetune_config.FinetuneConfig`'s (its ``data`` also trains the
tokenizer, its ``seed`` also seeds the weights). Cheap to import (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import SCORER


@dataclass(frozen=True)
class ScratchSettings:
    """:func:`ssacli.train_from_scratch`'s build keywords: ``arch`` (gpt2, llama, roberta; None: the
    model_type of a config.json ``size``), ``size`` (tiny, small or a config.json; None: tiny), the
    ``scorer`` spec, ``vocab_size`` (None: the size's) and ``seq_len``, the model's positions and the
    loop's sequence length (None: the size's). A run resumed with settings left None takes the
    recorded ones; any other that differs from them is refused."""

    arch: str | None = None
    size: str | None = None
    scorer: str = SCORER
    vocab_size: int | None = None
    seq_len: int | None = None


__all__ = ["ScratchSettings"]
