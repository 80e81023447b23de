"""Attention-pattern patching, the mechanism under :mod:`ssacli.diagnosis.attribution`: a
:class:`PatternRecorder` keeps one level's attention weights and puts them back into chosen heads at
another level (through :meth:`ssacli.attention.forward.Observer.patch`, after the scorer and before
the weights multiply the values), and :func:`prompt_losses` reads each prompt's next-token loss.

A prompt is the same tokens at both levels. Under a probe that keeps the tokens it is one sequence
(``window`` None). Under ``length`` it is one window of ``window`` tokens: the level ×m runs
sequences of m consecutive base prompts (:class:`~ssacli.diagnosis.plan.TokenSource` cuts
consecutive windows from the same offset, and diagnose's prompt statistics cut the long rows the
same way), so the rows of window w of long sequence s are base prompt s·m + w. Its unshifted pattern
attends within the window only: patched, those rows take the base prompt's weights on the window's
keys and nothing on the keys before it. With every head patched, a model whose positions act only
on q and k (rotary) then computes each window exactly as the unshifted run did.
"""

from __future__ import annotations

import torch
from torch import nn

from .forward import next_token_losses
from .recorder import Recorder
from .row_metrics import PromptStats

WHOLE_CALL = 1 << 30  # query rows per block: one block per call, so a kept map lines up with the call


class PatternRecorder(Recorder):
    """A :class:`Recorder` that also keeps every call's weights (``capture``) or puts kept weights
    back into the heads of :attr:`patched` (``patch``), or raises those heads' weights to 1/T and
    renormalizes each row (``temper``: the remedy, a temperature T on softmax heads, since
    softmax(z)^(1/T) ∝ exp(z/T)). Patched and tempered forwards record nothing: their collapse is
    not what attribution reads, and skipping it keeps them cheap."""

    def __init__(
        self, layer_of: dict[int, int], *, tau: float, top_k: int, mode: str, window: int | None = None
    ):
        super().__init__(
            layer_of, tau=tau, top_k=top_k, block_size=WHOLE_CALL, causal=True, stats="eager",
            prompts=PromptStats(window) if mode in ("capture", "measure") else None,
        )  # fmt: skip
        self.mode = mode  # "capture" | "measure" | "patch" | "temper"
        self.temperature = 1.0  # temper: the T of the tempered heads
        self.window = window  # tokens per prompt inside a sequence (None: the whole sequence)
        self.kept: dict[tuple[int, int], torch.Tensor] = {}  # (layer, batch) -> [b, h, q, k]
        self.where: list[tuple[int, int]] = []  # prompt -> (batch, row) of its kept weights
        self.patched: dict[int, torch.Tensor] = {}  # layer -> the heads whose weights go back
        self.first_sequence = 0  # the index of the current batch's first sequence

    def record(self, module, weights, visible, query_positions, sink=None, logits=None) -> None:
        if self.mode in ("patch", "temper"):
            return
        super().record(module, weights, visible, query_positions, sink, logits)
        layer = self.layer_of.get(id(module))
        if self.mode == "capture" and layer is not None:
            self.kept[(layer, self.batch)] = weights.detach().clone()

    def patch(self, module: nn.Module, weights: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
        layer = self.layer_of.get(id(module))
        heads = self.patched.get(layer) if self.mode in ("patch", "temper") else None
        if heads is None or heads.numel() == 0:
            return weights
        weights = weights.clone()
        if self.mode == "temper":  # masked keys hold 0 and keep it; a row of zeros stays zeros
            part = weights[:, heads].clamp_min(0) ** (1 / self.temperature)
            weights[:, heads] = part / part.sum(-1, keepdim=True).clamp_min(torch.finfo(part.dtype).tiny)
            return weights
        size = self.window or weights.shape[-2]
        for row in range(weights.shape[0]):
            for w in range(weights.shape[-2] // size):
                prompt = (self.first_sequence + row) * (weights.shape[-2] // size) + w
                if prompt >= len(self.where):  # a window past the base prompts (the last long row)
                    continue
                batch, kept_row = self.where[prompt]
                kept = self.kept[(layer, batch)][kept_row][heads]
                span = slice(w * size, (w + 1) * size)
                if kept.shape[-2:] != (size, size) or (
                    self.window is None and kept.shape[-1] != weights.shape[-1]
                ):
                    raise RuntimeError(
                        f"layer {layer}: kept weights {tuple(kept.shape)} do not fit {size} rows"
                    )
                weights[row, heads, span] = 0
                weights[row, heads, span, span] = kept.to(weights.dtype)
        return weights


def prompt_losses(
    logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, window: int | None
) -> torch.Tensor:
    """[b · windows]: each prompt's mean next-token loss over the pairs inside it (a pair that crosses
    from one window into the next belongs to neither: the unshifted run never predicts it)."""
    losses = next_token_losses(logits, ids) * (mask[:, 1:] * mask[:, :-1])
    keep = (mask[:, 1:] * mask[:, :-1]).float()
    size = window or ids.shape[1]
    count = ids.shape[1] // size
    pad = torch.nn.functional.pad  # one column more: the pair out of the last window
    losses = pad(losses, (0, 1))[:, : count * size].reshape(-1, count, size)[..., :-1]
    keep = pad(keep, (0, 1))[:, : count * size].reshape(-1, count, size)[..., :-1]
    return (losses.sum(-1) / keep.sum(-1).clamp_min(1)).flatten()


__all__ = ["WHOLE_CALL", "PatternRecorder", "prompt_losses"]
