"""The typed result of ``ssacli.diagnose``: metric arrays, their summaries, and the JSON schema.

Every metric is an array ``[level, layer, head]`` per probe (NaN where undefined: a metric a probe
does not produce, a head with no countable row, or, when layers have different head counts, the
heads a layer does not have: arrays are as wide as the widest layer). The CLI and the reports only
read this object; ``DiagnoseResult.to_dict`` / ``from_dict`` are the versioned JSON schema documented in
docs/diagnose.md (NaN is written as null).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .metrics import (  # the metric tables (owned by diagnosis.metrics; importable from here too)
    LAYER_METRICS,
    METRICS,
    sink_indicator,
)
from .probes import PROBES

SCHEMA = "ssacli-diagnose"
SCHEMA_VERSION = 2  # 2: layer_metrics, overflow, insensitive, reach, baseline-relative collapse, findings
COLLAPSE_SHARE = 0.5  # collapse point: first level where the collapse rate reaches this share
REACH_TOLERANCE = 0.01  # a magnitude probe whose logit RMS moved less than this (relative) did not reach


@dataclass
class ProbeResult:
    """One probe swept over its levels. ``metrics[name]`` has shape [level, layer, head]."""

    name: str
    levels: list[float]
    metrics: dict[str, np.ndarray]
    rows: np.ndarray  # [level, layer]: query rows counted
    extras: dict[str, list[float | None]] = field(default_factory=dict)  # per level, e.g. loss
    note: str | None = None  # why the probe was skipped or limited
    layer_metrics: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [level, layer]
    overflow: list[dict[str, Any] | None] = field(default_factory=list)  # per level: where it overflowed
    insensitive: str | None = None  # why the scorer cannot respond to this probe by construction

    def __post_init__(self) -> None:
        if not self.overflow:
            self.overflow = [None] * len(self.levels)
        if "sink_rate" not in self.metrics and "sink_mass" in self.metrics:  # a schema-1 result
            self.metrics["sink_rate"] = sink_indicator(self.metrics["sink_mass"])

    @property
    def skipped(self) -> bool:
        return not any(np.isfinite(v).any() for v in self.metrics.values()) and not any(self.overflow)

    @property
    def kind(self):
        return PROBES.get(self.name)

    def overflowed(self, index: int) -> dict[str, Any] | None:
        return self.overflow[index] if index < len(self.overflow) else None

    def first_overflow(self) -> tuple[float, dict[str, Any]] | None:
        for level, where in zip(self.levels, self.overflow):
            if where:
                return level, where
        return None

    # ---- where the probe acts ----------------------------------------------------------------------
    def reach(self) -> np.ndarray | None:
        """[level, layer]: the logits' RMS at each level ÷ at the first level (on the target key
        for probes with one). None where the logits were not observed (eager fallback)."""
        name = "target_logit_rms" if self.kind is not None and self.kind.has_target else "logit_rms"
        values = self.layer_metrics.get(name)
        if values is None or not np.isfinite(values).any():
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return values / values[:1]

    def reach_model(self) -> list[float | None]:
        """Per level: the mean over layers of :meth:`reach` (1.00 = the logits did not move)."""
        ratio = self.reach()
        if ratio is None:
            return [None] * len(self.levels)
        return json_ready(_nanmean(ratio, axis=1))

    def reached(self) -> bool | None:
        """Whether the probe moved the attention logits at any level after the first (None: not
        measured, or the probe is not a magnitude shift)."""
        ratio = self.reach()
        if ratio is None or self.kind is None or not self.kind.magnitude or len(self.levels) < 2:
            return None
        moved = np.abs(ratio[1:] - 1.0)
        moved = moved[np.isfinite(moved)]
        if moved.size == 0:
            return None
        return bool(moved.max() > REACH_TOLERANCE)

    # ---- baseline-relative collapse ---------------------------------------------------------------
    def baseline_collapsed(self) -> np.ndarray:
        """[layer, head] bool: heads whose collapse rate is already >= 0.5 at the first level."""
        if "collapse_rate" not in self.metrics:
            return np.zeros(self.rows.shape[1:2] + (0,), dtype=bool)
        first = self.metrics["collapse_rate"][0]
        with np.errstate(invalid="ignore"):
            return np.isfinite(first) & (first >= COLLAPSE_SHARE)

    def baseline_collapsed_heads(self) -> list[tuple[int, int]]:
        return [(int(layer), int(head)) for layer, head in zip(*np.nonzero(self.baseline_collapsed()))]

    def fresh_collapse_rate(self) -> np.ndarray:
        """Per level: the mean collapse rate over the heads not collapsed at the first level."""
        rates = self.metrics["collapse_rate"].copy()
        rates[:, self.baseline_collapsed()] = np.nan
        return _nanmean(rates.reshape(len(self.levels), -1), axis=1)

    def change_from_first(self, metric: str) -> np.ndarray:
        mean = self.model_mean(metric)
        return mean - mean[0]

    def model_mean(self, metric: str) -> np.ndarray:
        """Mean over every head of every layer, per level (each head counts once)."""
        return _nanmean(self.metrics[metric].reshape(len(self.levels), -1), axis=1)

    def layer_mean(self, metric: str) -> np.ndarray:
        """[level, layer]: mean over the heads of each layer."""
        return _nanmean(self.metrics[metric], axis=2)

    def collapse_point(self) -> float | None:
        """Smallest level after the first at which the mean collapse rate of the heads not
        collapsed at the first level reaches 0.5; None if never (or undefined: see
        :meth:`collapse_status`)."""
        if self.insensitive:
            return None
        return _first_level(self.levels[1:], self.fresh_collapse_rate()[1:])

    def collapse_status(self) -> str:
        """How to read the collapse point: a level, "none", "n/a" (insensitive by construction),
        "did not reach attention", or "overflow at LEVEL" before any collapse."""
        if self.insensitive:
            return "n/a"
        point = self.collapse_point()
        flow = self.first_overflow()
        if flow is not None and (point is None or flow[0] <= point):
            return f"overflow at {flow[0]:g}"
        if point is not None:
            return f"{point:g}"
        if self.reached() is False:
            return "did not reach attention"
        return "none"

    def head_collapse_points(self) -> list[list[float | None]]:
        """[layer][head]: smallest level after the first at which that head's collapse rate reaches
        0.5; None if never, and for heads collapsed at the first level (:meth:`baseline_collapsed_heads`)."""
        rates = self.metrics["collapse_rate"]
        base = self.baseline_collapsed()
        return [
            [
                None if base[layer, head] else _first_level(self.levels[1:], rates[1:, layer, head])
                for head in range(rates.shape[2])
            ]
            for layer in range(rates.shape[1])
        ]

    def most_different_level(self) -> int:
        """Index of the level where the heads not collapsed at baseline differ most (largest spread
        of collapse rate, then of max weight; ties: the harsher level)."""
        best, index = -1.0, len(self.levels) - 1
        if not {"collapse_rate", "max_weight"} <= set(self.metrics):
            return index
        keep = ~self.baseline_collapsed()
        for i in range(len(self.levels)):
            spread = 0.0
            for metric in ("collapse_rate", "max_weight"):
                grid = self.metrics[metric][i][keep]
                finite = grid[np.isfinite(grid)]
                if finite.size > 1:
                    spread += float(finite.std()) * (1000 if metric == "collapse_rate" else 1)
            if spread >= best - 1e-12:
                best, index = spread, i
        return index

    def fading(self) -> dict[str, Any] | None:
        """Length probe: per head, the least-squares slope of normalized entropy, max weight and
        sink mass against log2 of the context length (per doubling of n). None for other probes."""
        tokens = self.extras.get("tokens")
        if self.kind is None or self.kind.name != "length" or not tokens:
            return None
        n = np.array([np.nan if t is None else t for t in tokens], dtype=float)
        out: dict[str, Any] = {"per": "doubling of the context length n", "n": json_ready(n)}
        for metric in ("entropy", "max_weight", "sink_mass"):
            values = self.metrics[metric]
            out[metric] = json_ready(_slopes(np.log2(n), values))
            layers = _slopes(np.log2(n), self.layer_mean(metric)[:, :, None])[:, 0]
            out[f"{metric}_layers"] = json_ready(layers)
        return out


@dataclass
class DiagnoseResult:
    model: str  # what the user asked for (path, builtin:NAME, hub id)
    family: str  # config.model_type, or "icl-gpt2" for ssacli's ICL models
    scorer: str  # scorer spec the attention ran with ("softmax" for an untouched model)
    route: str  # "ssacli" (attention function, streamed) or "eager-fallback" (hooked weights)
    layers: list[str]  # attention module names, in forward order
    heads: list[int]  # heads per layer
    probes: list[ProbeResult]
    settings: dict[str, Any] = field(default_factory=dict)  # seed, tau, top_k, inputs, device, ...
    versions: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    # ---- lookups -------------------------------------------------------------------------------
    def probe(self, name: str) -> ProbeResult:
        for probe in self.probes:
            if probe.name == name:
                return probe
        raise KeyError(f"no probe '{name}' in this result (have: {', '.join(p.name for p in self.probes)})")

    def collapse_points(self) -> dict[str, float | None]:
        return {p.name: p.collapse_point() for p in self.probes if not p.skipped}

    def findings(self) -> list[dict[str, Any]]:
        """3-8 plain-language statements computed from the result (see ssacli.diagnosis.findings)."""
        from .findings import findings

        return findings(self)

    def most_saturated(self, count: int = 5) -> list[dict[str, Any]]:
        """The heads with the highest collapse rate (ties: highest max weight) at the level where
        each probe's heads differ most (:meth:`ProbeResult.most_different_level`; not the harshest
        level, where nearly every head may have collapsed), across probes; heads collapsed at a
        probe's first level are left out (they are listed per probe as baseline-collapsed)."""
        found = []
        for probe in self.probes:
            if probe.skipped or probe.insensitive:
                continue
            last = probe.most_different_level()
            base = probe.baseline_collapsed()
            rate = probe.metrics["collapse_rate"][last]
            peak = probe.metrics["max_weight"][last]
            for layer in range(rate.shape[0]):
                for head in range(rate.shape[1]):
                    if not math.isfinite(rate[layer, head]) or base[layer, head]:
                        continue
                    found.append(
                        {
                            "probe": probe.name,
                            "level": probe.levels[last],
                            "layer": layer,
                            "head": head,
                            "collapse_rate": float(rate[layer, head]),
                            "max_weight": float(peak[layer, head]),
                            "entropy": float(probe.metrics["entropy"][last, layer, head]),
                        }
                    )
        found.sort(
            key=lambda h: (-h["collapse_rate"], -_finite_or(h["max_weight"], -1), _finite_or(h["entropy"], 2))
        )
        return json_ready(found[:count])

    # ---- JSON schema -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "family": self.family,
            "scorer": self.scorer,
            "route": self.route,
            "layers": self.layers,
            "heads": json_ready(self.heads),
            "settings": json_ready(self.settings),
            "versions": json_ready(self.versions),
            "elapsed_s": round(self.elapsed_s, 3),
            "metrics": {name: spec.description for name, spec in METRICS.items()},
            "layer_metrics": {name: spec.description for name, spec in LAYER_METRICS.items()},
            "findings": self.findings(),
            "probes": [_probe_dict(p) for p in self.probes],
            "summary": {
                "collapse_share": COLLAPSE_SHARE,
                "collapse_points": self.collapse_points(),
                "collapse_status": {p.name: p.collapse_status() for p in self.probes if not p.skipped},
                "most_saturated": self.most_saturated(),
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiagnoseResult:
        if data.get("schema") != SCHEMA:
            raise InputError(
                f"not an ssacli diagnose result (schema={data.get('schema')!r}); "
                "give a file written by `ssacli diagnose --json`"
            )
        if data.get("schema_version", 0) > SCHEMA_VERSION:
            raise InputError(
                f"result written by a newer ssacli (schema {data['schema_version']}); upgrade ssacli"
            )
        probes = [
            ProbeResult(
                name=p["name"],
                levels=[float(v) for v in p["levels"]],
                metrics={k: _array(v) for k, v in p["metrics"].items()},
                rows=np.nan_to_num(_array(p["rows"])).astype(np.int64),
                extras={k: list(v) for k, v in p.get("extras", {}).items()},
                note=p.get("note"),
                layer_metrics={k: _array(v) for k, v in p.get("layer_metrics", {}).items()},
                overflow=list(p.get("overflow") or []),
                insensitive=p.get("insensitive"),
            )
            for p in data["probes"]
        ]
        shape = (len(data["layers"]), max(data["heads"], default=0))
        for probe in probes:
            for name, values in probe.metrics.items():
                if values.shape != (len(probe.levels), *shape):
                    raise ValueError(
                        f"probe {probe.name}: metric {name} has shape {values.shape}, expected "
                        f"{(len(probe.levels), *shape)} (levels, layers, heads)"
                    )
        return cls(
            model=data["model"],
            family=data["family"],
            scorer=data["scorer"],
            route=data.get("route", "ssacli"),
            layers=list(data["layers"]),
            heads=list(data["heads"]),
            probes=probes,
            settings=dict(data.get("settings", {})),
            versions=dict(data.get("versions", {})),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> DiagnoseResult:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(
                f"result file '{path}' does not exist; write one with `ssacli diagnose --json`"
            ) from None
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise InputError(f"cannot read result file '{path}' ({err}); give a `--json` output") from None
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"result file '{path}' is malformed ({err!r}); re-create it") from None


# ---- helpers ---------------------------------------------------------------------------------------


def _nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    finite = np.isfinite(values)
    count = finite.sum(axis=axis)
    total = np.where(finite, values, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _slopes(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[layer, head] least-squares slope of values [level, layer, head] against x [level], over the
    levels where both are finite (NaN with fewer than two)."""
    out = np.full(values.shape[1:], np.nan)
    for index in np.ndindex(*values.shape[1:]):
        y = values[(slice(None), *index)]
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() >= 2 and np.ptp(x[ok]) > 0:
            out[index] = np.polyfit(x[ok], y[ok], 1)[0]
    return out


def _first_level(levels: list[float], rates: np.ndarray) -> float | None:
    for level, rate in zip(levels, rates):
        if math.isfinite(rate) and rate >= COLLAPSE_SHARE:
            return level
    return None


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default


def json_ready(value: Any) -> Any:
    """``value`` as JSON can hold it, recursively: NaN/inf -> None (JSON has no NaN), numpy arrays
    -> lists, numpy scalars -> Python numbers. Every ssacli JSON writer of results uses it."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _array(nested: Any) -> np.ndarray:
    return np.asarray(_clean_in(nested), dtype=np.float64)


def _clean_in(value: Any) -> Any:
    if isinstance(value, list):
        return [_clean_in(v) for v in value]
    return np.nan if value is None else value


def _probe_dict(probe: ProbeResult) -> dict[str, Any]:
    return {
        "name": probe.name,
        "levels": json_ready(list(probe.levels)),
        "note": probe.note,
        "metrics": {k: json_ready(v) for k, v in probe.metrics.items()},
        "rows": json_ready(probe.rows),
        "extras": {k: json_ready(v) for k, v in probe.extras.items()},
        "layer_metrics": {k: json_ready(v) for k, v in probe.layer_metrics.items()},
        "overflow": json_ready(probe.overflow),
        "insensitive": probe.insensitive,
        "summary": {
            "model": {k: json_ready(probe.model_mean(k)) for k in probe.metrics},
            "change_from_first": {k: json_ready(probe.change_from_first(k)) for k in probe.metrics},
            "collapse_point": probe.collapse_point(),
            "collapse_status": probe.collapse_status(),
            "fresh_collapse_rate": json_ready(probe.fresh_collapse_rate()),
            "baseline_collapsed_heads": [list(h) for h in probe.baseline_collapsed_heads()],
            "head_collapse_points": probe.head_collapse_points(),
            "logit_rms_ratio": probe.reach_model(),
            "reached_attention": probe.reached(),
            "fading": probe.fading(),
        },
    }


# ---- comparing two results -------------------------------------------------------------------------


def common_levels(a: ProbeResult, b: ProbeResult) -> list[tuple[float, int, int]]:
    """(level, index in a, index in b) for each level both probes swept, in a's order. Levels are
    matched with a relative tolerance: the same sweep written by two runs may round differently."""
    shared = []
    for ia, level in enumerate(a.levels):
        for ib, other in enumerate(b.levels):
            if math.isclose(level, other, rel_tol=1e-9, abs_tol=1e-12):
                shared.append((level, ia, ib))
                break
    return shared


def compare_findings(a: DiagnoseResult, b: DiagnoseResult) -> list[dict[str, Any]]:
    from .findings import comparison_findings

    return comparison_findings(a, b)


def compare_results(a: DiagnoseResult, b: DiagnoseResult) -> dict[str, Any]:
    """Both results plus, per probe present and not skipped in both, B − A of every shared metric's
    model mean on the common levels (None where either side is undefined) and both collapse
    points (each over its own levels). JSON-ready: no NaN anywhere."""
    deltas: dict[str, dict[str, list]] = {}
    points: dict[str, dict[str, float | None]] = {}
    names_b = {p.name for p in b.probes}
    for pa in a.probes:
        if pa.name not in names_b:
            continue
        pb = b.probe(pa.name)
        if pa.skipped or pb.skipped:
            continue
        shared = common_levels(pa, pb)
        entry: dict[str, list] = {"levels": [level for level, _, _ in shared]}
        for metric in [m for m in pa.metrics if m in pb.metrics]:
            ma, mb = pa.model_mean(metric), pb.model_mean(metric)
            entry[metric] = [json_ready(float(mb[ib] - ma[ia])) for _, ia, ib in shared]
        deltas[pa.name] = entry
        points[pa.name] = {"a": pa.collapse_point(), "b": pb.collapse_point()}
    return {
        "schema": "ssacli-diagnose-comparison",
        "schema_version": 2,
        "findings": compare_findings(a, b),
        "a": a.to_dict(),
        "b": b.to_dict(),
        "deltas": deltas,
        "collapse_points": points,
    }
