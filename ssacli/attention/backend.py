"""Whether a call inside a model computes the weight matrix (the eager scorer, the reference) or runs
the scorer's fused kernel, and the fused kernel's output.

The decision is ssacli.kernels.routing.choose_backend's, asked with the call's facts: why the weights
are needed (:func:`eager_reason`; None where nothing needs them) and the backend the model was given
(:func:`ssacli.attention.interface.attention_backend` sets it on each attention module, ``auto`` where
none was; ``auto`` then reads ``SSACLI_BACKEND``). Nothing else decides: no context or process-wide
switch.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UsageError
from ..kernels import routing
from ..kernels.visibility import causal_visibility
from ..scorers import Scorer
from .masks import causal_when_unmasked
from .sinks import with_sink_key

BACKEND_ATTR = "ssacli_backend"  # an attention module's backend (ssacli.kernels.routing.BACKENDS), if set


def check_backend(name: str) -> None:
    """UsageError unless ``name`` is a model-wide attention backend (the CLI's --attention values,
    ssacli.kernels.routing.MODEL_BACKENDS)."""
    if name not in routing.MODEL_BACKENDS:
        raise UsageError(f"--attention takes {', '.join(routing.MODEL_BACKENDS)}, got {name!r}")


def module_backend(module: nn.Module) -> str:
    """The backend an attention module was given (ssacli.attention.interface.attention_backend), else
    "auto"."""
    return getattr(module, BACKEND_ATTR, "auto")


def _weights_requested() -> bool:
    """Whether transformers is collecting attention weights in this forward (output_attentions)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without output capturing: stay on the exact path
        return True
    collected = _active_collector.get()
    return bool(collected) and any("attentions" in key for key in collected)


def eager_reason(scorer: Scorer, mask: torch.Tensor | None, kwargs: dict) -> str | None:
    """Why this call must compute the weight matrix, or None if a fused kernel may run (a fact of the
    call for choose_backend; tests/kernels/test_fused.py checks it)."""
    if _weights_requested():
        return "the attention weights were requested (output_attentions)"
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return "the model adds a softcap or a position bias to the logits"
    if mask is not None and mask.dtype != torch.bool:
        return "the model passed a float attention mask"
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return "packed sequences (cu_seq_lens_*) are separated in the eager mask"
    if type(scorer).fused is Scorer.fused:
        return f"scorer '{scorer.name}' has no fused kernel"
    return None


def _choose(backend: str, query: torch.Tensor, reason: str | None) -> str:
    call = routing.Call(query.device.type, query.dtype, scope="model", backend=backend, weights_needed=reason)
    return routing.choose_backend(call)


def fused_output(module, scorer, query, key, value, mask, scaling, dropout, sink, kwargs):
    """The fused kernel's output [b, h, q, d], or None where this call takes the eager path (``sink``:
    the call's learned sink logits, :func:`~ssacli.attention.sinks.sink_logits`)."""
    backend = routing.requested(module_backend(module))
    if _choose(backend, query, eager_reason(scorer, mask, kwargs)) == "eager":
        return None
    causal = mask is None and causal_when_unmasked(module, kwargs.get("is_causal"))
    if mask is not None:
        mask = mask[..., : key.shape[-2]]
    elif causal and kwargs.get("sliding_window") is not None and query.shape[-2] > 1:
        window = kwargs["sliding_window"]
        mask = causal_visibility(query.shape[-2], key.shape[-2], query.device, window=window)[None, None]
        causal = False
    if sink is not None:
        query, key, value, mask, causal = with_sink_key(query, key, value, mask, causal, sink, scaling)
    output = scorer.fused(
        query, key, value, scale=scaling, causal=causal, mask=mask,
        dropout=dropout if module.training else 0.0, backend="auto" if backend == "fused" else backend,
    )  # fmt: skip
    if output is not None and sink is not None:
        output = output[..., : value.shape[-1] - 1]
    if output is not None:
        return output
    # the scorer has no fused kernel for this call: the reference, or under "fused" a UsageError
    _choose(backend, query, f"scorer '{scorer.name}' has no fused kernel for this call")
    return None


__all__ = ["BACKEND_ATTR", "check_backend", "eager_reason", "fused_output", "module_backend"]
