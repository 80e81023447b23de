"""Which keys each query sees.

:func:`ssacli_mask` is the mask function ssacli registers with transformers (a boolean mask, True =
visible); :func:`packed_visibility` and ssacli.kernels.visibility's causal band build the visibility
of a call that passed packed sequences or no mask, and :func:`visibility` joins them with the mask the
model passed (the eager attention of :mod:`.forward` calls it).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import eager_mask, sdpa_mask

from ..errors import UnsupportedModelError
from ..kernels.visibility import causal_visibility

# Families whose own code reads or edits the attention mask outside the attention function assuming
# eager's float convention (0 = visible, a large negative number = hidden). ssacli hands them that
# float mask (the eager scorer path reads it exactly; the fused kernels need a boolean one), and the
# all-family audit (tests/contracts/test_families.py) fails for them with the boolean mask.
EAGER_MASK_FAMILIES: dict[str, str] = {
    "nllb-moe": "its router reads the padding from the mask as additive (0 = visible)",
    "deepseek_v4": "it extends the mask for compressed keys by padding with 0.0 (visible in eager)",
    "bigbird_pegasus": "its decoder attention modules say is_causal=False; only a materialized mask "
    "keeps them causal",
}


def ssacli_mask(*args, **kwargs) -> torch.Tensor | None:
    """transformers' boolean sdpa mask (True = visible).

    A plain causal mask (no padding, no window, q_len == k_len or 1) comes back as None, as for
    sdpa: the attention function then knows it is causal from the module, and neither the fused
    kernel nor the eager scorer needs an [L, L] tensor for it. Every other mask (padding, sliding
    windows, cache offsets, bidirectional) is materialized, so the scorer sees it exactly. Families
    in :data:`EAGER_MASK_FAMILIES` get transformers' eager float mask instead.
    """
    if getattr(kwargs.get("config"), "model_type", None) in EAGER_MASK_FAMILIES:
        return eager_mask(*args, **kwargs)
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def packed_visibility(kwargs: dict, q_len: int, k_len: int, device) -> torch.Tensor | None:
    """[q, k] True where query and key belong to the same packed sequence (cu_seq_lens_*), or None."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_k is None:
        return None
    cu_q = cu_k if cu_q is None else cu_q
    cu_k = cu_q if cu_k is None else cu_k
    if int(cu_q[-1]) != q_len or int(cu_k[-1]) != k_len:
        raise UnsupportedModelError(
            f"cu_seq_lens_q/k end at {int(cu_q[-1])}/{int(cu_k[-1])} but this call has {q_len} queries and "
            f"{k_len} keys: packed sequences must be one row (batch of one) without a cache"
        )
    seq_q = torch.bucketize(torch.arange(q_len, device=device), cu_q[1:].to(device), right=True)
    seq_k = torch.bucketize(torch.arange(k_len, device=device), cu_k[1:].to(device), right=True)
    return seq_q[:, None] == seq_k[None, :]


def causal_when_unmasked(module: nn.Module, is_causal: bool | None) -> bool:
    """Causality when the model passed no mask: its ``is_causal`` argument, else the module's."""
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))


def visibility(
    logits: torch.Tensor,
    mask: torch.Tensor | None,
    module: nn.Module,
    kwargs: dict,
    rows: slice = slice(None),
    q_total: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, visible): the boolean visibility (True = visible) the scorer gets, from whatever mask
    the model passed, and the logits with any real bias of a float mask added.

    * no mask: causal (bottom-right aligned, ``sliding_window`` applied) if the call's ``is_causal``
      or else the module's ``is_causal`` says so, otherwise None (everything visible);
    * a bool mask: used as it is; a float additive mask: its large negative fill is "hidden" and
      any other value is a bias added to the logits;
    * ``cu_seq_lens_q``/``cu_seq_lens_k`` (packed sequences): keys of another sequence are hidden.

    ``rows`` selects a block of query rows out of ``q_total`` (the observed, blocked path).
    """
    k_len = logits.shape[-1]
    q_total = logits.shape[-2] if q_total is None else q_total
    if mask is None:
        visible = None
        if causal_when_unmasked(module, kwargs.get("is_causal")) and q_total > 1:
            # Bottom-right aligned: with a KV cache the last query sits at the last key. [1, 1, q, k]
            # like the masks transformers builds, so observers can read it the same way.
            window = kwargs.get("sliding_window")
            visible = causal_visibility(q_total, k_len, logits.device, rows=rows, window=window)[None, None]
    else:
        if mask.dim() == 4:
            mask = mask[..., :k_len]
            if mask.shape[-2] == q_total:
                mask = mask[..., rows, :]
        if mask.dtype == torch.bool:
            visible = mask
        else:
            # A float additive mask (a user's custom 4D mask): keep any real bias it carries, and read
            # the large negative fill as "masked".
            visible = mask > torch.finfo(mask.dtype).min / 2
            logits = logits + torch.where(visible, mask, 0).to(logits.dtype)
    packed = packed_visibility(kwargs, q_total, k_len, logits.device)
    if packed is not None:
        packed = packed[rows][None, None]
        visible = packed if visible is None else visible & packed
    return logits, visible
