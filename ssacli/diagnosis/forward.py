"""One forward pass of diagnose under a probe: the probe's application, and the :class:`Recorder`
that observes the attention.

Where a probe acts is declared by its kind (:class:`ssacli.diagnosis.probes.ActsOn`), and this
module dispatches on that: on the attention logits, :class:`LogitProbe` applies the kind's effect
inside ssacli's attention function, ahead of the Recorder; on the input embeddings, a forward hook
on the embedding module applies it (ICL models: the x values themselves); on the inputs alone
(length, numeric), :mod:`ssacli.diagnosis.run` chose them and nothing happens here. Whatever the
route, every attention map reaches :meth:`Recorder.record` and leaves as per-head sums
(:func:`ssacli.diagnosis.metrics.row_sums`): through ssacli's attention function in query blocks,
or, on the eager fallback, through :meth:`Recorder.fallback_hook` on each attention module, which
drops the map once reduced.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..attention.interface import observing
from ..errors import UnsupportedModelError
from ..models.loading import LoadedModel
from .metrics import HeadStats, row_sums
from .probes import ActsOn, Effect, Probe, ProbeBatch, ProbeKind, icl_tokens


class Recorder:
    """An :class:`ssacli.attention.interface.Observer` that only observes: it reduces every block of
    attention weights into per-layer :class:`HeadStats` and changes nothing (``transform`` is the
    identity; a logit probe wraps it in a :class:`LogitProbe`)."""

    def __init__(self, layer_of: dict[int, int], *, tau: float, top_k: int, block_size: int, causal: bool):
        self.layer_of = layer_of
        self.tau, self.top_k, self.block_size, self.causal = tau, top_k, block_size, causal
        self.stats: dict[int, HeadStats] = {}
        self.valid: torch.Tensor | None = None  # [b, t] real tokens of the current batch
        self.target: torch.Tensor | None = None  # [b] target token of the current batch (outlier_capture)

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        return logits

    def record(self, module, weights, visible, query_positions) -> None:
        layer = self.layer_of.get(id(module))
        if layer is None:
            return
        k = weights.shape[-1]
        valid = target = None
        if self.valid is not None and self.valid.shape[-1] == k:  # keys are this batch's tokens
            valid = self.valid.to(weights.device)[:, query_positions]
            target = self.target
        sums = row_sums(
            weights, visible, query_valid=valid, query_positions=query_positions,
            target=target, tau=self.tau, top_k=self.top_k,
        )  # fmt: skip
        if layer not in self.stats:
            self.stats[layer] = HeadStats(weights.shape[1])
        self.stats[layer].add(sums)

    def fallback_hook(self, module, args, output):
        """Forward hook for eager-fallback attention modules: reduce the weights, then drop them."""
        if not isinstance(output, tuple):
            return None
        for index, item in enumerate(output):
            if isinstance(item, torch.Tensor) and item.dim() == 4 and item.is_floating_point():
                q, k = item.shape[-2:]
                positions = torch.arange(k - q, k, device=item.device)
                visible = self._structural_mask(module, item, positions)
                self.record(module, item, visible, positions)
                return (*output[:index], None, *output[index + 1 :])
        return None

    def _structural_mask(self, module: nn.Module, weights: torch.Tensor, positions: torch.Tensor):
        """Which keys each row may see: the module's own causal/local-window buffer when it has one
        (GPT-Neo's ``bias``), else causal by family; and the batch's key padding."""
        k = weights.shape[-1]
        visible = torch.ones(1, 1, len(positions), k, dtype=torch.bool, device=weights.device)
        buffer = getattr(module, "bias", None)
        if isinstance(buffer, torch.Tensor) and buffer.dtype == torch.bool and buffer.dim() == 4:
            if buffer.shape[-1] >= k:
                visible = visible & buffer[:, :, positions, :k].to(weights.device)
        elif self.causal:
            visible = visible & (torch.arange(k, device=weights.device) <= positions.unsqueeze(-1))
        if self.valid is not None and self.valid.shape[-1] == k:
            visible = visible & self.valid.to(weights.device)[:, None, None, :]
        return visible


class LogitProbe:
    """The Observer ssacli's attention sees under a logit probe: the probe's ``effect`` on every
    call's logits, then the :class:`Recorder`'s reduction of the weights."""

    def __init__(self, recorder: Recorder, effect: Effect, level: float, target: torch.Tensor | None):
        self.recorder, self.effect, self.level, self.target = recorder, effect, level, target
        self.block_size = recorder.block_size

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        return self.effect(logits, self.level, self.target)

    def record(self, module, weights, visible, query_positions) -> None:
        self.recorder.record(module, weights, visible, query_positions)


def forward_batch(
    loaded: LoadedModel, route: str, probe: Probe, level: float, batch: ProbeBatch, recorder: Recorder,
    layers: list[tuple[str, nn.Module]],
) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Run one batch under the probe at ``level``, observed by ``recorder``; returns extras as
    (sum, count), e.g. the LM loss."""
    kind = probe.kind
    recorder.valid = batch.valid
    recorder.target = batch.target
    observer: Recorder | LogitProbe = recorder
    if kind.acts_on is ActsOn.LOGITS and kind.changes(level):
        observer = LogitProbe(recorder, kind.effect, level, batch.target)
    device = loaded.device
    hooks = []
    if route == "eager-fallback":
        hooks = [m.register_forward_hook(recorder.fallback_hook) for _, m in layers]
    try:
        with torch.inference_mode(), observing(observer):
            if loaded.kind == "icl":
                return _icl_forward(loaded, kind, level, batch, device)
            if kind.acts_on is ActsOn.EMBEDDINGS and kind.changes(level):
                hooks.append(_embedding_hook(loaded, kind.effect, level, batch.target))
            return _hf_forward(loaded, route, batch, device)
    finally:
        for hook in hooks:
            hook.remove()


def _embedding_hook(loaded: LoadedModel, effect: Effect, level: float, target: torch.Tensor | None):
    try:
        embedding = loaded.attention_root.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        embedding = None
    if embedding is None:
        raise UnsupportedModelError(f"model family '{loaded.family}' exposes no input embeddings to scale")

    def apply(module, args, output):
        return effect(output, level, target)

    return embedding.register_forward_hook(apply)


def _hf_forward(loaded: LoadedModel, route: str, batch: ProbeBatch, device) -> dict[str, tuple[float, float]]:
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if loaded.kind == "seq2seq":
        kwargs.update(decoder_input_ids=ids, decoder_attention_mask=mask)
    if loaded.kind in ("causal", "seq2seq"):
        kwargs["use_cache"] = False
    if route == "eager-fallback":
        kwargs["output_attentions"] = True  # some eager paths only compute weights when asked
    out = loaded.model(**kwargs)
    logits = getattr(out, "logits", None)
    if loaded.kind != "causal" or logits is None or logits.shape[:2] != ids.shape:
        return {}
    keep = (mask[:, 1:] * mask[:, :-1]).bool()
    losses = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    losses = losses.view_as(keep)[keep]
    return {"loss": (float(losses.sum()), float(losses.numel()))}


def _icl_forward(loaded: LoadedModel, kind: ProbeKind, level: float, batch: ProbeBatch, device) -> dict:
    from ..icl.evaluate import FIRST_SCORED

    model = loaded.model
    xs = batch.xs
    if kind.acts_on is ActsOn.EMBEDDINGS and kind.changes(level):
        target = None if batch.target is None else batch.target // 2  # token index -> its x value
        xs = kind.effect(xs, level, target)
    tokens, ys = icl_tokens(model.spec.task, xs, batch.coef)
    dtype = next(model.parameters()).dtype
    predictions = model(tokens.to(device, dtype)).float().cpu()
    scored = slice(FIRST_SCORED - 1, None)
    if model.spec.task == "linear":
        errors = (predictions[:, scored] - ys[:, scored]) ** 2
    else:
        errors = (torch.sign(predictions[:, scored]) != ys[:, scored]).float()
    return {"error": (float(errors.sum()), float(errors.numel()))}


__all__ = ["LogitProbe", "Recorder", "forward_batch"]
