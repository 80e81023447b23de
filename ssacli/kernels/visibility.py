"""Which keys each query sees under a causal band, bottom-right aligned: written once, here, for every
torch path (the attention layer's masks, SDPA's mask where q_len < k_len, flex's mask_mod, the blocked
kernels' and the statistics' blocks). The C and Triton kernels apply the same rule in their loops.

Query i of Q sits at key position K − Q + i (as with a key/value cache, where the last query is the
last key); causally it sees keys j ≤ K − Q + i, and with a window only those with K − Q + i − j < window
(transformers' convention).
"""

from __future__ import annotations

import torch


def band(query_index, key_index, offset: int, causal: bool = True, window: int | None = None):
    """Whether each query sees each key, elementwise over broadcast ``query_index`` and ``key_index``
    (tensors, or flex's index scalars): the query at row i sits at key position ``offset`` + i."""
    position = query_index + offset
    keep = key_index <= position if causal else key_index >= 0
    if window is not None:
        keep = keep & (position - key_index < window)
    return keep


def causal_visibility(
    q_len: int,
    k_len: int,
    device,
    *,
    rows: slice = slice(None),
    window: int | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """[rows, k] bool: the keys each of the query rows ``rows`` (of ``q_len``) sees among ``k_len``."""
    queries = torch.arange(q_len, device=device)[rows].unsqueeze(1)
    return band(queries, torch.arange(k_len, device=device).unsqueeze(0), k_len - q_len, causal, window)


__all__ = ["band", "causal_visibility"]
