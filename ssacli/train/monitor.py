"""Saturation measured during training: a fixed probe batch, a few probe levels, per-layer metrics
every N steps, as flat float log keys (``ssacli/layer3/entropy@key-scale:8``).

:class:`SaturationMonitor` is the one implementation; :class:`ssacli.SaturationCallback`
(:mod:`ssacli.train.trainer_callback`) runs it inside a ``transformers.Trainer``, and ssacli's own
loop calls :meth:`SaturationMonitor.log` after each step. The numbers are a :func:`ssacli.diagnose`
of the model as it is at that step, on the monitor's fixed inputs (same code path, no second
implementation of a metric), so a logged value equals a ``diagnose`` of the checkpoint saved at that
step on the same batch and levels.

Default levels ``key-scale:1,8``: level 1 is the clean model (the neutral level of key-scale: keys
unchanged), where training's own entropy collapse shows (Zhai et al., 2023); σ = 8 scales one
token's keys as attention receives them, the probe that reaches attention through a pre-norm
model's normalization (an embedding-side shift is divided out there), at the middle of diagnose's
default sweep (1 … 32). Two forwards of the probe batch per measurement.

Under a process group (torchrun, accelerate launch) every rank runs the probe forward or none
does, so a sharded model (FSDP gathers parameters inside the forward) cannot hang: when a
measurement is due is a pure function of the step counter, which the trainer keeps equal on every
rank, and at a due step the ranks agree (one all-reduce of a flag, :func:`all_ranks_agree`) before
any forward; a rank that cannot measure makes every rank skip that step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .. import defaults
from ..diagnosis.metrics import METRICS
from ..diagnosis.plan import TokenSource
from ..diagnosis.probe_kinds import Probe, parse_probe
from ..diagnosis.probe_result import json_ready
from ..diagnosis.run import diagnose
from ..errors import UsageError
from ..models.kinds import max_positions

DEFAULT_EVERY = 100  # steps between measurements (the cost stated in docs/monitor.md is at this interval)
DEFAULT_PROBES = ("key-scale:1,8",)  # clean and one key-scale level (module docstring: why)
DEFAULT_METRICS = ("entropy", "max_weight", "collapse_rate", "sink_rate")
DEFAULT_SAMPLES = 4  # probe sequences (of defaults.PROBE_LENGTH tokens): one forward per level
PREFIX = "ssacli"  # every log key starts with it, so dashboards group them


def log_key(metric: str, probe: str, level: float, layer: int | None = None) -> str:
    """``ssacli/layer3/entropy@key-scale:8`` (``layer=None``: ``ssacli/model/…``, the mean over
    every head of every layer); the part after the layer is ``ssacli check``'s METRIC@PROBE:LEVEL."""
    where = "model" if layer is None else f"layer{layer}"
    return f"{PREFIX}/{where}/{metric}@{probe}:{level:g}"


def model_series(history: Sequence[dict[str, Any]]) -> dict[tuple[str, str, float], list[tuple[int, float]]]:
    """A monitor history (the record's ``monitor``) as {(metric, probe, level): [(step, model
    mean)]}: the model-level keys of :func:`log_key` read back, in step order, None values left out."""
    series: dict[tuple[str, str, float], list[tuple[int, float]]] = {}
    head = f"{PREFIX}/model/"
    for entry in history:
        for key, value in entry.items():
            if not key.startswith(head) or value is None:
                continue
            metric, _, rest = key[len(head) :].partition("@")
            probe, _, level = rest.rpartition(":")
            series.setdefault((metric, probe, float(level)), []).append((int(entry["step"]), float(value)))
    return series


def overflow_key(probe: str, level: float) -> str:
    """1.0 where the level's forward overflowed (its metrics are then NaN, as in diagnose), else 0.0."""
    return f"{PREFIX}/overflow@{probe}:{level:g}"


SECONDS_KEY = f"{PREFIX}/monitor_seconds"  # wall time of the measurement: its cost, logged with it


def all_ranks_agree(ready: bool) -> bool:
    """True only if every rank of the default process group is ``ready`` (one all-reduce of a flag;
    without a process group, ``ready`` itself). Every rank must call it at the same points."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ready
    device = "cpu"
    if dist.get_backend() == "nccl":  # nccl reduces CUDA tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if ready else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class SaturationMonitor:
    """Per-layer saturation metrics of a model on a fixed probe batch, every ``every`` steps.

    ``probes``: diagnose probe specs (default ``key-scale:1,8``); ``metrics``: names from
    :data:`ssacli.diagnosis.metrics.METRICS` (default entropy, max weight, collapse rate, sink rate),
    each logged per layer (mean over the layer's heads) and for the model (mean over every head).
    ``inputs``: the probe batch as token-id lists; by default ``samples`` windows of ``length``
    tokens of the built-in probe texts through the model's tokenizer (random ids without one), the
    inputs ``ssacli.diagnose(model, samples=samples, length=length, seed=seed)`` uses, built once at
    the first measurement. ``at_start``: also measure at step 0, before the first update.
    """

    def __init__(
        self,
        every: int = DEFAULT_EVERY,
        probes: Sequence[str | Probe] = DEFAULT_PROBES,
        *,
        metrics: Sequence[str] = DEFAULT_METRICS,
        inputs: Sequence[Sequence[int]] | None = None,
        samples: int = DEFAULT_SAMPLES,
        length: int = defaults.PROBE_LENGTH,
        seed: int = defaults.SEED,
        batch_size: int = defaults.BATCH_SIZE,
        at_start: bool = True,
    ) -> None:
        if every < 1:
            raise UsageError(f"the monitor's interval must be >= 1 step, got {every}")
        if samples < 1 or length < 2:
            raise UsageError(f"the probe batch needs samples >= 1 and length >= 2, got {samples} × {length}")
        unknown = [m for m in metrics if m not in METRICS]
        if unknown or not metrics:
            raise UsageError(f"unknown monitor metric {', '.join(unknown) or '(none given)'}; choose from: "
                             f"{', '.join(METRICS)}")  # fmt: skip
        self.every, self.at_start = every, at_start
        self.probes = [p if isinstance(p, Probe) else parse_probe(p) for p in probes]
        if not self.probes:
            raise UsageError("the monitor needs at least one probe, e.g. key-scale:1,8")
        self.metrics = tuple(metrics)
        self.samples, self.length, self.seed, self.batch_size = samples, length, seed, batch_size
        self.inputs: list[list[int]] | None = None if inputs is None else [list(s) for s in inputs]
        self.history: list[dict[str, Any]] = []  # {"step": N, key: value or None, ...} per measurement

    def due(self, step: int) -> bool:
        """Whether step ``step`` (the number of updates done) is measured: a function of the step
        alone, so every rank of a process group answers the same."""
        return step % self.every == 0 and (step > 0 or self.at_start)

    def probe_inputs(self, model: nn.Module, tokenizer: Any = None) -> list[list[int]] | None:
        """The fixed probe batch (built on first use; None for an ICL model, whose prompts
        diagnose draws from its task and seed)."""
        if self.inputs is None and not _is_icl(model):
            config = model.config
            length = min(self.length, max_positions(config) or self.length)
            vocab = getattr(getattr(config, "get_text_config", lambda: config)(), "vocab_size", None) or 2
            source = TokenSource(tokenizer, text=None, random_ids=tokenizer is None, vocab_size=vocab,
                                 seed=self.seed)  # fmt: skip
            self.inputs = source.sequences(self.samples, length)
        return self.inputs

    def measure(self, model: nn.Module, tokenizer: Any = None) -> dict[str, float]:
        """One measurement now: the log keys and their values (NaN where diagnose has none, e.g. an
        overflowed level). Runs the probe forwards in eval mode without gradients and puts the
        model's mode and attention implementation back."""
        started = time.perf_counter()
        inputs = self.probe_inputs(model, tokenizer)
        result = diagnose(
            model, self.probes, inputs=inputs, tokenizer=tokenizer, samples=self.samples,
            length=self.length, seed=self.seed, batch_size=self.batch_size,
        )  # fmt: skip
        values: dict[str, float] = {}
        for probe in result.probes:
            for li, level in enumerate(probe.levels):
                for metric in self.metrics:
                    per_layer = probe.layer_mean(metric)[li]
                    for layer, value in enumerate(per_layer):
                        values[log_key(metric, probe.name, level, layer)] = float(value)
                    values[log_key(metric, probe.name, level)] = float(probe.model_mean(metric)[li])
                values[overflow_key(probe.name, level)] = 1.0 if probe.overflowed(li) else 0.0
        values[SECONDS_KEY] = time.perf_counter() - started
        return values

    def log(self, step: int, model: nn.Module, tokenizer: Any = None, *, ready: bool = True) -> dict | None:
        """ssacli's loop, after each update: at a due step (and only if every rank is ``ready``)
        measure, append ``{"step": step, **values}`` to :attr:`history` (NaN as None, for JSON) and
        return the values; else None. Call it on every rank."""
        if not self.due(step) or not all_ranks_agree(ready):
            return None
        values = self.measure(model, tokenizer)
        self.history.append({"step": step, **json_ready(values)})
        return values


def _is_icl(model: nn.Module) -> bool:
    return getattr(model, "spec", None) is not None and hasattr(model, "backbone")


__all__ = [
    "DEFAULT_EVERY", "DEFAULT_METRICS", "DEFAULT_PROBES", "DEFAULT_SAMPLES", "SECONDS_KEY",
    "SaturationMonitor", "all_ranks_agree", "log_key", "model_series", "overflow_key",
]  # fmt: skip
