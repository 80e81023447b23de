"""The converted → fine-tuned trajectory: what a fine-tuning run logs at every held-out evaluation.

One record per evaluation (step 0 and every checkpoint): the step, the training loss of that step,
the held-out loss, the fidelity to the source model (the unconverted original named by ssacli.json's
``source``: KL(source ‖ model) per token and top-1 agreement on the first
:data:`FIDELITY_WINDOWS` held-out windows), the scorer's parameters per layer (b, n, … averaged
over heads; the per-head values where there is more than one) and the run's seconds so far.

The records live in the training record of ssacli.json (``trajectory``, so a resumed run continues
them) and, as JSON lines, in ``trajectory.jsonl`` next to it; ``ssacli report`` plots them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import SsacliError
from ..files import write_text
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, load_model
from ..models.optim import scorer_values

TRAJECTORY_FILE = "trajectory.jsonl"
FIDELITY_WINDOWS = 4  # held-out windows the fidelity to the source model is measured on


class Trajectory:
    """Measures one trajectory record; holds the source model's log-probabilities (or None)."""

    def __init__(self, loaded: LoadedModel, inputs: torch.Tensor | None, reference: torch.Tensor | None,
                 note: str) -> None:  # fmt: skip
        self.loaded, self.inputs, self.reference, self.note = loaded, inputs, reference, note

    @classmethod
    @torch.no_grad()
    def start(
        cls, loaded: LoadedModel, objective: Any, source: str | None, device: torch.device
    ) -> Trajectory:
        """Load the source model once and keep its log-probabilities on the held-out windows."""
        if objective.name not in (ModelKind.CAUSAL, ModelKind.MASKED):
            return cls(loaded, None, None, "no fidelity: not a text objective")
        batches = objective.heldout()
        if not batches or source is None:
            return cls(loaded, None, None, "no fidelity: no held-out text or no recorded source")
        inputs = batches[0]["input_ids"][:FIDELITY_WINDOWS]
        try:
            original = load_model(str(source), device=str(device), dtype="float32")
        except (SsacliError, OSError) as err:
            return cls(loaded, None, None, f"no fidelity: the source {source} did not load ({err})")
        reference = _log_probs(original.model, inputs, device, objective.name)
        del original
        return cls(loaded, inputs, reference, f"fidelity to {source}")

    @torch.no_grad()
    def record(
        self, model: nn.Module, step: int, train_loss: float | None, heldout: float | None, seconds: float
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "step": step,
            "loss": None if train_loss is None else round(train_loss, 6),
            "heldout_loss": None if heldout is None else round(heldout, 6),
        }
        if self.reference is not None:
            was_training = model.training
            model.eval()
            try:
                device = next(model.parameters()).device
                kind = "causal" if self.loaded.kind == ModelKind.CAUSAL else "masked"
                log_q = _log_probs(model, self.inputs, device, kind)
            finally:
                model.train(was_training)
            log_p = self.reference
            kl = (log_p.exp() * (log_p - log_q)).sum(-1)
            entry["kl_to_source"] = max(float(kl.mean()), 0.0)
            entry["top1_agreement"] = float((log_p.argmax(-1) == log_q.argmax(-1)).double().mean())
        entry["scorer"] = scorer_values(self.loaded.attention_root)
        entry["seconds"] = round(seconds, 1)
        return entry


def _log_probs(model: nn.Module, inputs: torch.Tensor, device: torch.device, kind: str) -> torch.Tensor:
    kwargs = {"use_cache": False} if kind == ModelKind.CAUSAL else {}
    out = []
    for row in inputs.split(1):
        # float64 normalization: in float32, log_softmax's own rounding (~eps·|log p|) enters the KL
        # at first order and swamps a faithful conversion's true KL (~1e-12) with ~1e-9 noise.
        logits = model(input_ids=row.to(device), **kwargs).logits.double().cpu()
        out.append(F.log_softmax(logits, -1))
    return torch.cat(out)


def write_trajectory(out: str | Path, records: list[dict[str, Any]]) -> None:
    """``trajectory.jsonl`` in ``out``: one JSON object per evaluation."""
    if records:
        write_text("".join(json.dumps(r) + "\n" for r in records), Path(out) / TRAJECTORY_FILE)


def read_trajectory(path: str | Path) -> list[dict[str, Any]]:
    """The records of ``trajectory.jsonl`` in folder ``path`` ([] without one)."""
    file = Path(path) / TRAJECTORY_FILE
    if not file.is_file():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
