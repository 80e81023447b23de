"""What diagnose measures at a forward's output, beside the attention: how far a probe level moved the
model's output logits from the reference level's (:class:`OutputReference`, KL per real token) and the
LM loss of each next token (:func:`next_token_losses`). :mod:`ssacli.diagnosis.forward` runs the
forward and hands them the logits it returns anyway: no extra forward."""

from __future__ import annotations

import torch
from torch.nn import functional as F


class OutputReference:
    """The reference level's output logits of one probe, per batch, so that every other level (the
    same inputs: the probe changes embeddings, keys or logits, not the tokens) reports
    KL(reference ‖ level) per real token: how far the probe moved what the model outputs. The logits
    are kept as the model returned them (on the CPU, one probe at a time: samples × tokens ×
    vocabulary values) and both sides are normalized in float64, since a small KL is a difference of
    nearly equal log-probabilities that float32 log-probs would blur to ~1e-2 relative."""

    def __init__(self) -> None:
        self.first: dict[int, torch.Tensor] = {}  # batch index -> [real tokens, vocabulary] logits
        self.recording = True  # the reference level records; the others compare
        # batch index -> per input sequence (row) of the level last compared: its mean KL per token,
        # so that two models probed on the same inputs pair up prompt by prompt
        self.rows: dict[int, list[float]] = {}

    def compare(self, index: int, logits: torch.Tensor, keep: torch.Tensor) -> tuple[float, float] | None:
        """(sum of KL over ``keep``'s tokens, their count); the reference level records and reads 0."""
        kept = logits[keep]
        row_of = keep.nonzero()[:, 0].cpu()  # the input sequence of each kept token
        tokens = torch.bincount(row_of, minlength=keep.shape[0]).double()
        if self.recording:
            self.first[index] = kept.detach().cpu()
            self.rows[index] = [0.0] * keep.shape[0]
            return 0.0, float(kept.shape[0])
        ref = self.first.get(index)
        if ref is None or ref.shape != kept.shape:
            return None
        ref_logp = F.log_softmax(ref.to(kept.device, torch.float64), dim=-1)
        logp = F.log_softmax(kept.double(), dim=-1)
        p = ref_logp.exp()
        kl = torch.where(p > 0, p * (ref_logp - logp), torch.zeros_like(p)).sum(-1)
        per_row = torch.zeros(keep.shape[0], dtype=torch.float64).index_add_(0, row_of, kl.cpu())
        self.rows[index] = [float(v) for v in per_row / tokens.clamp(min=1)]
        return float(kl.sum()), float(kl.numel())


# Positions per float32 piece of the LM loss: a float32 copy of all the logits would be the largest
# tensor of a long-context diagnose (32,000 × 4 bytes per token: 16 GB at 128k tokens).
LOSS_CHUNK = 2048


def next_token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[b, n − 1] cross-entropy of each next token, in float32, a few positions at a time."""
    before = logits[:, :-1]  # a view: each position's prediction of the next token
    pieces = [
        F.cross_entropy(
            before[:, start : start + LOSS_CHUNK].float().transpose(1, 2),
            ids[:, start + 1 : start + 1 + LOSS_CHUNK],
            reduction="none",
        )
        for start in range(0, ids.shape[1] - 1, LOSS_CHUNK)
    ]
    return torch.cat(pieces, dim=1) if pieces else logits.new_zeros(ids.shape[0], 0, dtype=torch.float32)


__all__ = ["LOSS_CHUNK", "OutputReference", "next_token_losses"]
