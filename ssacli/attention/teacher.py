"""The softmax original inside a converted model: what attention transfer and distillation learn from.

A converted model keeps the original's weights; only the scorer differs. So the original is the same
model scored with softmax, and no copy is needed (with LoRA adapters disabled, peft's base weights
are the original's). Two context managers switch the registered attention function:

* :func:`scoring_as_softmax`: every ssacli attention call scores with softmax, so the model computes
  exactly the original (distillation's teacher pass).
* :func:`transferring`: every call computes both the scorer's output and softmax's on the same
  query, key and value, hands both to the :class:`AttentionTransfer` and returns softmax's. The
  layers above therefore see the original's hidden states (teacher forcing, as in LoLCATs' attention
  transfer), and each layer's loss depends on its own scorer only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

SOFTMAX = "softmax"


class AttentionTransfer:
    """Per attention layer, the squared error of the scorer's output against softmax's, normalized by
    softmax's mean square (so every layer weighs the same whatever its scale)."""

    def __init__(self) -> None:
        self.errors: list[torch.Tensor] = []

    def __call__(self, module: nn.Module, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.detach()
        error = (output.float() - target.float()).pow(2).mean()
        self.errors.append(error / target.float().pow(2).mean().clamp_min(1e-12))
        return target

    def loss(self) -> torch.Tensor:
        """The mean normalized error over the layers of the forwards since the last call; resets."""
        if not self.errors:
            raise RuntimeError("no ssacli attention call ran inside transferring(): is the scorer applied?")
        loss, self.errors = torch.stack(self.errors).mean(), []
        return loss


_MODE: ContextVar[str | AttentionTransfer | None] = ContextVar("ssacli_teacher", default=None)


@contextmanager
def scoring_as_softmax() -> Iterator[None]:
    token = _MODE.set(SOFTMAX)
    try:
        yield
    finally:
        _MODE.reset(token)


@contextmanager
def transferring(transfer: AttentionTransfer) -> Iterator[AttentionTransfer]:
    token = _MODE.set(transfer)
    try:
        yield transfer
    finally:
        _MODE.reset(token)


def teacher_mode() -> str | AttentionTransfer | None:
    return _MODE.get()


__all__ = ["AttentionTransfer", "scoring_as_softmax", "teacher_mode", "transferring"]
