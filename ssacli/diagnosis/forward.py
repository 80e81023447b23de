"""One forward pass of diagnose under a probe: the probe's application, and the :class:`Recorder`
that observes the attention.

Where a probe acts is declared by its kind (:class:`ssacli.diagnosis.probes.ActsOn`), and this
module dispatches on that: on the keys or the attention logits, the :class:`Recorder` applies the
kind's effect inside ssacli's attention function (:attr:`Recorder.probe`); on the input embeddings,
a forward hook on the embedding module applies it (ICL models: the x values themselves); on the inputs alone
(length, numeric), :mod:`ssacli.diagnosis.run` chose them and nothing happens here. Whatever the
route, every attention map reaches :meth:`Recorder.record`, is reduced to per-row statistics
(:func:`ssacli.kernels.row_stats.weight_statistics`, the same statistics the fused path's
:meth:`Recorder.record_rows` receives) and leaves as per-head sums
(:func:`ssacli.diagnosis.row_metrics.row_sums`): through ssacli's attention function in query blocks,
or, on the eager fallback, through the forward hook of :mod:`ssacli.diagnosis.routes` on each
attention module, which drops the map once reduced. What the forward's output logits say (the KL to
the reference level, the LM loss) is :mod:`ssacli.diagnosis.output_measures`'; :class:`OutputReference`
imports from here too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..attention.forward import Observer, observing
from ..errors import UnsupportedModelError
from ..kernels.positions import PositionBins
from ..kernels.row_stats import RowStatistics, weight_statistics
from ..models.icl_task import TOKENS_PER_POINT, interleave, labels, prediction_errors
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel
from .metrics import HeadStats, LayerStats, PromptStats
from .output_measures import OutputReference, next_token_losses
from .probes import ActsOn, Probe, ProbeBatch, ProbeKind, Shift
from .routes import Route, fallback_hooks, forward_arguments, is_norm
from .row_metrics import PROMPT_SUMS, logit_sums, row_sums

# ---- the probes' shifts ------------------------------------------------------------------------------
# Each takes (values, level, target) -> values. Embeddings: [b, tokens, ...] (ICL: x values [b, points]);
# keys: [b, h, k, d]; logits: [b, h, q, k]; target [b] indexes the probed token (probes.Shift).


def scale(values: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    return values * level


def scale_target(values: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    values = values.clone()  # a copy: the module's own output is left as it was
    rows = torch.arange(values.shape[0], device=values.device)
    values[rows, target.to(values.device)] *= level
    return values


def scale_target_key(keys: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    factor = torch.ones(keys.shape[0], 1, keys.shape[2], 1, dtype=keys.dtype, device=keys.device)
    # a level past the dtype's range becomes inf (so the forward overflows, and says so), not an error
    level_t = torch.tensor(level, dtype=torch.float64).to(keys.dtype)
    factor[torch.arange(keys.shape[0], device=keys.device), 0, target.to(keys.device), 0] = level_t
    return keys * factor


def raise_target_key(logits: torch.Tensor, level: float, target: torch.Tensor | None = None) -> torch.Tensor:
    k = logits.shape[-1]
    bump = F.one_hot(target.to(logits.device), k).to(logits.dtype) * level
    return logits + bump.reshape(-1, 1, 1, k)


SHIFTS = {
    Shift.SCALE: scale,
    Shift.SCALE_TARGET: scale_target,
    Shift.SCALE_TARGET_KEY: scale_target_key,
    Shift.RAISE_TARGET_KEY: raise_target_key,
}


def shifted(kind: ProbeKind, values: torch.Tensor, level: float, target: torch.Tensor | None) -> torch.Tensor:
    """``values`` under probe ``kind`` at ``level``."""
    return SHIFTS[kind.effect](values, level, target)


def block_name(attention_name: str) -> str:
    """The block (decoder/encoder layer) an attention module sits in: its name up to the last
    numeric component ("model.layers.3.self_attn" -> "model.layers.3"), else its parent."""
    parts = attention_name.split(".")
    numeric = [i for i, p in enumerate(parts) if p.isdigit()]
    return ".".join(parts[: numeric[-1] + 1] if numeric else parts[:-1])


class Overflow:
    """Where a forward first produced a non-finite value (or a norm's sum of squares overflowed)."""

    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None  # {"layer": index or None, "where": module or stage}

    def note(self, layer: int | None, where: str) -> None:
        if self.first is None:
            self.first = {"layer": layer, "where": where}


class Recorder(Observer):
    """The :class:`~ssacli.attention.forward.Observer` diagnose plugs into attention: the probe's
    ``effect`` on every call's keys (:meth:`transform_key`, before the logits are formed) or logits
    (:meth:`transform`) when :attr:`probe` is set, and the reduction of every block of attention
    weights (or of the fused path's row statistics) into per-layer :class:`HeadStats`."""

    def __init__(
        self, layer_of: dict[int, int], *, tau: float, top_k: int, block_size: int, causal: bool,
        stats: str = "eager", positions: PositionBins | None = None, prompts: PromptStats | None = None,
    ):  # fmt: skip
        self.layer_of = layer_of
        self.tau, self.top_k, self.block_size, self.causal = tau, top_k, block_size, causal
        self.positions = positions  # the bins of the sink and position metrics (None: not measured)
        # "eager": blocks of weights reduced to row statistics; "fused": those of one blocked pass
        # (ssacli.attention.forward.online_observed_attention), refused where a call cannot; "auto":
        # fused where a call can.
        self.stats_mode = stats
        self.calls = {"fused": 0, "eager": 0}  # which path measured each attention call
        self.stats: dict[int, HeadStats] = {}
        self.layers: dict[int, LayerStats] = {}  # logits' scale, hidden states
        self.overflow = Overflow()
        self.prompts = prompts  # each prompt's collapse (the noise a verdict reads a change against)
        self.batch = 0  # the index of the batch being recorded (forward_batch sets it)
        self.losses: list[float] = []  # each input's mean next-token loss, in input order (causal LMs)
        self.valid: torch.Tensor | None = None  # [b, t] real tokens of the current batch
        self.target: torch.Tensor | None = None  # [b] target token of the current batch (outlier_capture)
        # Where a shift can be absorbed: the normalization modules run since the last attention layer
        # began, and per layer those that ran before its first call (see :func:`absorber`).
        self.norms_seen: list[str] = []
        self.norms_before: dict[int, list[str]] = {}
        # The probe that acts inside attention in the current forward: (kind, level), or None
        # (reference levels, and probes that act on embeddings or inputs).
        self.probe: tuple[ProbeKind, float] | None = None
        # The kind of the probe being run, at every level (its reference level too): all levels of a
        # probe on the logits take the same attention path (changes_logits), so a level that changes
        # nothing reads exactly as the reference instead of differing by another kernel's rounding.
        self.probe_kind: ProbeKind | None = None

    def transform_key(self, key: torch.Tensor, module: nn.Module) -> torch.Tensor:
        if self.probe is not None and self.probe[0].acts_on is ActsOn.KEYS:
            kind, level = self.probe
            if self.target is not None and key.shape[0] == self.target.shape[0]:
                return shifted(kind, key, level, self.target)
        return key

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        if self.probe is not None and self.probe[0].acts_on is ActsOn.LOGITS:
            kind, level = self.probe
            logits = shifted(kind, logits, level, self.target)
        layer = self.layer_of.get(id(module))
        if layer is not None and not torch.isfinite(logits).all():
            self.overflow.note(layer, "attention logits")
        return logits

    def transform_block(self, logits: torch.Tensor, module: nn.Module, cols: slice) -> torch.Tensor:
        """:meth:`transform` of the key columns ``cols`` (the fused statistics): a target outside them
        is sent to one spare column (dropped after), so the effect changes exactly the entries it
        changes on whole rows."""
        if self.probe is None or self.probe[0].acts_on is not ActsOn.LOGITS:
            return logits
        kind, level = self.probe
        if self.target is None or not kind.has_target:
            return shifted(kind, logits, level, self.target)
        width = logits.shape[-1]
        local = self.target.to(logits.device).long() - cols.start
        local = torch.where((local < 0) | (local >= width), width, local)
        return shifted(kind, F.pad(logits, (0, 1)), level, local)[..., :width]

    def changes_logits(self, module: nn.Module) -> bool:
        # probe_kind while diagnose runs a probe; probe alone where a caller sets only that
        kind = self.probe_kind or (self.probe[0] if self.probe is not None else None)
        return kind is not None and kind.acts_on is ActsOn.LOGITS

    def layer_stats(self, layer: int) -> LayerStats:
        if layer not in self.layers:
            self.layers[layer] = LayerStats()
        return self.layers[layer]

    def record(self, module, weights, visible, query_positions, sink=None, logits=None) -> None:
        """One block of weights, reduced to the per-row statistics :meth:`record_rows` takes (with the
        block's logits, for the logit scale)."""
        layer = self.layer_of.get(id(module))
        if layer is None:
            return
        if logits is not None and logits.shape != weights.shape:
            logits = None
        target = None
        if self.valid is not None and self.valid.shape[-1] == weights.shape[-1]:  # keys: this batch's tokens
            target = self.target
        stats = weight_statistics(
            weights, visible, logits=logits, target=target, top_k=self.top_k, sink=sink,
            positions=self.positions, query_positions=query_positions,
        )  # fmt: skip
        self._add(layer, stats, query_positions, "eager")

    def record_rows(self, module, stats: RowStatistics, query_positions) -> None:
        """:meth:`record` for the fused path: one call's per-row statistics instead of its weights."""
        layer = self.layer_of.get(id(module))
        if layer is not None:
            self._add(layer, stats, query_positions, "fused")

    def _add(self, layer: int, stats: RowStatistics, query_positions, path: str) -> None:
        """One call's (or block's) statistics into the layer's sums: the row metrics and the logit scale."""
        if layer not in self.norms_before:
            self.norms_before[layer] = self.norms_seen
        self.norms_seen = []
        self.calls[path] += 1
        if not stats.finite_logits:
            self.overflow.note(layer, "attention logits")
        if not stats.finite_output:
            self.overflow.note(layer, "attention weights")
        valid = target = None
        if self.valid is not None and self.valid.shape[-1] == stats.keys:  # keys are this batch's tokens
            valid = self.valid.to(stats.max.device)[:, query_positions]
            target = self.target
        sums = logit_sums(stats, query_valid=valid, query_positions=query_positions, target=target)
        if sums:
            layer_stats = self.layer_stats(layer)
            for name, value in sums.items():
                layer_stats.sums[name] += value
        prompts = self.prompts
        sums = row_sums(
            stats, query_valid=valid, query_positions=query_positions, target=target,
            tau=self.tau, top_k=self.top_k,
            prompts=prompts is not None, prompt_length=None if prompts is None else prompts.length,
        )  # fmt: skip
        if prompts is not None:
            prompts.add(layer, self.batch, [sums.pop(name) for name in PROMPT_SUMS])
        if layer not in self.stats:
            self.stats[layer] = HeadStats(stats.max.shape[1])
        self.stats[layer].add(sums)

    def hidden_hook(self, layer: int):
        """Forward hook on a block: its output's values on real tokens feed the layer's massive
        activations and kurtosis; a non-finite output is an overflow."""

        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or not hidden.is_floating_point():
                return
            if not all_finite(hidden):
                self.overflow.note(layer, f"layer {layer} output")
            if self.valid is not None and self.valid.shape == hidden.shape[:2]:
                values = hidden[self.valid.to(hidden.device)]
            else:
                values = hidden.flatten(0, 1)
            self.layer_stats(layer).add_hidden(values.detach().float().flatten())

        return hook

    def norm_hook(self, layer: int | None, name: str):
        """Forward pre-hook on a normalization module: an input whose sum of squares is not finite
        in float32 overflows the norm (RMSNorm turns it into zeros, LayerNorm into NaN)."""

        def hook(module, args):
            self.norms_seen.append(name)
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if x is None or not x.is_floating_point():
                return
            x = x.float()
            if not all_finite(torch.einsum("...i,...i->...", x, x)):  # Σx² per row, no x² tensor
                self.overflow.note(layer, name)

        return hook


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value of a floating tensor is finite, in one reading pass: aminmax is NaN where
    any value is NaN and ±inf where one is (isfinite(...).all() writes and reads a boolean copy)."""
    if values.numel() == 0:
        return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def forward_batch(
    loaded: LoadedModel, route: Route, probe: Probe, level: float, batch: ProbeBatch, recorder: Recorder,
    layers: list[tuple[str, nn.Module]], reference: OutputReference | None = None, index: int = 0,
) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Run one batch under the probe at ``level``, observed by ``recorder``; returns extras as
    (sum, count), e.g. the LM loss, and with a ``reference`` the output KL to its first level's
    forward of batch ``index`` (the logits the forward returns anyway: no extra forward)."""
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
                extras = _icl_forward(loaded, kind, level, batch, device, recorder)
            else:
                if kind.acts_on is ActsOn.EMBEDDINGS and kind.changes(level):
                    hooks.append(_embedding_hook(loaded, kind, level, batch.target))
                extras = _hf_forward(loaded, route, batch, device, recorder, reference, index)
    finally:
        for hook in hooks:
            hook.remove()
        recorder.probe = recorder.probe_kind = None
    return extras


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
    loaded: LoadedModel, route: Route, batch: ProbeBatch, device, recorder: Recorder,
    reference: OutputReference | None = None, index: int = 0,
) -> dict[str, tuple[float, float]]:  # fmt: skip
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
        return {}
    extras: dict[str, tuple[float, float]] = {}
    if reference is not None:
        kl = reference.compare(index, logits, mask.bool())
        if kl is not None:
            extras["output_kl"] = kl
    if loaded.kind != ModelKind.CAUSAL:
        return extras
    keep = (mask[:, 1:] * mask[:, :-1]).bool()
    token_losses = next_token_losses(logits, ids)
    losses = token_losses[keep]
    if not torch.isfinite(losses).all():
        recorder.overflow.note(None, "loss")
    extras["loss"] = (float(losses.sum()), float(losses.numel()))
    # each input's own mean (per prompt: the shift probe's damage per document, ssacli.diagnosis.shift)
    per_row = torch.where(keep, token_losses, 0).sum(1) / keep.sum(1).clamp(min=1)
    recorder.losses.extend(float(v) for v in per_row)
    return extras


def _icl_forward(
    loaded: LoadedModel, kind: ProbeKind, level: float, batch: ProbeBatch, device, recorder: Recorder
) -> dict:
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
    return {"error": (float(errors.sum()), float(errors.numel()))}


__all__ = ["Overflow", "Recorder", "block_name", "forward_batch"]
