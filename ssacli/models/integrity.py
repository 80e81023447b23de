"""Whether a model's own numbers can be measured at all: weights that are NaN or ±inf make every
forward non-finite, so every probe would read "overflow at the first level" and name an attention
layer, not the checkpoint. :func:`require_finite_weights` finds them before any probe runs."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import BrokenModelError

SHOWN = 3  # tensors named in the message; the rest are counted


def nonfinite_weights(model: nn.Module) -> list[tuple[str, int, int]]:
    """(name, non-finite values, values) of every parameter and buffer holding a NaN or ±inf, in
    ``named_parameters`` then ``named_buffers`` order. Tensors on the meta device (offloaded to disk
    by a device map) are not read."""
    found = []
    # (named_parameters and named_buffers list a tied tensor once)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.device.type == "meta" or not tensor.is_floating_point():
            continue
        with torch.no_grad():
            bad = int(tensor.numel() - torch.isfinite(tensor).sum().item())
        if bad:
            found.append((name, bad, tensor.numel()))
    return found


def require_finite_weights(model: nn.Module, name: str) -> None:
    """Raise BrokenModelError naming the non-finite tensors of ``model`` (called ``name``), if any."""
    found = nonfinite_weights(model)
    if not found:
        return
    shown = ", ".join(f"{tensor} ({bad:,} of {total:,} values)" for tensor, bad, total in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more tensors" if len(found) > SHOWN else ""
    raise BrokenModelError(
        f"'{name}' has non-finite weights (NaN or inf): {shown}{more}; every forward would be "
        "non-finite, so nothing can be measured: repair or re-export the checkpoint"
    )
