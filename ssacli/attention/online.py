"""Diagnose's fused statistics: an observed attention call reduced to per-row statistics in one
blocked pass (ssacli.kernels.online_stats), never forming a [rows, keys] weight tile.

It serves scorers that are a softmax of a transformed logit (:meth:`Scorer.transformed_logits`:
softmax, temperature, SSA, SSMax, sink, softmax1) and computes every block's logits exactly as
:func:`~ssacli.attention.forward.observed_attention` does (the same matmul layout, scaling, softcap,
position bias, float-mask bias and probe), so its statistics are those of the eager weights. An
observer (:class:`~ssacli.attention.forward.Observer`) takes this path when its ``stats_mode`` is
"auto" or "fused"; :func:`online_reason` says why a call cannot (the observer then
gets the eager path under "auto", a UsageError under "fused").
"""

from __future__ import annotations

import torch

from ..kernels.online_stats import (
    FLASH_BLOCK_ROWS,
    STATS_BLOCK_KEYS,
    plain_softmax_available,
    plain_softmax_statistics,
    softmax_statistics,
)
from ..scorers import Scorer
from ..scorers.softmax_family import Softmax
from .masks import causal_when_unmasked

STATS_MODES = ("auto", "eager", "fused")


def online_reason(scorer: Scorer, mask: torch.Tensor | None, kwargs: dict) -> str | None:
    """Why this call's statistics need the eager weights, or None if the fused pass computes them."""
    if scorer.uses_qk or type(scorer).transformed_logits is Scorer.transformed_logits:
        return f"scorer '{scorer.name}' is not a softmax of a transformed logit"
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return "packed sequences (cu_seq_lens_*) are separated in the eager mask"
    if mask is not None and mask.dim() != 4:
        return f"the model passed a {mask.dim()}-d attention mask"
    return None


def online_observed_attention(module, scorer, observer, query, key, value, mask, scaling, sink, kwargs):
    """:func:`~ssacli.attention.forward.observed_attention`'s output, with the call's statistics
    handed to ``observer.record_rows`` instead of its weights to ``observer.record``. key/value are
    already repeated for GQA; ``sink``: the learned sink logits or None."""
    b, h, q_total, _ = query.shape
    k_len = key.shape[-2]
    key = observer.transform_key(key, module)
    positions = torch.arange(k_len - q_total, k_len, device=query.device)
    compute = torch.promote_types(query.dtype, torch.float32)
    softcap, bias = kwargs.get("softcap"), kwargs.get("position_bias")
    hidden_bias = None
    if mask is not None:
        mask = mask[..., :k_len]
        if mask.dtype != torch.bool:  # a float additive mask: its fill is hidden, the rest a bias
            hidden_bias = mask
            mask = mask > torch.finfo(mask.dtype).min / 2
        count = mask.sum(-1)  # [b|1, h|1, q|1]
        if count.shape[-1] != q_total:
            count = count.expand(*count.shape[:-1], q_total)
    causal = mask is None and causal_when_unmasked(module, kwargs.get("is_causal")) and q_total > 1
    window = kwargs.get("sliding_window") if causal else None
    if mask is None:
        count = torch.full((1, 1, q_total), k_len, device=query.device)
        if causal:
            count = (positions + 1).clamp_max(k_len if window is None else window).reshape(1, 1, -1)

    target = observer.target
    if target is not None and target.shape[0] != b:
        target = None
    plain = (
        mask is None and softcap is None and bias is None and sink is None
        and type(scorer).transformed_logits is Softmax.transformed_logits
        and not observer.changes_logits(module) and plain_softmax_available(query)
    )  # fmt: skip
    if plain:  # the commonest call, in one native loop: logits, statistics and p·v per cached tile
        out, stats = plain_softmax_statistics(
            query, key, value, float(scaling), causal=causal, window=window, count=count, target=target,
            top_k=int(observer.top_k), block_rows=min(max(1, int(observer.block_size)), FLASH_BLOCK_ROWS),
            block_keys=STATS_BLOCK_KEYS,
        )  # fmt: skip
        observer.record_rows(module, stats, positions, sink=None)
        return out.transpose(1, 2).contiguous(), None

    def rows_of(t: torch.Tensor, rows: slice) -> torch.Tensor:
        return t[..., rows, :] if t.shape[-2] == q_total else t

    def logits(rows: slice, cols: slice) -> torch.Tensor:
        # key[:, :, cols].transpose: the eager path's matmul layout, bit-identical per block (bf16 too);
        # the scaling in place (the same rounding as the eager `* scaling`, without a second block)
        x = torch.matmul(query[:, :, rows], key[:, :, cols].transpose(-1, -2)).mul_(scaling)
        if softcap is not None:
            x = torch.tanh(x / softcap) * softcap
        if bias is not None:
            x = x + rows_of(bias, rows)[..., cols]
        x = observer.transform_block(x, module, cols)
        if hidden_bias is not None:
            part = rows_of(hidden_bias, rows)[..., cols]
            x = x + torch.where(rows_of(mask, rows)[..., cols], part, 0).to(x.dtype)
        return x

    def visible(rows: slice, cols: slice) -> torch.Tensor | None:
        if mask is not None:
            return rows_of(mask, rows)[..., cols]
        if not causal:
            return None
        first, last = int(positions[rows.start]), int(positions[rows.stop - 1])
        if cols.stop - 1 <= first and (window is None or last - cols.start < window):
            return None  # every row of the block sees every key of it
        pos = positions[rows].unsqueeze(1)
        keys = torch.arange(cols.start, cols.stop, device=query.device).unsqueeze(0)
        shown = keys <= pos
        if window is not None:
            shown = shown & (pos - keys < window)
        return shown[None, None]

    def key_span(rows: slice) -> list[int]:
        if not causal:
            return [0, k_len]
        first, last = int(positions[rows.start]), int(positions[rows.stop - 1])
        hi = min(k_len, last + 1)
        lo = 0 if window is None else max(0, first - window + 1)
        # Keys every row sees (no mask needed): from the last row's window start to the first row.
        whole_lo = lo if window is None else max(lo, last - window + 1)
        whole_hi = min(hi, first + 1)
        inner = [e for e in (whole_lo, whole_hi) if lo < e < hi] if whole_lo < whole_hi else []
        return [lo, *inner, hi]

    # What the scorer counts: the keys, plus the learned sink's column where there is one.
    scorer_count = (count + (0 if sink is None else 1)).to(compute).unsqueeze(-1)

    def transform(x: torch.Tensor, rows: slice) -> torch.Tensor:
        return scorer.transformed_logits(x, rows_of(scorer_count, rows))

    probe = torch.zeros(1, h, 1, 1, dtype=compute, device=query.device)
    keyless = scorer.keyless_logit(probe)
    sink_t = extra = None
    if sink is not None:
        column = sink.to(compute).expand(b, h, q_total, 1)
        sink_t = scorer.transformed_logits(column, scorer_count).squeeze(-1)
        extra = sink_t
    if keyless is not None:
        keyless = keyless.to(compute).expand(1, h, 1, 1).reshape(1, h, 1)
        extra = keyless if extra is None else torch.logaddexp(extra, keyless)
    out, stats = softmax_statistics(
        value, q_total, logits=logits, visible=visible, transform=transform, count=count,
        key_span=key_span, extra=extra, target=target, top_k=int(observer.top_k),
        block_rows=max(1, int(observer.block_size)), block_keys=STATS_BLOCK_KEYS,
        overwrite_logits=True,  # logits() above builds every block anew
    )  # fmt: skip
    observer.record_rows(module, stats, positions, sink=sink_t)
    return out.transpose(1, 2).contiguous(), None


__all__ = ["STATS_MODES", "online_observed_attention", "online_reason"]
