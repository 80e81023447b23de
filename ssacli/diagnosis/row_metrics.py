"""The one derivation of diagnose's row metrics: :func:`row_sums` turns one attention call's
:class:`~ssacli.kernels.row_stats.RowStatistics` (from the fused pass, the native kernels or a block of
eager weights: every path produces them) into per-head sums of every metric of
:data:`~ssacli.diagnosis.metrics.METRICS`; :func:`logit_sums` does the same for the layer's logit scale.

Which rows count: valid queries only (padding queries are excluded), with at least two visible keys (a
row with one key has nothing to choose) and positive mass. Shape metrics read the row normalized over
its keys, p_j = e^(t_j − m) / l, so scorers whose rows do not sum to one (sigmoid, softpick; a learned
sink) are compared on the shape of their attention; ``row_mass`` reports the keys' share itself.

* entropy: H(p) / log N_i with H = log l + spread / l, N_i the row's visible keys (1 = uniform, 0 = one
  key); max_weight: max p = 1 / l; collapse_rate: share of rows with max p >= tau;
* effective_tokens: exp H; topk_mass: Σ e^(top − m) / l over the k largest (k capped by N_i);
* sink_mass: p at key 0; outlier_capture: p at the probe's target key, over the rows that see it (the
  target's own row excluded);
* row_mass: the keys' weight: under a softmax l·e^m over the denominator l·e^m + e^extra (a keyless
  term with logit e: learned sink, sink scorer), so a dominant keyless term cannot overflow it;
  otherwise l·e^(m − z);
* learned_sink: the weight of the learned sink key, over every real query row (a row that parks all
  its mass there included);
* where the statistics hold the position terms (ssacli.kernels.positions), over the same rows and the
  same p: sink_share, p on the first k keys, and its uniform counterpart (the share of those keys among
  the row's visible ones, N_k,i / N_i) whose ratio is sink_boost; local_share, p within
  ``local_distance`` of the query; attention_distance, Σ p·|i − j|; and per head the vectors
  ``received`` (Σ p per key bin), ``received_uniform`` (N_b,i / N_i per key bin) and
  ``distance_profile`` (Σ p per distance bin). Without the terms these sums are absent (not measured).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..defaults import LOCAL_DISTANCE, TAU, TOP_K
from ..kernels.row_stats import RowStatistics
from .metrics import METRICS, sink_indicator
from .positions import PositionProfiles, head_class


def _heads(x: torch.Tensor) -> torch.Tensor:
    return x.double().sum(dim=(0, 2))


def _denominator(stats: RowStatistics, seen: torch.Tensor):
    """(stabilizer s, the keys' part of the denominator, the denominator), all at e^s: a term with
    logit u weighs e^(u − s) / denominator. None where the keys are the whole softmax (mass 1)."""
    m, l_ = stats.max, stats.total
    if stats.log_normalizer is not None:  # weights e^(t − z): the denominator is e^z
        z = stats.log_normalizer
        keys = torch.where(seen, l_ * torch.exp(m - z), 0.0)
        return z, keys, torch.ones((), dtype=keys.dtype, device=keys.device)
    if stats.extra is None:
        return None
    top = torch.maximum(torch.where(seen, m, -torch.inf), stats.extra)
    keys = l_ * torch.exp(torch.where(seen, m - top, -torch.inf))
    return top, keys, keys + torch.exp(stats.extra - top)


@torch.no_grad()
def row_sums(
    stats: RowStatistics,
    *,
    query_valid: torch.Tensor | None = None,
    query_positions: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    tau: float = TAU,
    top_k: int = TOP_K,
    local_distance: int = LOCAL_DISTANCE,
    prompts: bool = False,
    prompt_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """Per-head sums of every row metric over the counted rows of one attention call.

    query_valid [b, q] bool (None = all valid); query_positions [q]: each row's key index (to exclude
    the target's own row; default: bottom-right aligned, q rows ending at the last key); target [b]:
    the key index whose captured mass ``outlier_capture`` measures (None = not measured). Returns
    float64 tensors [h]: ``<metric>`` sums, and the counts ``rows``, ``capture_rows`` and, where the
    statistics hold a learned sink, ``sink_rows``; with the position terms, the position sums
    (``received``, ``received_uniform``: [h, key bins]; ``distance_profile``: [h, distance bins]).
    With ``prompts``, also per prompt (:data:`PROMPT_SUMS`, ``[b, h, windows]``: one per sample, or with
    ``prompt_length`` each sample's rows cut into windows of that many query positions) the collapsed
    rows and the rows counted: what the prompt-to-prompt noise of a verdict is estimated from
    (ssacli.diagnosis.outputs)."""
    m, l_, spread = stats.max, stats.total, stats.spread
    b, h, q = m.shape
    n_visible = stats.visible.expand(b, h, q)
    seen = l_ > 0
    safe_l = torch.where(seen, l_, 1.0)
    ref = torch.where(seen, m, 0.0)
    parts = _denominator(stats, seen)
    mass = seen.double() if parts is None else parts[1] / parts[2]
    counted = (n_visible >= 2) & (mass > 0) & torch.isfinite(mass) & seen
    if query_valid is not None:
        counted &= query_valid.to(torch.bool).reshape(b, 1, q)
    entropy = (torch.log(safe_l) + spread / safe_l).clamp_min(0.0)  # rounding
    k_top = min(top_k, stats.top.shape[-1])
    max_p = 1.0 / safe_l
    per_row = {
        "entropy": entropy / torch.log(n_visible.clamp_min(2)),
        "max_weight": max_p,
        "collapse_rate": (max_p >= tau).double(),
        "effective_tokens": torch.exp(entropy),
        "topk_mass": torch.exp(stats.top[..., :k_top] - ref.unsqueeze(-1)).sum(-1) / safe_l,
        "sink_mass": torch.exp(stats.first - ref) / safe_l,
        "row_mass": mass,
    }
    sums = {name: _heads(torch.where(counted, value, 0.0)) for name, value in per_row.items()}
    sums["rows"] = _heads(counted.double())
    if prompts:
        sums.update(_prompt_sums(stats, counted, per_row["collapse_rate"], query_positions, prompt_length))
    if stats.key_mass is not None:
        sums.update(_position_sums(stats, counted, safe_l, local_distance))
    if stats.sink is not None and parts is not None:
        # every real query row: one that gives the sink everything counts most (a sink logit of −inf
        # is a zero share; NaN or +inf: the row is broken and does not count)
        sink_rows = ~torch.isnan(stats.sink) & (stats.sink != math.inf)
        if query_valid is not None:
            sink_rows = sink_rows & query_valid.to(torch.bool).reshape(b, 1, q)
        share = torch.exp(stats.sink - parts[0]) / parts[2]
        sums["learned_sink"] = _heads(torch.where(sink_rows, share, 0.0))
        sums["sink_rows"] = _heads(sink_rows.double())
    zeros = torch.zeros(h, dtype=torch.float64, device=m.device)
    if target is None or stats.target is None:
        sums["outlier_capture"], sums["capture_rows"] = zeros, zeros.clone()
        return sums
    at_target = torch.exp(stats.target - ref) / safe_l
    if query_positions is None:
        query_positions = torch.arange(stats.keys - q, stats.keys, device=m.device)
    not_itself = query_positions.to(m.device).reshape(1, 1, q) != target.to(m.device).long().reshape(b, 1, 1)
    capture_rows = counted & stats.target_seen & not_itself
    sums["outlier_capture"] = _heads(torch.where(capture_rows, at_target, 0.0))
    sums["capture_rows"] = _heads(capture_rows.double())
    return sums


PROMPT_SUMS = ("prompt_collapsed", "prompt_rows")  # [b, h, windows]; not per-head sums (HeadStats)


def _prompt_sums(
    stats: RowStatistics, counted, collapsed, query_positions, prompt_length: int | None
) -> dict:
    """Per sample (with ``prompt_length``: per window of that many query positions, the length probe's
    longer inputs cut at the base length, so window j of a long input holds the same tokens as prompt
    j at the base length): collapsed rows and counted rows, [b, h, windows]."""
    b, h, q = counted.shape
    if query_positions is None:
        query_positions = torch.arange(stats.keys - q, stats.keys)
    window = torch.zeros(q, dtype=torch.long, device=counted.device)
    windows = 1
    if prompt_length is not None:
        windows = max(1, math.ceil(stats.keys / prompt_length))
        window = (query_positions.to(counted.device).long() // prompt_length).clamp(0, windows - 1)
    out = {}
    for name, value in zip(PROMPT_SUMS, (torch.where(counted, collapsed, 0.0), counted.double())):
        total = torch.zeros(b, h, windows, dtype=torch.float64, device=counted.device)
        out[name] = total.index_add_(2, window, value.double()).cpu()
    return out


def _position_sums(stats: RowStatistics, counted, safe_l, local_distance: int) -> dict:
    """The position sums of :func:`row_sums` over its counted rows (p normalized over the keys)."""
    b, h, q = counted.shape
    # The [b, h, q, bins] shares are the largest tensors diagnose makes after the model's own (17 MB
    # each at 4,096 tokens), so uncounted rows are zeroed in place (few: a row that sees < 2 keys) and
    # the uniform share is divided at the statistics' own shape (no head dimension where the
    # visibility has none): the same values, in the same layout, so the same sums as torch.where
    # over full-size copies, at a third of the passes (docs/performance.md).
    key_share = stats.key_mass / safe_l.unsqueeze(-1)  # [b, h, q, B]
    distance_share = stats.distance_mass / safe_l.unsqueeze(-1)  # [b, h, q, D]
    skipped = ~counted
    key_share[skipped] = 0.0
    distance_share[skipped] = 0.0
    uniform = stats.key_visible / stats.visible.clamp_min(1).unsqueeze(-1)  # [b|1, h|1, q, B]
    near = max(1, local_distance - 1).bit_length() + 1  # distance bins 0 … that cover d < local_distance
    per_row = {
        "sink_share": key_share[..., 0],
        "sink_uniform": uniform[..., 0],
        "local_share": distance_share[..., :near].sum(-1),
        "attention_distance": stats.distance_sum / safe_l,
    }
    sums = {name: _heads(torch.where(counted, value, 0.0)) for name, value in per_row.items()}
    sums["received"] = key_share.sum(dim=(0, 2))  # [h, bins]
    sums["received_uniform"] = torch.where(counted.unsqueeze(-1), uniform, 0.0).sum(dim=(0, 2))
    sums["distance_profile"] = distance_share.sum(dim=(0, 2))
    return sums


@torch.no_grad()
def logit_sums(
    stats: RowStatistics,
    *,
    query_valid: torch.Tensor | None,
    query_positions: torch.Tensor,
    target: torch.Tensor | None,
) -> dict[str, float]:
    """The layer's logit-scale sums (:class:`ssacli.diagnosis.metrics.LayerStats`' ``logit_sq``,
    ``logit_n`` and, with a target, ``target_sum``, ``target_sq``, ``target_n``) over the valid rows;
    empty where the statistics saw no logits."""
    if stats.logit_sq is None or stats.logit_n is None:
        return {}
    b, h, q = stats.logit_sq.shape
    rows = torch.ones(b, 1, q, dtype=torch.bool, device=stats.logit_sq.device)
    if query_valid is not None:
        rows = rows & query_valid.to(torch.bool).reshape(b, 1, q)
    out = {
        "logit_sq": float(torch.where(rows, stats.logit_sq, 0.0).sum()),
        "logit_n": float(torch.where(rows, stats.logit_n, 0.0).sum()),
    }
    if target is not None and stats.target_logit is not None:
        positions = query_positions.to(rows.device).reshape(1, 1, q)
        itself = positions == target.to(rows.device).long().reshape(b, 1, 1)
        x = stats.target_logit
        at = rows & ~itself & torch.isfinite(x)
        out["target_sum"] = float(torch.where(at, x, 0.0).sum())
        out["target_sq"] = float(torch.where(at, x * x, 0.0).sum())
        out["target_n"] = float(at.sum())
    return out


# ---- the sums, added up: per head, per prompt, and where attention lands -----------------------


class HeadStats:
    """Running sums of :func:`~ssacli.diagnosis.row_metrics.row_sums` for one attention layer; ``means()``
    gives [h] per metric."""

    def __init__(self, num_heads: int) -> None:
        self.num_heads = num_heads
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, sums: dict[str, torch.Tensor]) -> None:
        for name, value in sums.items():
            value = value.detach().cpu()
            if name not in self.sums:
                self.sums[name] = value.clone()
                continue
            kept = self.sums[name]
            if value.dim() == 2 and value.shape[-1] != kept.shape[-1]:  # a longer call has more bins
                width = max(value.shape[-1], kept.shape[-1])
                kept = torch.nn.functional.pad(kept, (0, width - kept.shape[-1]))
                value = torch.nn.functional.pad(value, (0, width - value.shape[-1]))
            self.sums[name] = kept + value

    @property
    def rows(self) -> int:
        """Rows counted (the most any head counted; heads differ only for zero-mass rows)."""
        rows = self.sums.get("rows")
        return 0 if rows is None else int(rows.max().item())

    def means(self) -> dict[str, np.ndarray]:
        """Mean of each metric per head; NaN where a head counted no row, and for a metric whose sum
        (or count) the run did not give: the position terms where they were not measured, the
        learned sink in a layer without one."""
        empty = np.full(self.num_heads, math.nan)
        if not self.sums:
            return {name: empty.copy() for name in METRICS}
        out = {}
        for name, spec in METRICS.items():
            if spec.divisor is None:
                continue  # derived below, from the means
            if name not in self.sums or spec.divisor not in self.sums:
                out[name] = empty.copy()
                continue
            count = self.sums[spec.divisor].numpy()
            total = self.sums[name].numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = np.where(count > 0, total / np.maximum(count, 1), math.nan)
        out["sink_rate"] = sink_indicator(out["sink_mass"])
        out["sink_boost"] = empty.copy()
        if "sink_uniform" in self.sums:
            with np.errstate(invalid="ignore", divide="ignore"):
                share, uniform = self.sums["sink_share"].numpy(), self.sums["sink_uniform"].numpy()
                out["sink_boost"] = np.where(uniform > 0, share / np.where(uniform > 0, uniform, 1), math.nan)
        return out

    def profiles(self) -> dict[str, np.ndarray] | None:
        """Per head the position profiles [h, bins], means over the counted rows (``received``: share
        per key bin; ``received_boost``: that over the uniform share; ``distance_profile``: share per
        distance bin); None where the run did not measure them."""
        if "received" not in self.sums:
            return None
        rows = np.maximum(self.sums["rows"].numpy(), 1)[:, None]
        received, uniform = self.sums["received"].numpy(), self.sums["received_uniform"].numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            boost = np.where(uniform > 0, received / np.where(uniform > 0, uniform, 1), math.nan)
        empty = (self.sums["rows"].numpy() == 0)[:, None]
        return {
            "received": np.where(empty, math.nan, received / rows),
            "received_boost": np.where(empty, math.nan, boost),
            "distance_profile": np.where(empty, math.nan, self.sums["distance_profile"].numpy() / rows),
        }


class PromptStats:
    """Each prompt's collapsed and counted rows per head (``row_sums``' prompt sums: one prompt per
    sample, or with ``length`` a sample's rows cut into windows of that many query positions), kept
    per layer and batch, so that a verdict can read a level's change against its prompt-to-prompt
    noise (ssacli.diagnosis.outputs)."""

    def __init__(self, length: int | None = None) -> None:
        self.length = length
        self.sums: dict[int, dict[int, list[torch.Tensor]]] = {}  # layer -> batch -> [b, h, windows] ×2

    def add(self, layer: int, batch: int, values: list[torch.Tensor]) -> None:
        kept = self.sums.setdefault(layer, {}).get(batch)
        if kept is None:
            self.sums[layer][batch] = values
            return
        pad = torch.nn.functional.pad
        for i, value in enumerate(values):
            width = max(value.shape[-1], kept[i].shape[-1])
            kept[i] = pad(kept[i], (0, width - kept[i].shape[-1])) + pad(value, (0, width - value.shape[-1]))

    def rates(self, layers: int, heads: int) -> np.ndarray | None:
        """[prompt, layer, head]: each prompt's collapse rate per head (NaN where it counted no row,
        and in a layer that recorded none), prompts in input order (batch, sample, then window); None
        where nothing was kept."""
        if not self.sums:
            return None
        blocks = []
        for batch in sorted({b for per in self.sums.values() for b in per}):
            kept = [(layer, per[batch]) for layer, per in self.sums.items() if batch in per]
            b, windows = kept[0][1][0].shape[0], max(v[0].shape[-1] for _, v in kept)
            block = np.full((b, windows, layers, heads), math.nan)
            for layer, (collapsed, rows) in kept:
                collapsed, rows = collapsed.numpy(), rows.numpy()
                with np.errstate(invalid="ignore", divide="ignore"):
                    rate = np.where(rows > 0, collapsed / np.maximum(rows, 1), math.nan)  # [b, h, w]
                block[:, : rate.shape[2], layer, : rate.shape[1]] = rate.transpose(0, 2, 1)
            blocks.append(block.reshape(b * windows, layers, heads))
        return np.concatenate(blocks)


def position_profiles(probe: str, level: float, recorder, means: dict[str, np.ndarray]):
    """The :class:`~ssacli.diagnosis.positions.PositionProfiles` of one probe level: its recorder's
    per-layer sums (a :class:`~ssacli.diagnosis.recorder.Recorder` with ``positions``) and the
    level's per-head ``means`` [layer, head] of sink_share, local_share and entropy, for the classes;
    None where nothing was measured."""
    if recorder.positions is None or recorder.overflow.first is not None:
        return None
    bins, stats = recorder.positions, recorder.stats
    layers, heads = means["entropy"].shape
    found = {layer: s.profiles() for layer, s in stats.items()}
    found = {layer: p for layer, p in found.items() if p is not None}
    if not found:
        return None
    key_bins = max(p["received"].shape[-1] for p in found.values())
    distance_bins = max(p["distance_profile"].shape[-1] for p in found.values())
    arrays = {name: np.full((layers, heads, key_bins), np.nan) for name in ("received", "received_boost")}
    arrays["distance"] = np.full((layers, heads, distance_bins), np.nan)
    for layer, profile in found.items():
        for name, source in (("received", "received"), ("received_boost", "received_boost"),
                             ("distance", "distance_profile")):  # fmt: skip
            values = profile[source]
            arrays[name][layer, : values.shape[0], : values.shape[1]] = values
    # nominal edges: the last bin of each kind ends at the longest call's length, inside its last bin
    key_edges = [0, *(bins.sink_k + b * bins.bin_width for b in range(key_bins))]
    distance_edges = [0, *(2**b for b in range(distance_bins))]
    classes = [
        [head_class(*(float(means[m][layer, head]) for m in ("sink_share", "local_share", "entropy")))
         for head in range(heads)]
        for layer in range(layers)
    ]  # fmt: skip
    return PositionProfiles(
        probe, level, bins.sink_k, bins.bin_width, key_edges, distance_edges, arrays["received"],
        arrays["received_boost"], arrays["distance"], classes,
    )  # fmt: skip


__all__ = ["PROMPT_SUMS", "HeadStats", "PromptStats", "logit_sums", "position_profiles", "row_sums"]
