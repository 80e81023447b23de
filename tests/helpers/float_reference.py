"""Float64 references for the native kernels, with error bounds that hold for any float32 BLAS.

The native one-loop kernels form each logit tile with an sgemm. How an sgemm sums a dot product (its
blocking, FMA or not, AVX-512 or AVX2 tiles) differs between CPUs and BLAS builds, so its logits are
not bit-equal to torch.matmul's everywhere (an AMD EPYC with AVX2 only differed by 3e-6 relative
where an Intel Xeon with AVX-512 agreed bit for bit). These tests therefore compare every kernel
with a float64 computation from the same float32 inputs and bound the difference by what float32
rounding can do in *any* summation order:

* each logit x = s·(q·k) carries at most γ_{d+1}·s·(|q|·|k|) (Higham, *Accuracy and Stability of
  Numerical Algorithms*, §3.1, with γ_n = n·u / (1 − n·u) and u = 2⁻²⁴; FMA only tightens it);
* a row whose logits all move by at most B has weights that move by a factor within e^(±2B), so its
  maximum, top-k and single logits move by at most B, its total Σe^(x − m) by a factor e^(±2B), its
  spread and output accordingly (:func:`plain_softmax_reference` writes each bound out);
* the kernel's own float32 arithmetic after the logits (e^x, sums over the row's keys, p·v) adds a
  relative ``(keys + 8)·4u`` on the quantities it accumulates.

Nothing here imports ssacli.
"""

from __future__ import annotations

import math

import torch

U32 = 2.0**-24  # float32 unit roundoff


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def logit_statistics(
    x: torch.Tensor,
    shown: torch.Tensor,
    v64: torch.Tensor,
    target: torch.Tensor | None,
    top_k: int,
    t: torch.Tensor | None = None,
    bins: tuple[int, int] | None = None,
) -> dict[str, torch.Tensor]:
    """Diagnose's row statistics, float64, from the logits x [b, h, q, k] themselves (float64): the
    fields of ssacli.kernels.row_stats.RowStatistics plus ``out``, for the transformed logits ``t``
    (None: t = x), ``shown`` [.., q, k] the visible keys (broadcast), ``v64`` [b, h, k, d] (grouped heads
    repeated), ``target`` [b] one key per sample. ``bins`` (sink_k, bin_width): the position terms too
    (key bin 0 is the first sink_k keys, then bins of bin_width; distance bins by bit length of
    |pos − j| with query i at key K − Q + i), written out here from those definitions."""
    t = x if t is None else t
    shown = shown.expand_as(x)
    ts = t.masked_fill(~shown, -math.inf)
    m = ts.amax(-1)
    ref = m.where(torch.isfinite(m), 0.0)[..., None]
    p = torch.exp(ts - ref)
    total = p.sum(-1)
    w = p / total.clamp_min(1e-300)[..., None]
    width = min(top_k, x.shape[-1])
    values = {
        "out": w @ v64,
        "max": m,
        "total": total,
        "spread": (p * (ref - ts).where(shown, 0.0)).sum(-1),
        "top": ts.topk(width, dim=-1).values,
        "first": ts[..., 0],
        "logit_sq": x.where(shown, 0.0).square().sum(-1),
        "logit_n": shown.sum(-1).double(),
    }
    if target is not None:
        pick = target.view(-1, 1, 1, 1).expand(*ts.shape[:-1], 1)
        values["target"] = ts.gather(-1, pick)[..., 0]
        values["target_logit"] = x.where(shown, math.nan).gather(-1, pick)[..., 0]
    if bins is not None:
        sink_k, bin_width = bins
        q_len, k_len = x.shape[-2:]
        pos = [k_len - q_len + i for i in range(q_len)]
        dev = x.device
        key_bin = torch.tensor([0 if j < sink_k else 1 + (j - sink_k) // bin_width for j in range(k_len)])
        gaps = [[abs(i - j) for j in range(k_len)] for i in pos]
        dist = torch.tensor(gaps, dtype=torch.float64, device=dev)
        dist_bin = torch.tensor([[gap.bit_length() for gap in row] for row in gaps], device=dev)
        values["key_mass"] = torch.stack(
            [p[..., (key_bin == b).to(dev)].sum(-1) for b in range(int(key_bin.max()) + 1)], -1
        )
        values["distance_mass"] = torch.stack(
            [(p * (dist_bin == b)).sum(-1) for b in range(max(1, k_len - 1).bit_length() + 1)], -1
        )
        values["distance_sum"] = (p * dist).sum(-1)
    return values


def plain_softmax_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scaling: float,
    shown: torch.Tensor,
    target: torch.Tensor | None,
    top_k: int,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(values, bounds) of diagnose's plain-softmax row statistics, float64, for query [b, h, q, d] and
    key/value [b, h_kv, k, d] (grouped heads repeated here), ``shown`` [q, k] the visible keys and
    ``target`` [b] one key per sample. ``values`` names the fields of
    ssacli.kernels.row_stats.RowStatistics plus ``out`` (:func:`logit_statistics`); ``bounds`` the
    largest difference a float32 implementation may show for each, elementwise."""
    heads = q.shape[1]
    q64 = q.double()
    k64, v64 = (t.double().repeat_interleave(heads // t.shape[1], 1) for t in (k, v))
    x = q64 @ k64.transpose(-1, -2) * scaling
    values = logit_statistics(x, shown, v64, target, top_k)
    logit_err = gamma(q.shape[-1] + 1) * (q64.abs() @ k64.abs().transpose(-1, -2)) * abs(scaling)
    logit_err = logit_err.where(shown, 0.0)
    row_err = logit_err.amax(-1)  # B: the most any visible logit of the row can have moved
    grow = torch.expm1(2 * row_err)  # weights move by a factor within e^(±2B)
    total, spread = values["total"], values["spread"]
    m = values["max"]
    w = torch.exp(x.masked_fill(~shown, -math.inf) - m.where(torch.isfinite(m), 0.0)[..., None])
    w = w / total.clamp_min(1e-300)[..., None]  # the weights: out's bound reads w @ |v|
    keys = shown.sum(-1).double()  # [q]
    arithmetic = (keys + 8) * 4 * U32  # the kernel's own float32 e^x, sums and p·v after the logits
    width = values["top"].shape[-1]
    bounds = {
        "out": (grow[..., None] + arithmetic[:, None]) * (w @ v64.abs()) + 1e-12,
        "max": row_err,
        "total": (grow + arithmetic) * total,
        "spread": (grow + arithmetic) * (spread + 2 * row_err * total) + 2 * row_err * total,
        "top": row_err[..., None].expand(*row_err.shape, width),
        "first": logit_err[..., 0],
        "logit_sq": (2 * x.abs() * logit_err + logit_err.square()).sum(-1) + arithmetic * values["logit_sq"],
        "logit_n": torch.zeros_like(row_err),
    }
    if target is not None:
        pick = target.view(-1, 1, 1, 1).expand(*x.shape[:-1], 1)
        bounds["target"] = bounds["target_logit"] = logit_err.gather(-1, pick)[..., 0]
    return values, bounds


def excess(have: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> float:
    """How far ``have`` lies outside want ± bound, at worst (≤ 0 inside): equal infinities and NaNs
    count as inside, a NaN or infinity on one side only as outside (inf)."""
    have, want = have.double(), want.double()
    same = (have == want) | (have.isnan() & want.isnan())
    gap = torch.where(same, 0.0, (have - want).abs() - bound.expand_as(want))
    gap = torch.where(gap.isnan(), math.inf, gap)
    return gap.max().item() if gap.numel() else 0.0
