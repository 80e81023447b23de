"""Learned attention sinks (gpt-oss's ``s_aux``, inkling2's ``sinks``): one extra, always visible key
whose logit is the sink and whose value is zero.

:func:`sink_logits` reads the sink from an attention call;
:func:`~ssacli.attention.forward.scores_and_sink` scores it with any scorer (the eager path and
diagnose); :func:`with_sink_key` turns it into an ordinary first key for fused kernels that know
no sinks.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.visibility import causal_visibility


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
