"""Learned attention sinks (gpt-oss's ``s_aux``, inkling2's ``sinks``): one extra, always visible key
whose logit is the sink and whose value is zero.

:func:`sink_logits` reads the sink from an attention call;
:func:`scores_and_sink` scores it with any scorer (the eager path and
diagnose); :func:`with_sink_key` turns it into an ordinary first key for fused kernels that know
no sinks.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.visibility import causal_visibility
from ..scorers import Scorer


def sink_logits(kwargs: dict) -> torch.Tensor | None:
    """The learned sink logits of this call, broadcastable to [b, h, q, 1], or None.

    gpt-oss passes ``s_aux`` [h] (one learned logit per head); inkling2 passes ``sinks`` [b, h, q, 1]
    (one per query). Either is a key that every query sees, whose logit is the sink and whose value is
    zero: with softmax, weights = exp(x) / (exp(s) + Σ exp(x)), as those models' eager paths compute.
    """
    sink = kwargs.get("s_aux")
    if sink is None:
        sink = kwargs.get("sinks")
    if sink is None:
        return None
    return sink.reshape(1, -1, 1, 1) if sink.dim() == 1 else sink


def with_sink_key(query, key, value, mask, causal, sink, scaling):
    """The same attention with the sink as an ordinary first key, for kernels that know no sinks.

    Every key gets one more, zero feature and the sink key is (0, …, 0, 1) with a zero value; every
    query gets the feature sink/scaling, so the scaled logit of the sink key is the sink itself and
    every other logit is unchanged. Values get a zero feature too (sliced off the output). The sink
    key is first and always visible, so a causal call becomes an explicit mask. Returns (query, key,
    value, mask, causal) for the kernel: query [b, h, q, d+1], key/value [b, h_kv, k+1, d+1].
    """
    b, h, q, _ = query.shape
    k_len = key.shape[-2]
    feature = (sink.to(query.dtype) / scaling).expand(b, h, q, 1)
    query = torch.cat([query, feature], dim=-1)
    key = nn.functional.pad(key, (0, 1, 1, 0))
    key[..., 0, -1] = 1.0
    value = nn.functional.pad(value, (0, 1, 1, 0))
    if causal:
        mask = causal_visibility(q, k_len, query.device)[None, None]
    if mask is not None:
        mask = torch.cat([mask.new_ones(*mask.shape[:-1], 1), mask], dim=-1)
    return query, key, value, mask, False


def scores_and_sink(
    scorer: Scorer,
    logits: torch.Tensor,
    visible: torch.Tensor | None,
    sink: torch.Tensor | None,
    **inputs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scorer's weights [b, h, q, k] and, with a learned ``sink`` [b|1, h, q|1, 1], the weight the
    sink key took [b, h, q] (None without one): the sink is one extra, always visible key whose
    logit is the sink and whose value is zero, so its weight is dropped from the output.

    What the sink means therefore follows from each scorer's definition on an extra key: softmax gives
    exp(x)/(exp(s) + Σ exp(x)) (gpt-oss's eager path); SSA transforms s like any logit; sparse scorers
    may give the sink all or none of the mass; scorers counting visible keys count it (docs/scorers.md).
    """
    if sink is None:
        return scorer(logits, visible, **inputs), None
    b, h, q, k = logits.shape
    column = sink.to(logits.dtype).expand(b, h, q, 1)
    if visible is None:
        visible = torch.ones(1, 1, 1, k, dtype=torch.bool, device=logits.device)
    visible = visible.expand(b, h, q, k)
    visible = torch.cat([visible, visible.new_ones(b, h, q, 1)], dim=-1)
    weights = scorer(torch.cat([logits, column], dim=-1), visible, **inputs)
    return weights[..., :k], weights[..., k]
