"""Which keys each query sees.

:func:`ssacli_mask` is the mask function ssacli registers with transformers (a boolean mask, True =
visible); :func:`packed_visibility` and ssacli.kernels.visibility's causal band build the visibility
of a call that passed packed sequences or no mask (the attention function, :mod:`.forward`, joins them
with the mask the model passed in :func:`~ssacli.attention.forward.visibility`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import eager_mask, sdpa_mask

from ..errors import UnsupportedModelError

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
