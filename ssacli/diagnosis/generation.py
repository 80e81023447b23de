"""Saturation while generating (``diagnose --generate N``): every decoding step's attention against
the KV cache, measured with the same per-head metrics as the probes.

After each prompt (the prompts diagnose builds from its texts, samples and length, unshifted: no
probe acts during generation, so this is the probes' neutral level only) the model greedily
generates ``N`` tokens with its KV cache. Decoding step ``t`` (0 … N − 1) runs the ``t``-th generated
token as a single query row (q_len = 1) against the cache, whose key length is
``prompt_length + t + 1``; its attention passes the same :class:`~ssacli.diagnosis.recorder.Recorder`
as the probes (the token's own output, the next token, is taken by argmax; the last step's is
dropped). Metrics are ``[step, layer, head]``: the length trajectory over the generated positions.

Exactness: the finished sequences (prompt + N tokens) then run once more, whole and without a cache,
through the same recorder one query row at a time, and the rows of the generated positions must give
the same metrics: :attr:`GenerationResult.max_rel_diff` is the largest relative difference over
every step, layer, head and metric (float32 rounding: ~1e-6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..attention.arguments import cache_argument, returned_cache
from ..attention.forward import observing
from ..errors import UsageError
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel
from .metrics import METRICS
from .probe_result import array_from_json, json_ready
from .recorder import Recorder
from .routes import Route, forward_arguments
from .row_metrics import HeadStats

# The metrics compared with the full recomputation (row_mass is 1 for normalized scorers, sink_rate
# a 0/1 indicator of sink_mass; outlier_capture needs a probe target, learned_sink a sink model).
EXACT_METRICS = ("entropy", "max_weight", "collapse_rate", "effective_tokens", "topk_mass", "sink_mass")


@dataclass
class GenerationResult:
    """Per decoding step × layer × head metrics of greedy generation with a KV cache."""

    steps: int  # tokens generated per prompt (N)
    prompt_length: int  # tokens per prompt; step t's key length is prompt_length + t + 1
    prompts: int
    metrics: dict[str, np.ndarray]  # name -> [step, layer, head]
    rows: np.ndarray  # [step, layer]: query rows counted (one per prompt and head)
    max_rel_diff: float | None = None  # vs the full recomputation without cache (None: not checked)
    tokens: list[list[int]] = field(default_factory=list)  # the generated ids, per prompt

    def key_lengths(self) -> list[int]:
        return [self.prompt_length + t + 1 for t in range(self.steps)]

    def layer_mean(self, name: str) -> np.ndarray:
        """[step, layer]: the metric's mean over heads (NaN where no head has a value)."""
        values = self.metrics[name]
        with np.errstate(invalid="ignore"), _quiet():
            return np.nanmean(values, axis=-1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "prompt_length": self.prompt_length,
            "prompts": self.prompts,
            "probe_level": "unshifted",
            "key_lengths": self.key_lengths(),
            "metrics": {k: json_ready(v) for k, v in self.metrics.items()},
            "rows": json_ready(self.rows),
            "max_rel_diff": self.max_rel_diff,
            "tokens": [list(map(int, t)) for t in self.tokens],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationResult:
        return cls(
            steps=int(data["steps"]),
            prompt_length=int(data["prompt_length"]),
            prompts=int(data["prompts"]),
            metrics={k: array_from_json(v) for k, v in data["metrics"].items()},
            rows=np.nan_to_num(array_from_json(data["rows"])).astype(np.int64),
            max_rel_diff=data.get("max_rel_diff"),
            tokens=[list(t) for t in data.get("tokens") or []],
        )


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


class PositionRecorder(Recorder):
    """A :class:`Recorder` that keeps one set of per-layer sums per query position (from
    ``first`` on; earlier rows are dropped): run with ``block_size=1`` and eager statistics, so each
    record call holds one row."""

    def __init__(self, layer_of: dict[int, int], first: int, **kwargs) -> None:
        super().__init__(layer_of, block_size=1, stats="eager", **kwargs)
        self.first = first
        self.by_position: dict[int, dict[int, HeadStats]] = {}

    def record(self, module, weights, visible, query_positions, sink=None, logits=None) -> None:
        position = int(query_positions[0])
        if weights.shape[-2] != 1 or position < self.first:
            return
        self.stats = self.by_position.setdefault(position - self.first, {})
        super().record(module, weights, visible, query_positions, sink)  # no logit scale kept


def check_generate(loaded: LoadedModel, route: Route, steps: int, length: int) -> int:
    """The prompt length generation runs with (``length``, shortened so that prompt + ``steps``
    tokens fit the model's positions), or a UsageError saying why it cannot run."""
    if steps < 1:
        raise UsageError(f"--generate must be >= 1, got {steps}")
    if loaded.kind != ModelKind.CAUSAL:
        raise UsageError(f"--generate needs a causal language model (this model's kind: {loaded.kind})")
    if route is not Route.SSACLI:
        raise UsageError(
            f"--generate needs ssacli's attention function; family '{loaded.family}' runs on the eager "
            "fallback, whose hooks see no per-step attention against a cache"
        )
    cap = loaded.max_positions
    if cap and steps >= cap:
        raise UsageError(f"--generate {steps} leaves no room for a prompt in the model's {cap} positions")
    return min(length, cap - steps) if cap else length


def _metric_means(per_layer: dict[int, HeadStats], layers: int, width: int):
    metrics = {name: np.full((layers, width), np.nan) for name in METRICS}
    rows = np.zeros(layers, dtype=np.int64)
    for layer, stats in per_layer.items():
        means = stats.means()
        for name in METRICS:
            metrics[name][layer, : stats.num_heads] = means[name]
        rows[layer] = stats.rows
    return metrics, rows


def _stack(per_step: list[dict[int, HeadStats]], layers: int, width: int):
    parts = [_metric_means(s, layers, width) for s in per_step]
    metrics = {name: np.stack([p[0][name] for p in parts]) for name in METRICS}
    return metrics, np.stack([p[1] for p in parts])


def generate(
    loaded: LoadedModel, route: Route, layers: list[tuple[str, nn.Module]], heads: list[int],
    prompts: list[list[int]], steps: int, *, tau: float, top_k: int, block_size: int, stats: str,
    batch_size: int, verify: bool = True,
) -> GenerationResult:  # fmt: skip
    """Greedy-generate ``steps`` tokens after each prompt, measuring each decoding step's attention;
    with ``verify``, the full recomputation's max relative difference too."""
    layer_of = {id(m): i for i, (_, m) in enumerate(layers)}
    options = dict(tau=tau, top_k=top_k, causal=True)
    recorders = [Recorder(layer_of, block_size=block_size, stats=stats, **options) for _ in range(steps)]
    reference = PositionRecorder(layer_of, 0, **options) if verify else None
    groups: dict[int, list[list[int]]] = {}
    for prompt in prompts:
        groups.setdefault(len(prompt), []).append(prompt)
    tokens: list[list[int]] = []
    device = loaded.device
    for length, same in groups.items():
        for start in range(0, len(same), batch_size):
            ids = torch.tensor(same[start : start + batch_size], dtype=torch.long, device=device)
            sequence = _decode(loaded, route, ids, steps, recorders, options, block_size, stats)
            tokens += sequence[:, length:].tolist()
            if reference is not None:
                reference.first = length
                _full(loaded, route, sequence, reference)
    width = max(heads)
    metrics, rows = _stack([r.stats for r in recorders], len(layers), width)
    max_rel = None
    if reference is not None:
        positions = [reference.by_position.get(t, {}) for t in range(steps)]
        expected, _ = _stack(positions, len(layers), width)
        max_rel = _max_rel_diff(metrics, expected)
    return GenerationResult(
        steps=steps, prompt_length=min(groups) if groups else 0, prompts=len(prompts),
        metrics=metrics, rows=rows, max_rel_diff=max_rel, tokens=tokens,
    )  # fmt: skip


def _decode(loaded, route, ids, steps, recorders, options, block_size, stats) -> torch.Tensor:
    """The prompt's prefill, then ``steps`` single-token forwards against the cache, each observed by
    its step's recorder. Returns [b, prompt + steps] ids."""
    model = loaded.model
    extra = forward_arguments(route)
    layer_of = recorders[0].layer_of if recorders else {}
    with torch.inference_mode():
        prefill = Recorder(layer_of, block_size=block_size, stats=stats, **options)  # same path, dropped
        with observing(prefill):
            out = model(input_ids=ids, use_cache=True, **extra)
        cache = returned_cache(out)
        sequence = ids
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        for recorder in recorders:
            sequence = torch.cat([sequence, token], dim=1)
            with observing(recorder):
                out = model(input_ids=token, use_cache=True, **cache_argument(model, cache), **extra)
            cache = returned_cache(out)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
    return sequence


def _full(loaded, route, sequence: torch.Tensor, reference: PositionRecorder) -> None:
    """The finished sequences once more, whole and without a cache, row by row into ``reference``."""
    with torch.inference_mode(), observing(reference):
        loaded.model(input_ids=sequence, use_cache=False, **forward_arguments(route))


# Values below this are compared on this scale, not relative to themselves: a head that attends to one
# token has a normalized entropy near 1e-7, where float32's last bits are a 5 % "relative" error
# (SmolLM2: 7.41e-8 vs 7.02e-8 while every other metric agreed to 1.3e-5).
RELATIVE_FLOOR = 1e-3


def _max_rel_diff(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> float:
    """max |got − expected| / max(|expected|, RELATIVE_FLOOR) over the :data:`EXACT_METRICS` (NaN
    where both are NaN is agreement; NaN on one side only is an infinite difference)."""
    worst = 0.0
    for name in EXACT_METRICS:
        a, b = got[name], expected[name]
        both = np.isnan(a) & np.isnan(b)
        if (np.isnan(a) ^ np.isnan(b)).any():
            return math.inf
        diff = np.abs(np.where(both, 0.0, a - b)) / np.maximum(np.abs(np.nan_to_num(b)), RELATIVE_FLOOR)
        worst = max(worst, float(diff.max(initial=0.0)))
    return worst


__all__ = ["EXACT_METRICS", "GenerationResult", "PositionRecorder", "check_generate", "generate"]
