"""The two routes diagnose reads attention weights by, and everything about the second.

* :attr:`Route.SSACLI`: models on transformers' attention registry run through ssacli's attention
  function (softmax for an untouched model, exact to the eager path), which streams each call's
  weights to the :class:`~ssacli.diagnosis.recorder.Recorder` in query blocks; probes on keys and
  logits act inside that call. :func:`route_through_ssacli` puts a model on it.
* :attr:`Route.EAGER_FALLBACK`: families off the registry (gpt_neo, bloom, deberta-v2, …) run their
  own eager attention with ``output_attentions``; a forward hook on each attention module
  (:func:`fallback_hooks`) reduces its weights and drops them, so at most one layer's map exists at
  a time. Probes that need ssacli's attention function are skipped, and only the families in
  :data:`FALLBACK_FAMILIES` (checked by tests/diagnosis/test_fallback.py) are measured.

On either route, which normalization a shift of the residual stream meets before each layer
(:func:`is_norm`, :func:`absorber`) says whether a magnitude probe could reach attention at all.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import torch
from torch import nn

from ..attention.interface import (
    CONFIG_SPEC_ATTR,
    apply_scorer,
    attention_modules,
    named_attention,
    num_heads,
    reattach,
    scorers_of,
    supports,
    unaudited_reason,
)
from ..errors import UnsupportedModelError, UsageError
from ..scorers import make_scorer


class Route(StrEnum):
    """How diagnose reaches the weights (written as its value in results: "ssacli", "eager-fallback")."""

    SSACLI = "ssacli"
    EAGER_FALLBACK = "eager-fallback"


# Refused families whose eager attention ``ssacli diagnose`` measures (Route.EAGER_FALLBACK): each is
# checked by tests/diagnosis/test_fallback.py, diagnose's per-layer/per-head metrics against the model's own
# ``output_attentions`` weights. Diagnose refuses every other family off the registry.
FALLBACK_FAMILIES = frozenset({
    "bloom", "convbert", "deberta", "deberta-v2", "falcon", "git", "got_ocr2", "gpt_neo", "gpt_neox_japanese",
    "luke", "megatron-bert", "modernvbert", "mpt", "mvp", "nystromformer", "olmo_hybrid", "phi4_multimodal",
    "rembert", "roformer", "tapas", "trocr", "xglm",
})  # fmt: skip
# Refused families the fallback does not measure correctly, and why
# (tests/diagnosis/test_fallback.py lists them).
FALLBACK_UNCHECKED = {
    "flaubert": "max weight off by 0.18: its attention module's output is not its weights over the keys",
    "xlm": "max weight off by 0.18 (flaubert's attention)",
    "fsmt": "the decoder's causal self-attention is measured as bidirectional (entropy off)",
    "pegasus_x": "decoder self-attention measured as bidirectional; global tokens",
    "granite_speech": "sliding/causal structure unknown to the fallback (entropy off by 0.37)",
    "granite_speech_plus": "granite_speech's attention",
    "gemma3": "sliding-window layers: the fallback's N_i ignores the window (entropy off by 0.25)",
    "hy_v4": "sparse top-k key indices chosen outside attention: N_i wrong (entropy off by 0.14)",
    "minimax_m3_vl_text": "block-sparse key indices chosen outside attention (hy_v4 at longer inputs)",
    "t5gemma2": "layers do not correspond to the eager weights returned",
    "prophetnet": "n-gram streams: reports 16 heads for 4",
    "ibert": "its attention module returns no weights: nothing recorded",
    "openai-gpt": "its attention module returns no weights: nothing recorded",
    "squeezebert": "its attention module returns no weights: nothing recorded",
    "big_bird": "output_attentions returns no weights to check against",
    "mra": "output_attentions returns no weights to check against",
    "rwkv": "no softmax attention (the 4-D tensor recorded is its state)",
    "yoso": "hashing attention: no weight map (the tensor recorded is not attention)",
    "funnel": "pooling changes the query length between layers",
    "minimax": "linear-attention layers return maps of another length",
    "cpmant": "the forward fails under diagnose",
    "led": "the forward fails under diagnose (sliding-chunk attention)",
    "longformer": "the forward fails under diagnose (sliding-chunk attention)",
    "longt5": "the forward fails under diagnose (local/transient-global attention)",
    "falcon_mamba": "no attention layers",
    "fnet": "no attention layers (Fourier mixing)",
    "mamba": "no attention layers",
}


def choose_route(root: nn.Module, family: str, scorer: str | None) -> Route:
    """ssacli's route where every attention layer can be scored exactly; else the eager fallback,
    for a verified fallback family without ``--scorer`` (UnsupportedModelError otherwise)."""
    if supports(root):
        return Route.SSACLI
    if scorer is not None:
        raise UnsupportedModelError(
            f"model family '{family}' does not route attention through transformers' "
            "AttentionInterface, so --scorer cannot be applied; diagnose it without --scorer"
        )
    if family not in FALLBACK_FAMILIES:
        why = FALLBACK_UNCHECKED.get(family, "not checked against its eager weights")
        raise UnsupportedModelError(
            f"model family '{family}' does not route attention through transformers' "
            f"AttentionInterface and diagnose's eager fallback is not verified for it ({why}); "
            "verified fallback families: docs/diagnose.md"
        )
    return Route.EAGER_FALLBACK


def route_unaudited_reason(family: str, route: Route) -> str | None:
    """Why a model of ``family`` on ``route`` is not covered by a check, or None when it is: on ssacli's
    route the all-family audit (:func:`~ssacli.attention.interface.unaudited_reason`); on the fallback,
    the fallback test (every family :func:`choose_route` lets through is verified)."""
    if route is Route.EAGER_FALLBACK:
        if family in FALLBACK_FAMILIES:
            return None
        return f"family '{family}' runs on the eager fallback, which is not verified for it"
    return unaudited_reason(family)


def attention_layers(root: nn.Module, route: Route) -> list[tuple[str, nn.Module]]:
    """(name, module) of every attention layer diagnose measures on ``route``."""
    if route is Route.SSACLI:
        return list(attention_modules(root))
    # Off the registry there is no seam to find attention by: the innermost modules whose class is
    # named *Attention* are the ones that compute the weights (why a name: named_attention;
    # tests/diagnosis/test_fallback.py checks each verified family's layers against its own
    # output_attentions).
    found = []
    for name, module in root.named_modules():
        if named_attention(module) and not any(named_attention(m) for m in list(module.modules())[1:]):
            found.append((name, module))
    if not found:
        raise UnsupportedModelError(
            f"found no attention layers in model family '{getattr(root.config, 'model_type', '?')}'"
        )
    return found


def layer_heads(module: nn.Module, root: nn.Module, route: Route) -> int:
    """Heads of one measured layer. On ssacli's route the attention module says (as for per-head
    scorer parameters; a module that cannot is refused); a fallback module may keep its head count
    under another name, so there the config's ``num_attention_heads`` answers."""
    if route is Route.SSACLI:
        return num_heads(module, root)
    try:
        return num_heads(module, root)
    except UnsupportedModelError:
        return int(getattr(root.config, "num_attention_heads", 1) or 1)


def forward_arguments(route: Route) -> dict:
    """Extra keyword arguments of the model's forward on ``route``: some eager paths compute the
    weights only when asked."""
    return {"output_attentions": True} if route is Route.EAGER_FALLBACK else {}


def fallback_hooks(recorder, layers: list[tuple[str, nn.Module]]) -> list:
    """Forward hooks on the fallback's attention modules: each reduces the weights its module returns
    (:meth:`Recorder.record`, with the module's structural mask) and drops them from the output."""

    def hook(module, args, output):
        if not isinstance(output, tuple):
            return None
        for index, item in enumerate(output):
            if isinstance(item, torch.Tensor) and item.dim() == 4 and item.is_floating_point():
                q, k = item.shape[-2:]
                positions = torch.arange(k - q, k, device=item.device)
                visible = structural_mask(module, item, positions, recorder.causal, recorder.valid)
                recorder.record(module, item, visible, positions)
                return (*output[:index], None, *output[index + 1 :])
        return None

    return [module.register_forward_hook(hook) for _, module in layers]


def structural_mask(module: nn.Module, weights: torch.Tensor, positions: torch.Tensor, causal: bool, valid):
    """Which keys each row may see: the module's own causal/local-window buffer when it has one
    (GPT-Neo's ``bias``), else causal by family; and the batch's key padding (``valid`` [b, k])."""
    k = weights.shape[-1]
    visible = torch.ones(1, 1, len(positions), k, dtype=torch.bool, device=weights.device)
    buffer = getattr(module, "bias", None)
    if isinstance(buffer, torch.Tensor) and buffer.dtype == torch.bool and buffer.dim() == 4:
        if buffer.shape[-1] >= k:
            visible = visible & buffer[:, :, positions, :k].to(weights.device)
    elif causal:
        visible = visible & (torch.arange(k, device=weights.device) <= positions.unsqueeze(-1))
    if valid is not None and valid.shape[-1] == k:
        visible = visible & valid.to(weights.device)[:, None, None, :]
    return visible


def route_through_ssacli(root: nn.Module, scorer: str | None) -> Callable[[], None] | None:
    """Route the model through ssacli's attention function (:attr:`Route.SSACLI`) with ``scorer``, or
    the scorer its config names, or softmax; return how to put it back (None: it was already
    scored, as an ICL or converted model is, and is measured as it is)."""
    before = scorers_of(root)
    if before and scorer is None:
        return None  # already scored (an ICL or converted model): measure it as it is
    spec_before = getattr(root.config, CONFIG_SPEC_ATTR, None)
    if scorer is None and spec_before and make_scorer(spec_before).needs_calibration:
        # A converted folder loaded by plain transformers: its config names the scorer, but the m
        # chosen per layer lives in the folder's scorer file, which that load does not read.
        raise UsageError(
            f"this model's config names scorer '{spec_before}', whose values per layer were saved in "
            "its folder; diagnose the folder itself (ssacli diagnose DIR, or ssacli.load(DIR)) so they "
            "load, or pass scorer= to measure another"
        )
    apply_scorer(root, scorer or spec_before or "softmax")
    return lambda: reattach(root, before, spec_before)


__all__ = [
    "FALLBACK_FAMILIES", "FALLBACK_UNCHECKED", "Route", "attention_layers", "choose_route", "fallback_hooks",
    "forward_arguments", "layer_heads", "route_through_ssacli", "route_unaudited_reason", "structural_mask",
]  # fmt: skip


# ---- where a shift of the residual stream is normalized away ---------------------------------------

NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)
EPSILON_ATTRS = ("eps", "variance_epsilon")  # torch's norms; transformers' *RMSNorm and T5LayerNorm


def is_norm(module: nn.Module) -> bool:
    """Whether ``module`` normalizes its input (what a shift of the residual stream is absorbed by),
    told by what it is, not by its class's name: a torch norm; or a leaf that holds a float epsilon
    (how transformers builds its own RMSNorm classes, with or without a weight) or a
    ``normalized_shape`` (OLMo's LayerNorm without parameters, which passes its epsilon as a literal).
    MobileBERT's ``NoNorm`` (an elementwise affine standing where LayerNorm would) is not one: it
    normalizes nothing, so nothing is absorbed there (tests/diagnosis/test_reach.py lists norms by
    behaviour)."""
    if list(module.children()):
        return False
    if isinstance(module, NORMS):
        return True
    return any(isinstance(getattr(module, a, None), float) for a in EPSILON_ATTRS) or hasattr(
        module, "normalized_shape"
    )


def absorber(norms: list[str], attention: str) -> str | None:
    """The normalization a shift of the residual stream meets last before ``attention`` (a module
    name), from the norms that ran since the previous attention layer (:attr:`Recorder.norms_before`):
    the last one outside the attention module (a pre-norm block's input norm, a post-norm block's
    output norm, the embeddings' norm before layer 0), since q/k norms inside it act only after
    that; a norm inside it where no other ran; None where none ran (nothing normalizes the stream)."""
    outside = [name for name in norms if not name.startswith(attention + ".")]
    chosen = outside or norms
    return chosen[-1] if chosen else None
