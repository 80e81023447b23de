"""One forward pass of diagnose under a probe (:func:`forward_batch`), observed by a
:class:`~ssacli.diagnosis.recorder.Recorder`, and what its output says.

Where a probe acts is declared by its kind (:class:`ssacli.diagnosis.probe_kinds.ActsOn`), and this
module dispatches on that: on the keys or the attention logits the recorder applies the kind's
effect inside ssacli's attention function; on the input embeddings a forward hook on the embedding
module applies it (ICL models: the x values themselves); on the inputs alone (length, numeric),
:mod:`ssacli.diagnosis.plan` chose them and nothing happens here. What the forward's output logits
say, the logits it returns anyway (no extra forward): how far a probe level moved them from the
reference level's (:class:`OutputReference`, KL per real token) and the LM loss of each next token
(:func:`next_token_losses`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..attention.forward import observing
from ..errors import UnsupportedModelError
from ..models.icl_task import TOKENS_PER_POINT, interleave, labels, prediction_errors
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel
from .plan import ProbeBatch
from .probe_kinds import ActsOn, Probe, ProbeKind
from .recorder import Recorder, all_finite, shifted
from .routes import Route, fallback_hooks, forward_arguments, is_norm


def block_name(attention_name: str) -> str:
    """The block (decoder/encoder layer) an attention module sits in: its name up to the last
    numeric component ("model.layers.3.self_attn" -> "model.layers.3"), else its parent."""
    parts = attention_name.split(".")
    numeric = [i for i, p in enumerate(parts) if p.isdigit()]
    return ".".join(parts[: numeric[-1] + 1] if numeric else parts[:-1])


@dataclass
class BatchOutput:
    """What one forward's output says, beside what its recorder saw inside attention."""

    # per measure ("loss", "output_kl", "error"): (sum over tokens or points, their count)
    sums: dict[str, tuple[float, float]] = field(default_factory=dict)
    # per measure ("loss", "output_kl"): one mean per input sequence, in the batch's row order
    per_input: dict[str, list[float]] = field(default_factory=dict)
    logits: torch.Tensor | None = None  # the model's output logits as it returned them (LMs)


def forward_batch(
    loaded: LoadedModel, route: Route, probe: Probe, level: float, batch: ProbeBatch, recorder: Recorder,
    layers: list[tuple[str, nn.Module]], reference: OutputReference | None = None, index: int = 0,
) -> BatchOutput:  # fmt: skip
    """Run one batch under the probe at ``level``, observed by ``recorder``; returns what its output
    says: the LM loss, and with a ``reference`` the output KL to the first forward of batch
    ``index`` it saw (the logits the forward returns anyway: no extra forward)."""
    kind = probe.kind
    recorder.valid = batch.valid
    recorder.target = batch.target
    recorder.batch = index
    inside = kind.acts_on in (ActsOn.KEYS, ActsOn.LOGITS) and kind.changes(level)
    recorder.probe = (kind, level) if inside else None
    recorder.probe_kind = kind
    device = loaded.device
    hooks = _watch_hooks(loaded, recorder, layers)
    if route is Route.EAGER_FALLBACK:
        hooks += fallback_hooks(recorder, layers)
    try:
        with torch.inference_mode(), observing(recorder):
            if loaded.kind == ModelKind.ICL:
                return _icl_forward(loaded, kind, level, batch, device, recorder)
            if kind.acts_on is ActsOn.EMBEDDINGS and kind.changes(level):
                hooks.append(_embedding_hook(loaded, kind, level, batch.target))
            return _hf_forward(loaded, route, level, batch, device, recorder, reference, index)
    finally:
        for hook in hooks:
            hook.remove()
        recorder.probe = recorder.probe_kind = None


def _watch_hooks(loaded: LoadedModel, recorder: Recorder, layers: list[tuple[str, nn.Module]]) -> list:
    """Hooks that watch without changing anything: each block's output (massive activations,
    kurtosis, overflow) and each normalization module's input (overflow)."""
    root = loaded.attention_root
    modules = dict(root.named_modules())
    hooks = []
    blocks: dict[str, int] = {}
    for index, (name, _) in enumerate(layers):
        block = block_name(name)
        if block in modules and block not in blocks and block != name:
            blocks[block] = index
            hooks.append(modules[block].register_forward_hook(recorder.hidden_hook(index)))
    for name, module in modules.items():
        if is_norm(module):
            layer = next((i for b, i in blocks.items() if name.startswith(b + ".")), None)
            hooks.append(module.register_forward_pre_hook(recorder.norm_hook(layer, name)))
    return hooks


def _embedding_hook(loaded: LoadedModel, kind: ProbeKind, level: float, target: torch.Tensor | None):
    try:
        embedding = loaded.attention_root.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        embedding = None
    if embedding is None:
        raise UnsupportedModelError(f"model family '{loaded.family}' exposes no input embeddings to scale")

    def apply(module, args, output):
        return shifted(kind, output, level, target)

    return embedding.register_forward_hook(apply)


def _hf_forward(
    loaded: LoadedModel, route: Route, level: float, batch: ProbeBatch, device, recorder: Recorder,
    reference: OutputReference | None = None, index: int = 0,
) -> BatchOutput:  # fmt: skip
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if loaded.kind == ModelKind.SEQ2SEQ:
        kwargs.update(decoder_input_ids=ids, decoder_attention_mask=mask)
    if loaded.kind in (ModelKind.CAUSAL, ModelKind.SEQ2SEQ):
        kwargs["use_cache"] = False
    kwargs.update(forward_arguments(route))
    out = loaded.model(**kwargs)
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor) and not all_finite(logits):
        recorder.overflow.note(None, "output logits")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != ids.shape:
        return BatchOutput()
    output = BatchOutput(logits=logits)
    if reference is not None:
        kl = reference.compare(index, level, logits, mask.bool())
        if kl is not None:
            output.sums["output_kl"], output.per_input["output_kl"] = kl
    if loaded.kind != ModelKind.CAUSAL:
        return output
    keep = (mask[:, 1:] * mask[:, :-1]).bool()
    token_losses = next_token_losses(logits, ids)
    losses = token_losses[keep]
    if not torch.isfinite(losses).all():
        recorder.overflow.note(None, "loss")
    output.sums["loss"] = (float(losses.sum()), float(losses.numel()))
    # each input's own mean (per prompt: the shift probe's damage per document, ssacli.diagnosis.shift)
    per_row = torch.where(keep, token_losses, 0).sum(1) / keep.sum(1).clamp(min=1)
    output.per_input["loss"] = [float(v) for v in per_row]
    return output


def _icl_forward(
    loaded: LoadedModel, kind: ProbeKind, level: float, batch: ProbeBatch, device, recorder: Recorder
) -> BatchOutput:
    model = loaded.model
    xs = batch.xs
    if kind.acts_on is ActsOn.EMBEDDINGS and kind.changes(level):
        target = None if batch.target is None else batch.target // TOKENS_PER_POINT  # token -> its x
        xs = shifted(kind, xs, level, target)
    ys = labels(batch.task, xs, batch.coef)
    dtype = next(model.parameters()).dtype
    predictions = model(interleave(xs, ys).to(device, dtype)).float().cpu()
    if not torch.isfinite(predictions).all():
        recorder.overflow.note(None, "predictions")
    errors = prediction_errors(batch.task, predictions, ys)
    return BatchOutput(sums={"error": (float(errors.sum()), float(errors.numel()))})


# ---- what the output says ----------------------------------------------------------------------


class OutputReference:
    """The reference level's output logits of one probe, per batch, so that every other level (the
    same inputs: the probe changes embeddings, keys or logits, not the tokens) reports
    KL(reference ‖ level) per real token: how far the probe moved what the model outputs. The
    reference level's forward of each batch records (the run puts it first); the others compare. The logits
    are kept as the model returned them (on the CPU, one probe at a time: samples × tokens ×
    vocabulary values) and both sides are normalized in float64, since a small KL is a difference of
    nearly equal log-probabilities that float32 log-probs would blur to ~1e-2 relative."""

    def __init__(self, level: float) -> None:
        self.level = level  # the reference level: its forwards record, every other level's compare
        self.first: dict[int, torch.Tensor] = {}  # batch index -> [real tokens, vocabulary] logits

    def compare(
        self, index: int, level: float, logits: torch.Tensor, keep: torch.Tensor
    ) -> tuple[tuple[float, float], list[float]] | None:
        """((sum of KL over ``keep``'s tokens, their count), each input sequence's mean KL per token,
        so that two models probed on the same inputs pair up prompt by prompt); the reference
        level's forward of batch ``index`` records and reads 0."""
        kept = logits[keep]
        row_of = keep.nonzero()[:, 0].cpu()  # the input sequence of each kept token
        tokens = torch.bincount(row_of, minlength=keep.shape[0]).double()
        if level == self.level:
            self.first[index] = kept.detach().cpu()
            return (0.0, float(kept.shape[0])), [0.0] * keep.shape[0]
        ref = self.first.get(index)
        if ref is None or ref.shape != kept.shape:
            return None
        ref_logp = F.log_softmax(ref.to(kept.device, torch.float64), dim=-1)
        logp = F.log_softmax(kept.double(), dim=-1)
        p = ref_logp.exp()
        kl = torch.where(p > 0, p * (ref_logp - logp), torch.zeros_like(p)).sum(-1)
        per_row = torch.zeros(keep.shape[0], dtype=torch.float64).index_add_(0, row_of, kl.cpu())
        return (float(kl.sum()), float(kl.numel())), [float(v) for v in per_row / tokens.clamp(min=1)]


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


__all__ = ["LOSS_CHUNK", "BatchOutput", "OutputReference", "block_name", "forward_batch", "next_token_losses"]
