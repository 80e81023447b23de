"""A model ready to probe (:class:`LoadedModel`), as :mod:`ssacli.models.loading` hands it to every
stage: the module, what the user called it, its family and kind, tokenizer, and which weights it is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from .kinds import ModelKind


@dataclass
class LoadedModel:
    """A model ready to probe, and what diagnose needs to know about it."""

    model: nn.Module
    name: str  # what the user gave
    family: str  # config.model_type ("icl-gpt2" for ssacli's ICL models)
    kind: ModelKind
    tokenizer: Any | None = None
    max_positions: int | None = None
    path: Path | None = None
    no_tokenizer: str | None = None  # a reference loaded without a tokenizer: why (files, an error)
    weights: dict[str, Any] | None = None  # which weights: Hub commit or content hash (None: unknown)

    def __post_init__(self) -> None:
        self.kind = ModelKind(self.kind)  # a plain "causal" from a caller becomes the enum member

    def require_tokenizer(self, what: str) -> None:
        """Refuse ``what`` (text inputs) for a model reference that loaded without a tokenizer: random
        token ids instead would measure the model on noise and read its loss as degenerate."""
        if self.tokenizer is None and self.no_tokenizer is not None:
            raise InputError(
                f"'{self.name}' has no tokenizer ({self.no_tokenizer}), and {what} needs one: save its "
                "tokenizer into the folder (tokenizer.save_pretrained), or pass --random to probe with "
                "random token ids instead (random_ids=True in the API)"
            )

    @property
    def pad_id(self) -> int:
        """The id inputs are padded with: the tokenizer's pad token, else the config's, else 0."""
        for owner in (self.tokenizer, self.config):
            value = getattr(owner, "pad_token_id", None)
            if isinstance(value, int):
                return value
        return 0

    @property
    def config(self) -> Any:
        return getattr(self.attention_root, "config", None)

    @property
    def attention_root(self) -> nn.Module:
        """The transformers model whose attention layers are probed (the backbone of an ICL model)."""
        return getattr(self.model, "backbone", self.model)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the model's execution device (with a device map its first parameters
        may be offloaded to 'meta'; accelerate's hooks move inputs on from there)."""
        from ..attention.interface import execution_device

        return execution_device(self.model) or torch.device("cpu")

    @property
    def vocab_size(self) -> int | None:
        """The text model's vocabulary size (None where its config states none above 1)."""
        config = self.config
        size = getattr(getattr(config, "get_text_config", lambda: config)(), "vocab_size", None)
        return size if isinstance(size, int) and size > 1 else None

    @property
    def placement(self) -> dict[str, Any]:
        """``device_map``: where accelerate put each block, for a model loaded with a device map."""
        placed = getattr(self.model, "hf_device_map", None)
        return {"device_map": dict(placed)} if placed else {}
