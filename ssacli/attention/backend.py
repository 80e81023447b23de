"""Which attention computation runs: a fused kernel (no [q, k] weight matrix) or the eager scorer.

:func:`attention_backend` picks auto, eager or fused for a block of code; :func:`eager_reason` is the
auto backend's routing rule; :func:`fused_output` runs the scorer's fused kernel where it may.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ..errors import UsageError
from ..scorers import Scorer
from .masks import causal_rows, causal_when_unmasked
from .sinks import with_sink_key

BACKENDS = ("auto", "eager", "fused")
_BACKEND: ContextVar[str] = ContextVar("ssacli_attention_backend", default="auto")


@contextmanager
def attention_backend(name: str) -> Iterator[str]:
    """Within this block, ssacli attention runs on backend ``name``.

    * ``auto`` (the default): the scorer's fused kernel (ssacli.kernels.fused: SDPA for softmax, the blocked
      or flex SSA kernel) whenever nothing needs the weight matrix: not under ``observing`` (diagnose),
      not with ``output_attentions``, no Gemma-2 softcap or T5 position bias, a boolean mask. The eager
      scorer otherwise.
    * ``eager``: always the scorer's own ``forward`` (the reference the fused kernels are tested on).
    * ``fused``: the fused kernel, and a UsageError naming the reason where there is none.
    """
    check_backend(name)
    token = _BACKEND.set(name)
    try:
        yield name
    finally:
        _BACKEND.reset(token)


def check_backend(name: str) -> None:
    """UsageError unless ``name`` is an attention backend (the CLI's --attention values)."""
    if name not in BACKENDS:
        raise UsageError(f"--attention takes {', '.join(BACKENDS)}, got {name!r}")


def _weights_requested() -> bool:
    """Whether transformers is collecting attention weights in this forward (output_attentions)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without output capturing: stay on the exact path
        return True
    collected = _active_collector.get()
    return bool(collected) and any("attentions" in key for key in collected)


def eager_reason(scorer: Scorer, mask: torch.Tensor | None, kwargs: dict) -> str | None:
    """Why this call must compute the weight matrix, or None if a fused kernel may run (the auto
    backend's routing rule; tests/kernels/test_fused.py checks it)."""
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


def fused_output(module, scorer, query, key, value, mask, scaling, dropout, sink, kwargs):
    """The fused kernel's output [b, h, q, d], or None where this call takes the eager path (``sink``:
    the call's learned sink logits, :func:`~ssacli.attention.sinks.sink_logits`)."""
    backend = _BACKEND.get()
    if backend == "eager":
        return None
    reason = eager_reason(scorer, mask, kwargs)
    if reason is None:
        causal = mask is None and causal_when_unmasked(module, kwargs.get("is_causal"))
        if mask is not None:
            mask = mask[..., : key.shape[-2]]
        elif causal and kwargs.get("sliding_window") is not None and query.shape[-2] > 1:
            window = kwargs["sliding_window"]
            mask = causal_rows(slice(None), query.shape[-2], key.shape[-2], query.device, window)[None, None]
            causal = False
        if sink is not None:
            query, key, value, mask, causal = with_sink_key(query, key, value, mask, causal, sink, scaling)
        output = scorer.fused(
            query, key, value, scale=scaling, causal=causal, mask=mask,
            dropout=dropout if module.training else 0.0,
        )  # fmt: skip
        if output is not None and sink is not None:
            output = output[..., : value.shape[-1] - 1]
        if output is not None:
            return output
        reason = f"scorer '{scorer.name}' has no fused kernel for this call"
    if backend == "fused":
        raise UsageError(f"fused attention is not possible here: {reason}; use the auto or eager backend")
    return None
