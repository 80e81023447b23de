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
from .metrics import METRICS  # the metric table (owned by diagnosis.metrics; importable from here too)

SCHEMA = "ssacli-diagnose"
SCHEMA_VERSION = 1
COLLAPSE_SHARE = 0.5  # collapse point: first level where the collapse rate reaches this share


@dataclass
class ProbeResult:
    """One probe swept over its levels. ``metrics[name]`` has shape [level, layer, head]."""

    name: str
    levels: list[float]
    metrics: dict[str, np.ndarray]
    rows: np.ndarray  # [level, layer]: query rows counted
    extras: dict[str, list[float | None]] = field(default_factory=dict)  # per level, e.g. loss
    note: str | None = None  # why the probe was skipped or limited

    @property
    def skipped(self) -> bool:
        return not any(np.isfinite(v).any() for v in self.metrics.values())

    def model_mean(self, metric: str) -> np.ndarray:
        """Mean over every head of every layer, per level (each head counts once)."""
        return _nanmean(self.metrics[metric].reshape(len(self.levels), -1), axis=1)

    def layer_mean(self, metric: str) -> np.ndarray:
        """[level, layer]: mean over the heads of each layer."""
        return _nanmean(self.metrics[metric], axis=2)

    def collapse_point(self) -> float | None:
        """Smallest level at which the model's mean collapse rate reaches 0.5; None if never."""
        return _first_level(self.levels, self.model_mean("collapse_rate"))

    def head_collapse_points(self) -> list[list[float | None]]:
        """[layer][head]: smallest level at which that head's collapse rate reaches 0.5."""
        rates = self.metrics["collapse_rate"]
        return [
            [_first_level(self.levels, rates[:, layer, head]) for head in range(rates.shape[2])]
            for layer in range(rates.shape[1])
        ]


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

    def most_saturated(self, count: int = 5) -> list[dict[str, Any]]:
        """The heads with the highest collapse rate (ties: highest max weight) at each probe's
        harshest level, across probes."""
        found = []
        for probe in self.probes:
            if probe.skipped:
                continue
            last = len(probe.levels) - 1
            rate = probe.metrics["collapse_rate"][last]
            peak = probe.metrics["max_weight"][last]
            for layer in range(rate.shape[0]):
                for head in range(rate.shape[1]):
                    if not math.isfinite(rate[layer, head]):
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
            "probes": [_probe_dict(p) for p in self.probes],
            "summary": {
                "collapse_share": COLLAPSE_SHARE,
                "collapse_points": self.collapse_points(),
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
        "summary": {
            "model": {k: json_ready(probe.model_mean(k)) for k in probe.metrics},
            "collapse_point": probe.collapse_point(),
            "head_collapse_points": probe.head_collapse_points(),
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
        "schema_version": 1,
        "a": a.to_dict(),
        "b": b.to_dict(),
        "deltas": deltas,
        "collapse_points": points,
    }
