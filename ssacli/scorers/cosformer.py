"""cosFormer (Qin et al. 2022) in its quadratic form, so its weights can be measured like any other.

s_ij = relu(q_i)·relu(k_j)·cos(π/2·(i − j)/M), M = max(L_q, L_k); A_ij = s_ij / max(Σ_j s_ij, 1e-6).
It works on queries, keys and token positions, not on logits, so it is the one scorer that reads
:class:`AttentionInputs`. Positions default to the bottom-right alignment of a KV cache: the last
query sits at the last key.
"""

from __future__ import annotations

import math

import torch

from .base import AttentionInputs, Scorer
from .registration import register_scorer

# The paper's ε: a row whose features are all zero gets zero weights instead of 0/0.
ROW_SUM_FLOOR = 1e-6


@register_scorer
class CosFormer(Scorer, declared="cosformer"):
    def score(self, x, visible, inputs: AttentionInputs):
        if inputs.query is None or inputs.key is None:
            raise ValueError("scorer 'cosformer' needs query= and key= tensors, not logits alone")
        # Zero the features of queries that see nothing and keys nobody sees (padding), so their
        # content cannot reach other rows even through 0·NaN in the matmul's backward.
        q = torch.where(visible.any(dim=-1, keepdim=True), torch.relu(inputs.query.to(x.dtype)), 0.0)
        k = torch.where(visible.any(dim=-2).unsqueeze(-1), torch.relu(inputs.key.to(x.dtype)), 0.0)
        q_len, k_len = q.shape[-2], k.shape[-2]
        q_pos = inputs.query_positions
        k_pos = inputs.key_positions
        if q_pos is None:
            q_pos = torch.arange(k_len - q_len, k_len, device=x.device)
        if k_pos is None:
            k_pos = torch.arange(k_len, device=x.device)
        q_pos, k_pos = q_pos.to(x.dtype), k_pos.to(x.dtype)
        big_m = max(q_len, k_len)
        distance = q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)  # [.., q, k]
        if distance.dim() == 3:  # per-batch positions [b, q, k] -> broadcast over heads
            distance = distance.unsqueeze(1)
        s = (q @ k.transpose(-1, -2)) * torch.cos(math.pi / 2 * distance / big_m)
        s = torch.where(visible, s, 0.0)
        return s / s.sum(dim=-1, keepdim=True).clamp_min(ROW_SUM_FLOOR)
