"""Observing attention (diagnose, m=auto): stream every call's weights to an observer, block by block.

Within :func:`observing`, the attention function hands each call to :func:`observed_attention`,
which scores one block of query rows at a time and passes the weights to the :class:`Observer`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

import torch
from torch import nn

from ..errors import UsageError
from .online import online_observed_attention, online_reason
from .scorer_inputs import scaled_logits, visibility
from .sinks import scores_and_sink


class Observer(Protocol):
    """What diagnose plugs into the attention call (ssacli.diagnosis implements it)."""

    block_size: int  # query rows scored at a time

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        """The probe's change to the logits [b, h, q_rows, k] (logit-scale, dominant-key)."""
        ...

    def record(
        self,
        module: nn.Module,
        weights: torch.Tensor,
        visible: torch.Tensor | None,
        query_positions: torch.Tensor,
        sink: torch.Tensor | None = None,
    ) -> None:
        """Reduce one block of weights [b, h, q_rows, k] (key indices of the rows given). Models with
        learned sinks also pass ``sink`` [b, h, q_rows], the weight each row gave its sink key (passed
        only when there is one, so observers of other models may omit the keyword)."""
        ...


_OBSERVER: ContextVar[Observer | None] = ContextVar("ssacli_observer", default=None)


@contextmanager
def observing(observer: Observer) -> Iterator[Observer]:
    """Within this block, every ssacli attention call streams its weights to ``observer`` in query
    blocks and returns no weight map (so no [b, h, q, k] tensor outlives the call)."""
    token = _OBSERVER.set(observer)
    try:
        yield observer
    finally:
        _OBSERVER.reset(token)


def current_observer() -> Observer | None:
    """The observer of the enclosing :func:`observing` block, or None outside one."""
    return _OBSERVER.get()


def observed_attention(module, scorer, observer, query, key, value, mask, scaling, sink, kwargs):
    """The same attention, one block of query rows at a time: extra memory O(block × k) (``sink``: the
    call's learned sink logits, :func:`~ssacli.attention.sinks.sink_logits`)."""
    mode = getattr(observer, "stats_mode", "eager")  # diagnose's --stats: fused statistics where possible
    if mode != "eager":
        reason = online_reason(scorer, mask, kwargs)
        if reason is None:
            return online_observed_attention(
                module, scorer, observer, query, key, value, mask, scaling, sink, kwargs
            )
        if mode == "fused":
            raise UsageError(f"fused statistics are not possible here: {reason}; use --stats auto or eager")
    q_total, k_len = query.shape[-2], key.shape[-2]
    block = max(1, int(observer.block_size))
    # Optional observer seam (diagnose's key-scale probe): the keys as this call received them
    # (after projection, norm and rotary; K/V heads already repeated), changed before any logit.
    transform_key = getattr(observer, "transform_key", None)
    if transform_key is not None:
        key = transform_key(key, module)
    positions = torch.arange(k_len - q_total, k_len, device=query.device)
    outputs = []
    for start in range(0, q_total, block):
        rows = slice(start, min(start + block, q_total))
        logits = observer.transform(scaled_logits(query, key, scaling, kwargs, rows), module)
        logits, visible = visibility(logits, mask, module, kwargs, rows, q_total)
        extra = {"query_positions": positions[rows]} if scorer.uses_qk else {}
        block_sink = sink
        if sink is not None and sink.shape[-2] == q_total:
            block_sink = sink[:, :, rows]
        # Scored in at least float32 and kept so: the weights are observed as the scorer computed them
        # (a bf16 model's weights are rounded to bf16 only for the matmul below, as before).
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        weights, sink_weight = scores_and_sink(
            scorer, logits, visible, block_sink, query=query[:, :, rows], key=key, **extra
        )
        if sink_weight is None:
            observer.record(module, weights, visible, positions[rows])
        else:  # a learned sink: its weight [b, h, q_rows] too (observers of sink models take it)
            observer.record(module, weights, visible, positions[rows], sink=sink_weight)
        outputs.append(torch.matmul(weights.to(value.dtype), value))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None
