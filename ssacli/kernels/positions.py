"""Where each row's attention lands, as row statistics: :class:`PositionBins`, the bins, and the
torch forms of the three running terms every producer of
:class:`~ssacli.kernels.row_stats.RowStatistics` adds for them (the native kernels compute the same
terms in C, native_positions.h).

Per query row i at key position pos_i, with e^(t_j − m) the row's unnormalized weights (as ``total``):

* key mass [.., B]: Σ e^(t_j − m) over the keys j in each key-position bin. Bin 0 is the first
  ``sink_k`` keys, bin b ≥ 1 the ``bin_width`` keys from sink_k + (b − 1)·bin_width: the sink share,
  the attention received by position and the secondary sinks all come from it;
* distance mass [.., D]: Σ e^(t_j − m) over the keys at distance d = |pos_i − j| in each distance bin:
  bin 0 is d = 0 (the query's own key), bin b ≥ 1 is 2^(b−1) ≤ d < 2^b (1, 2–3, 4–7, …), so d = 1,
  the previous token, has a bin of its own;
* distance sum: Σ e^(t_j − m)·|pos_i − j|, for the mean attention distance.

Each is a sum over a row's keys like ``total``, rescaled by e^(m_old − m_new) when the running max
grows, so the fused passes keep one vector of bins per row, never a [rows, keys] map. Which keys each
row sees per key bin (:func:`visible_per_bin`) comes from the call's geometry, for the uniform
reference of the sink boost and the received profile. Positions are key indices of the call (query i
of q sits at key K − q + i): with left padding they are shifted by the padding, distances are not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PositionBins:
    """The geometry of the key-position and distance bins (the same for every call of a run, so
    their sums add up; a longer call only has more bins)."""

    sink_k: int  # the first k keys: key bin 0
    bin_width: int  # keys per key bin after the first k

    def __post_init__(self):
        if self.sink_k < 1 or self.bin_width < 1:
            raise ValueError(f"sink_k and bin_width must be >= 1 (got {self.sink_k}, {self.bin_width})")

    def key_bins(self, keys: int) -> int:
        """Key bins of a call with ``keys`` keys: the first k, then ceil((keys − k) / width)."""
        return 1 + max(0, -(-(keys - self.sink_k) // self.bin_width))

    @staticmethod
    def distance_bins(keys: int) -> int:
        """Distance bins of a call with ``keys`` keys (distances 0 … keys − 1)."""
        return max(1, keys - 1).bit_length() + 1

    def key_bin_of(self, key: torch.Tensor) -> torch.Tensor:
        """The key bin of each key index (int64)."""
        after = torch.div(key - self.sink_k, self.bin_width, rounding_mode="floor")
        return torch.where(key < self.sink_k, 0, 1 + after)

    def key_edges(self, keys: int) -> list[int]:
        """The first key of each key bin, and the end: [0, k, k + width, …, keys]."""
        edges = [0, min(self.sink_k, keys)]
        while edges[-1] < keys:
            edges.append(min(keys, edges[-1] + self.bin_width))
        return edges[: self.key_bins(keys) + 1]

    @staticmethod
    def distance_edges(keys: int) -> list[int]:
        """The first distance of each distance bin, and the end: [0, 1, 2, 4, …, keys]."""
        count = PositionBins.distance_bins(keys)
        return [0, *(2 ** (b - 1) for b in range(1, count)), max(keys, 2 ** (count - 2) + 1)]


def distance_bin_of(distance: torch.Tensor) -> torch.Tensor:
    """The distance bin of each distance ≥ 0 (int64): its bit length (0 → 0, 1 → 1, 2–3 → 2, …),
    exact through frexp for distances below 2^53."""
    return torch.frexp(distance.double()).exponent.long()


def _distances(query_positions: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    return (query_positions.reshape(-1, 1) - keys.reshape(1, -1)).abs()  # [q, c]


def block_terms(
    p: torch.Tensor, bins: PositionBins, query_positions: torch.Tensor, first_key: int, keys: int
):
    """The three terms of one block of weights p [b, h, r, c] (e^(t − ref), 0 at hidden keys) whose
    rows sit at ``query_positions`` [r] and columns at keys first_key …: (key mass [b, h, r, B],
    distance mass [b, h, r, D], distance sum [b, h, r]) for a call of ``keys`` keys, float64, summed
    in p's precision (the block precision of the fused pass, the weights' own on the eager path)."""
    b, h, r, c = p.shape
    dev = p.device
    columns = torch.arange(first_key, first_key + c, device=dev)
    key_mass = p.new_zeros(b, h, r, bins.key_bins(keys)).index_add_(-1, bins.key_bin_of(columns), p)
    distance = _distances(query_positions.to(dev), columns)  # [r, c]
    where = distance_bin_of(distance).expand(b, h, r, c)
    distance_mass = p.new_zeros(b, h, r, bins.distance_bins(keys)).scatter_add_(-1, where, p)
    distance_sum = (p * distance.to(p.dtype)).sum(-1)
    return key_mass.double(), distance_mass.double(), distance_sum.double()


def visible_per_bin(
    bins: PositionBins,
    keys: int,
    query_positions: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
) -> torch.Tensor:
    """How many keys each row sees in each key bin, float64: [b|1, h|1, q, B] from a bool ``mask``
    [b|1, h|1, q|1, ≥ keys] (True: visible), else [1, 1, q, B] from the causal band (``window``: the
    last ``window`` keys up to the row's own) or every key."""
    edges = bins.key_edges(keys)
    q = query_positions.numel()
    if mask is not None:
        mask = mask[..., :keys]
        parts = [
            mask[..., a:z].sum(-1, dtype=torch.float64) for a, z in zip(edges[:-1], edges[1:], strict=True)
        ]
        counts = torch.stack(parts, -1)
        return counts.expand(*counts.shape[:-2], q, counts.shape[-1]) if counts.shape[-2] == 1 else counts
    dev = query_positions.device
    lo_edge = torch.tensor(edges[:-1], dtype=torch.float64, device=dev)
    hi_edge = torch.tensor(edges[1:], dtype=torch.float64, device=dev)
    pos = query_positions.to(dev).double().reshape(-1, 1)
    if not causal:
        return (hi_edge - lo_edge).expand(q, -1).reshape(1, 1, q, -1).clone()
    first = torch.zeros_like(pos) if window is None else (pos - window + 1).clamp_min(0)
    seen = torch.minimum(hi_edge, pos + 1) - torch.maximum(lo_edge, first)
    return seen.clamp_min(0).reshape(1, 1, q, -1)


__all__ = ["PositionBins", "block_terms", "distance_bin_of", "visible_per_bin"]
