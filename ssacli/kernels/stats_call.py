"""What one call of diagnose's fused statistics computes over, as data: :class:`StatisticsCall`, and
:class:`CallBlocks`, the call over its queries and keys cut into blocks of rows × key columns.

The logits are formed here exactly as ssacli.attention.forward's eager attention forms them — the
same matmul layout and scaling (bit-identical per block, bf16 too), the softcap, the position bias,
the probe, a float mask's bias — so the statistics are those of the eager weights. The only functions
a call carries are the two that are math of their own: the probe's change to the logits and the
scorer's transform; this module knows no model, scorer or probe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .positions import PositionBins, visible_per_bin
from .visibility import band


@dataclass(frozen=True)
class StatisticsCall:
    """One attention call's statistics, besides its query, key and value: which keys each query sees,
    how its logits x are formed, the transform to t, the denominator's keyless terms and what to track."""

    scaling: float  # x = (query·keyᵀ)·scaling
    # The call's mask [b|1, h|1, q|1, ≥ k]: bool (True: visible), or float additive (an entry below half
    # the dtype's minimum hides its key; the others are a bias added after the probe). None: ``causal``
    # and ``window`` say what each query sees (neither: every key).
    mask: torch.Tensor | None = None
    causal: bool = False  # query i sees keys up to K − Q + i (bottom-right aligned)
    window: int | None = None  # with causal: only the last ``window`` of those keys
    softcap: float | None = None  # x = tanh(x / softcap)·softcap (Gemma 2), before the bias
    position_bias: torch.Tensor | None = None  # [b|1, h, q|1, k] added after the softcap (T5)
    probe: Callable[[torch.Tensor, slice], torch.Tensor] | None = None  # (x, key columns) -> probed x
    # (x with hidden keys 0, each row's key count [.., rows, 1]) -> t; None: t = x. The count includes
    # the learned sink's column, which the transform sees as a key.
    transform: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # SSA's (b, n), each [h] or [1], where ``transform`` is SSA's t = n·sgn(x)·log1p(b|x|): the Triton
    # kernel computes that transform itself from them (it cannot call ``transform``). None: not SSA.
    ssa: tuple[torch.Tensor, torch.Tensor] | None = None
    sink: torch.Tensor | None = None  # the learned sink's logits, broadcastable to [b, h, q, 1]
    keyless: torch.Tensor | None = None  # t of a scorer's keyless term (sink scorer, softmax1) [1, h, 1]
    target: torch.Tensor | None = None  # [b] a key index per sample: t and x there are tracked
    top_k: int = 5  # the running top-k of t
    positions: PositionBins | None = None  # the position terms' bins (ssacli.kernels.positions); None: none

    @property
    def plain(self) -> bool:
        """Softmax of x itself over a causal band or every key: the one-loop native kernel's case."""
        parts = (self.mask, self.softcap, self.position_bias, self.probe, self.transform)
        return all(part is None for part in (*parts, self.sink, self.keyless))


def triton_lacks(call: StatisticsCall, query: torch.Tensor) -> str | None:
    """What of ``call`` the Triton statistics kernel (ssacli.kernels.triton_stats) does not compute,
    or None where it computes the whole call: it forms x = scaling·q·kᵀ, takes t = x or SSA's
    transform (:attr:`StatisticsCall.ssa`), and sees a causal band, a window and a boolean mask (a
    float mask whose visible entries are all 0 is one; this reads the mask once)."""
    parts = {"a softcap": call.softcap, "a position bias": call.position_bias, "a probe on the logits":
             call.probe, "a learned sink": call.sink, "a keyless term": call.keyless}  # fmt: skip
    for what, part in parts.items():
        if part is not None:
            return what
    if call.transform is not None and call.ssa is None:
        return "a transform other than SSA's"
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"{query.dtype} inputs"
    mask = call.mask
    if mask is not None and mask.dtype != torch.bool:
        hidden = mask <= torch.finfo(mask.dtype).min / 2
        if bool(torch.where(hidden, 0, mask).any()):
            return "a float mask that adds a bias"
    return None


class CallBlocks:
    """A :class:`StatisticsCall` over query [b, h, q, d] and key [b, h, k, d] (K/V heads repeated):
    the keys each row sees, the key ranges worth forming, and each block's logits and t."""

    def __init__(self, call: StatisticsCall, query: torch.Tensor, key: torch.Tensor, compute: torch.dtype):
        self.call, self.query, self.key = call, query, key
        self.q_len, self.k_len = query.shape[-2], key.shape[-2]
        self.offset = self.k_len - self.q_len  # query i sits at key offset + i
        dev = query.device
        self.mask = self.bias = None
        if call.mask is not None:
            mask = call.mask[..., : self.k_len]
            if mask.dtype != torch.bool:  # a float additive mask: its fill is hidden, the rest a bias
                self.bias = mask
                mask = mask > torch.finfo(mask.dtype).min / 2
            self.mask = mask
            count = mask.sum(-1)  # [b|1, h|1, q|1]
            if count.shape[-1] != self.q_len:
                count = count.expand(*count.shape[:-1], self.q_len)
        elif call.causal:
            positions = torch.arange(self.offset, self.k_len, device=dev)
            widest = self.k_len if call.window is None else call.window
            count = (positions + 1).clamp_max(widest).reshape(1, 1, -1)
        else:
            count = torch.full((1, 1, self.q_len), self.k_len, device=dev)
        self.count = count  # [b|1, h|1, q] visible keys per row
        # what the transform counts: the keys, plus the learned sink's column where there is one
        self.transform_count = (count + (0 if call.sink is None else 1)).to(compute).unsqueeze(-1)

    def positions(self) -> torch.Tensor:
        """Each query row's key position [q]: bottom-right aligned (query i at key K − Q + i)."""
        return torch.arange(self.offset, self.k_len, device=self.query.device)

    def key_visible(self) -> torch.Tensor | None:
        """The keys each row sees per key bin [b|1, h|1, q, B] (None: no position terms asked)."""
        call = self.call
        if call.positions is None:
            return None
        return visible_per_bin(call.positions, self.k_len, self.positions(), mask=self.mask,
                               causal=call.causal, window=call.window)  # fmt: skip

    def rows_of(self, t: torch.Tensor, rows: slice) -> torch.Tensor:
        return t[..., rows, :] if t.shape[-2] == self.q_len else t

    def key_span(self, rows: slice) -> list[int]:
        """The sorted edges [lo, …, hi] of the keys the rows can see at all; blocks outside are never
        formed, and no block straddles an edge, so the part every row sees whole needs no mask."""
        call = self.call
        if self.mask is not None or not call.causal:
            return [0, self.k_len]
        first, last = self.offset + rows.start, self.offset + rows.stop - 1
        hi = min(self.k_len, last + 1)
        lo = 0 if call.window is None else max(0, first - call.window + 1)
        # Keys every row sees (no mask needed): from the last row's window start to the first row.
        whole_lo = lo if call.window is None else max(lo, last - call.window + 1)
        whole_hi = min(hi, first + 1)
        inner = [e for e in (whole_lo, whole_hi) if lo < e < hi] if whole_lo < whole_hi else []
        return [lo, *inner, hi]

    def visible(self, rows: slice, cols: slice) -> torch.Tensor | None:
        """Bool broadcastable to the block [b, h, rows, cols]: the keys each row sees; None: all."""
        call = self.call
        if self.mask is not None:
            return self.rows_of(self.mask, rows)[..., cols]
        if not call.causal:
            return None
        first, last = self.offset + rows.start, self.offset + rows.stop - 1
        if cols.stop - 1 <= first and (call.window is None or last - cols.start < call.window):
            return None  # every row of the block sees every key of it
        dev = self.query.device
        queries = torch.arange(rows.start, rows.stop, device=dev).unsqueeze(1)
        keys = torch.arange(cols.start, cols.stop, device=dev).unsqueeze(0)
        return band(queries, keys, self.offset, window=call.window)[None, None]

    def logits(self, rows: slice, cols: slice) -> torch.Tensor:
        """The block's logits x as the scorer sees them (a new tensor, the caller's to overwrite)."""
        call = self.call
        # key[:, :, cols].transpose: the eager path's matmul layout, bit-identical per block (bf16 too);
        # the scaling in place (the same rounding as the eager `* scaling`, without a second block)
        x = torch.matmul(self.query[:, :, rows], self.key[:, :, cols].transpose(-1, -2)).mul_(call.scaling)
        if call.softcap is not None:
            x = torch.tanh(x / call.softcap) * call.softcap
        if call.position_bias is not None:
            x = x + self.rows_of(call.position_bias, rows)[..., cols]
        if call.probe is not None:
            x = call.probe(x, cols)
        if self.bias is not None:
            part = self.rows_of(self.bias, rows)[..., cols]
            x = x + torch.where(self.rows_of(self.mask, rows)[..., cols], part, 0).to(x.dtype)
        return x

    def transformed(self, raw: torch.Tensor, vis: torch.Tensor | None, rows: slice) -> torch.Tensor:
        """t of the block's logits ``raw`` (hidden entries are 0 here, −inf only after)."""
        x = raw if vis is None else torch.where(vis, raw, 0.0)
        if self.call.transform is None:
            return x
        return self.call.transform(x, self.rows_of(self.transform_count, rows))

    def keyless_terms(self, b: int, h: int, compute: torch.dtype):
        """(t of the learned sink [b, h, q] or None, t of every keyless term log-summed or None)."""
        call = self.call
        sink_t = extra = None
        if call.sink is not None:
            column = call.sink.to(compute).expand(b, h, self.q_len, 1)
            if call.transform is not None:
                column = call.transform(column, self.transform_count)
            sink_t = extra = column.squeeze(-1)
        if call.keyless is not None:
            extra = call.keyless if extra is None else torch.logaddexp(extra, call.keyless)
        return sink_t, extra


__all__ = ["CallBlocks", "StatisticsCall", "triton_lacks"]
