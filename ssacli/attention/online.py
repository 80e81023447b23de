"""Diagnose's fused statistics: an observed attention call reduced to per-row statistics in one
blocked pass (ssacli.kernels.online_stats), never forming a [rows, keys] weight tile.

It serves scorers that are a softmax of a transformed logit (:meth:`Scorer.transformed_logits`:
softmax, temperature, SSA, SSMax, sink, softmax1) and describes the call as one
:class:`~ssacli.kernels.stats_call.StatisticsCall` (mask or causal band, softcap, position bias, the
observer's probe, the scorer's transform and keyless terms); the kernel forms every block's logits
exactly as :func:`~ssacli.attention.forward.observed_attention` does, so its statistics are those of
the eager weights. Whether an observed call (:class:`~ssacli.attention.forward.Observer`) takes this
path is ssacli.kernels.routing.choose_backend's decision (:func:`statistics_backend`), from the
observer's ``stats_mode`` (``--stats``) and :func:`online_reason`, why a call cannot: the eager path
then under "auto", a UsageError under "fused".
"""

from __future__ import annotations

import torch

from ..kernels import routing
from ..kernels.online_stats import STATS_BLOCK_KEYS, softmax_statistics
from ..kernels.stats_call import StatisticsCall
from ..scorers import Scorer
from ..scorers.softmax_family import SSA, Softmax
from .masks import causal_when_unmasked

STATS_MODES = routing.MODEL_BACKENDS  # --stats: the values of every model-wide backend option


def online_reason(scorer: Scorer, mask: torch.Tensor | None, kwargs: dict) -> str | None:
    """Why this call's statistics need the eager weights, or None if the fused pass computes them."""
    if scorer.uses_qk or type(scorer).transformed_logits is Scorer.transformed_logits:
        return f"scorer '{scorer.name}' is not a softmax of a transformed logit"
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return "packed sequences (cu_seq_lens_*) are separated in the eager mask"
    if mask is not None and mask.dim() != 4:
        return f"the model passed a {mask.dim()}-d attention mask"
    return None


def statistics_backend(observer, query: torch.Tensor, reason: str | None) -> str:
    """ "eager" where this observed call takes the eager weights, else the backend its fused
    statistics run on (ssacli.kernels.online_stats.softmax_statistics's ``backend``): chosen by
    ssacli.kernels.routing.choose_backend from the observer's ``stats_mode`` (``auto`` reads
    SSACLI_BACKEND) and ``reason`` (:func:`online_reason`)."""
    backend = routing.requested(observer.stats_mode)
    call = routing.Call(
        query.device.type,
        query.dtype,
        kind="statistics",
        scope="model",
        backend=backend,
        weights_needed=reason,
    )
    if routing.choose_backend(call) == "eager":
        return "eager"
    return "auto" if backend == "fused" else backend


def online_observed_attention(
    module, scorer, observer, query, key, value, mask, scaling, sink, kwargs, backend: str = "auto"
):
    """:func:`~ssacli.attention.forward.observed_attention`'s output, with the call's statistics
    handed to ``observer.record_rows`` instead of its weights to ``observer.record``. key/value are
    already repeated for GQA; ``sink``: the learned sink logits or None; ``backend``: the statistics'
    (:func:`statistics_backend`)."""
    b, h, q_total, _ = query.shape
    k_len = key.shape[-2]
    key = observer.transform_key(key, module)
    compute = torch.promote_types(query.dtype, torch.float32)
    causal = mask is None and causal_when_unmasked(module, kwargs.get("is_causal")) and q_total > 1
    target = observer.target
    if target is not None and target.shape[0] != b:
        target = None
    keyless = scorer.keyless_logit(torch.zeros(1, h, 1, 1, dtype=compute, device=query.device))
    if keyless is not None:
        keyless = keyless.to(compute).expand(1, h, 1, 1).reshape(1, h, 1)

    def probe(x: torch.Tensor, cols: slice) -> torch.Tensor:
        return observer.transform_block(x, module, cols)

    call = StatisticsCall(
        scaling=float(scaling), mask=mask, causal=causal,
        window=kwargs.get("sliding_window") if causal else None,
        softcap=kwargs.get("softcap"), position_bias=kwargs.get("position_bias"),
        # every level of a probe on the logits takes the same path, the reference level included
        probe=probe if observer.changes_logits(module) else None,
        transform=None if type(scorer).transformed_logits is Softmax.transformed_logits
        else scorer.transformed_logits,
        # SSA's transform as data too, for the kernels that compute it themselves (Triton on CUDA)
        ssa=(scorer.b, scorer.n) if type(scorer).transformed_logits is SSA.transformed_logits else None,
        sink=sink, keyless=keyless, target=target, top_k=int(observer.top_k), positions=observer.positions,
    )  # fmt: skip
    out, stats = softmax_statistics(
        query,
        key,
        value,
        call,
        block_rows=max(1, int(observer.block_size)),
        block_keys=STATS_BLOCK_KEYS,
        backend=backend,
    )
    observer.record_rows(module, stats, torch.arange(k_len - q_total, k_len, device=query.device))
    return out.transpose(1, 2).contiguous(), None


__all__ = ["STATS_MODES", "online_observed_attention", "online_reason", "statistics_backend"]
