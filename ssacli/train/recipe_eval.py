"""What the conversion recipe measures on held-out text: the model's loss and perplexity, the
original's, the KL from the original per token, and the attention-transfer error; and the record's
final measures (:func:`final_measures`).

The held-out text is the last tenth of ``--data`` (:func:`ssacli.train.data.split_heldout`), which
no stage trains on: ``heldout_tokens`` of it (HELDOUT_TOKENS by default; all of it when it is
shorter, and the record says how many were measured), in fixed, non-overlapping windows of the run's
``seq_len``, the same for every arm and seed of a comparison. Every measure streams over the windows
in chunks, so a large vocabulary never holds every token's distribution at once; the original's
log-probabilities (rounded to float32 either way) are kept between evaluations only while they fit
TEACHER_CACHE_BYTES.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .data import HELDOUT_FRACTION

CHUNK_ELEMENTS = 1 << 25  # tokens × vocabulary per chunk (256 MB of float64 log-probabilities)
TEACHER_CACHE_BYTES = 512 << 20  # the original's log-probabilities are kept when they fit (float32)

Logits = Callable[[torch.Tensor], torch.Tensor]  # ids [windows, seq_len] -> logits


@dataclass
class HeldOut:
    """The held-out windows of a run and how they were chosen (``describe()`` goes in the record)."""

    ids: torch.Tensor  # [windows, seq_len], int64
    asked: int  # the tokens asked for
    available: int  # the tokens of the held-out slice

    @classmethod
    def of(cls, objective: Any, seq_len: int, tokens: int) -> HeldOut | None:
        data = objective.data
        windows = data.heldout_windows(seq_len, limit=max(1, math.ceil(tokens / seq_len)))
        if windows is None:
            return None
        return cls(windows, tokens, len(data.heldout_stream))

    @property
    def tokens(self) -> int:
        return self.ids.numel()

    def describe(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "windows": self.ids.shape[0],
            "seq_len": self.ids.shape[1],
            "asked": self.asked,
            "available": self.available,
            "split": f"the last {HELDOUT_FRACTION:.0%} of --data, which no stage trains on",
        }

    def chunks(self, vocab: int) -> list[torch.Tensor]:
        per = max(1, CHUNK_ELEMENTS // max(1, self.ids.shape[1] * vocab))
        return list(self.ids.split(per))


class HeldOutMeasure:
    """Measures on one HeldOut: ``__call__(student, teacher, transfer_error)`` → the evaluation's
    numbers. ``teacher`` (the original) is computed once and kept when it fits, else recomputed."""

    def __init__(self, heldout: HeldOut, vocab: int) -> None:
        self.heldout, self.vocab = heldout, vocab
        self.chunks = heldout.chunks(vocab)
        self.cache: list[torch.Tensor] | None = None
        self.keep = heldout.tokens * vocab * 4 <= TEACHER_CACHE_BYTES

    def _teacher(self, index: int, chunk: torch.Tensor, teacher: Logits) -> torch.Tensor:
        """The original's log-probabilities, rounded to float32 whether cached or not: a run resumed
        in a new process (no cache yet) measures exactly what the uninterrupted run did."""
        if self.cache is None:
            return teacher(chunk).double().log_softmax(-1).float().cpu()
        return self.cache[index]

    @torch.no_grad()
    def __call__(
        self, student: Logits, teacher: Logits, transfer_error: Callable[[torch.Tensor], float] | None = None
    ) -> dict[str, float]:
        kl = loss = original = error = 0.0
        positions = predicted = 0
        kept: list[torch.Tensor] = []
        for index, chunk in enumerate(self.chunks):
            log_p = self._teacher(index, chunk, teacher)
            if self.keep and self.cache is None:
                kept.append(log_p)
            log_p = log_p.double()
            log_q = student(chunk).double().log_softmax(-1).cpu()
            kl += float((log_p.exp() * (log_p - log_q)).sum())
            positions += chunk.shape[0] * chunk.shape[1]
            ids = chunk[:, 1:].unsqueeze(-1)
            loss += float(-log_q[:, :-1].gather(-1, ids).sum())
            original += float(-log_p[:, :-1].gather(-1, ids).sum())
            predicted += ids.numel()
            if transfer_error is not None:
                error += transfer_error(chunk) * chunk.shape[0]
        if self.keep and self.cache is None:
            self.cache = kept
        loss, original = loss / predicted, original / predicted
        out = {"kl": max(kl / positions, 0.0), "heldout_loss": loss, "heldout_ppl": math.exp(loss),
               "original_loss": original, "original_ppl": math.exp(original)}  # fmt: skip
        if transfer_error is not None:
            out["transfer_error"] = error / self.heldout.ids.shape[0]
        return out


def final_measures(last: dict[str, Any], *, max_loss: float, target_n: float | None, learn_n: bool) -> dict:
    """The recipe record's ``final``: the last evaluation's measures against the budget
    (``max_loss``, nats/token over the original's) and whether n ended at ``target_n`` (None where
    no target was set or n was learned)."""
    n_final = last["n"] or []
    kl = last.get("kl")
    loss_change = None if kl is None else last["heldout_loss"] - last["original_loss"]
    return {
        "n_max": max(n_final) if n_final else None,
        "kl": kl,
        "heldout_ppl": last.get("heldout_ppl"),
        "original_ppl": last.get("original_ppl"),
        "ppl_ratio": None if kl is None else last["heldout_ppl"] / last["original_ppl"],
        "loss_change": loss_change,  # held-out loss minus the original's (nats/token)
        "met_max_loss": None if kl is None else loss_change <= max_loss,
        "at_target_n": None
        if target_n is None or learn_n
        else bool(n_final) and max(n_final) <= target_n * (1 + 1e-5),
    }


__all__ = ["HeldOut", "HeldOutMeasure", "final_measures"]
