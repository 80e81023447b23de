"""The typed result of ``ssacli.diagnose``: the model's probes, their summaries, and the JSON schema.

Every metric is an array ``[level, layer, head]`` per probe (NaN where undefined: a metric a probe
does not produce, a head with no countable row, or, when layers have different head counts, the
heads a layer does not have: arrays are as wide as the widest layer). One probe's arrays and
summaries are a :class:`~ssacli.diagnosis.probe_result.ProbeResult`; two results side by side are
:mod:`ssacli.diagnosis.comparison`'s. The CLI and the reports only read these objects;
``DiagnoseResult.to_dict`` / ``from_dict`` are the versioned JSON schema documented in
docs/diagnose.md (NaN is written as null).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..display import Displayed
from ..documents import DIAGNOSE_SCHEMA as SCHEMA
from ..documents import read_json_file  # the one reader of result files (attribution's too)
from ..errors import InputError
from . import frames
from .findings import baseline_probe, findings
from .generation import GenerationResult
from .metrics import LAYER_METRICS, METRICS, QUALITY_METRICS
from .outputs import (
    NOISE_SIGMAS,
    OUTPUT_KL_HELD,
    collapse_change,
    degenerate,
    outputs_held,
    quality_values,
    reference_index,
)
from .plan import RANDOM_INPUTS
from .positions import PositionProfiles
from .probe_result import COLLAPSE_SHARE, REACH_SHARE, ProbeResult, array_from_json, json_ready
from .shift import shift_summary

SCHEMA_VERSION = 3  # 2: layer_metrics, overflow, insensitive, reach, baseline-relative collapse, findings
# 3: output quality per level (extras output_kl, summary quality), verdicts, degenerate, unaudited
SCHEMA_FILE = Path(__file__).with_name("diagnose.schema.json")  # JSON Schema (2020-12) of to_dict()


@dataclass
class DiagnoseResult(Displayed):  # Displayed: _repr_html_ and plot(kind) in a notebook (ssacli/display.py)
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
    unaudited: str | None = None  # why the family is not covered by the all-family audit (None: it is)
    generation: GenerationResult | None = None  # diagnose --generate: per decoding step metrics
    # which weights were measured: {repo, revision, commit} of a Hub model, {sha256, files} of a local
    # one (ssacli.models.identity); None for a model in memory without a Hub commit, or an older file
    weights: dict[str, Any] | None = None
    # where attention lands at the unshifted level (ssacli.diagnosis.positions); None: read from the
    # baseline probe (:meth:`position_profiles`)
    positions: PositionProfiles | None = None

    # ---- lookups -------------------------------------------------------------------------------
    def probe(self, name: str) -> ProbeResult:
        for probe in self.probes:
            if probe.name == name:
                return probe
        raise KeyError(f"no probe '{name}' in this result (have: {', '.join(p.name for p in self.probes)})")

    def position_profiles(self) -> PositionProfiles | None:
        """Where attention lands per head, at the unshifted level: the received profile, the distance
        histogram, the secondary sinks and the head classes; None where the run did not measure them
        (an older file, or a run without the position terms)."""
        if self.positions is not None:
            return self.positions
        probe = baseline_probe(self.probes)
        return None if probe is None else probe.positions

    def collapse_points(self) -> dict[str, float | None]:
        return {p.name: p.collapse_point() for p in self.probes if not p.skipped}

    def findings(self) -> list[dict[str, Any]]:
        """Every plain-language statement computed from the result, most important first (see
        ssacli.diagnosis.findings); the terminal lists the first --findings of them."""
        return findings(self.probes, self.heads, self._uniform_vocab())

    def degenerate(self) -> dict[str, Any] | None:
        """Why the model is degenerate at baseline (near-uniform attention everywhere, or a loss no
        better than uniform guessing), or None: :func:`ssacli.diagnosis.outputs.degenerate`."""
        probes = self.probes
        return degenerate(probes, self._uniform_vocab(), baseline_probe(probes))

    def _uniform_vocab(self) -> int | None:
        """The vocabulary a baseline loss is judged against (uniform guessing: log V); None on random
        token ids, where no model predicts better than guessing, so the loss says nothing of it."""
        if self.settings.get("inputs") == RANDOM_INPUTS:
            return None
        return self.settings.get("vocab_size")

    def verdicts(self) -> dict[str, dict[str, Any]]:
        """Per probe: its verdict (:func:`ssacli.diagnosis.verdicts.probe_verdicts`: saturates,
        overflow, degenerate, outputs broke, absorbed, n/a, robust, …), the line reports print and
        the level it names."""
        from .verdicts import probe_verdicts  # it reads findings' texts, which import this module

        return {v.probe: {"verdict": v.kind, "level": v.level, "text": v.line} for v in probe_verdicts(self)}

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
            "weights": self.weights,
            "family": self.family,
            "scorer": self.scorer,
            "route": self.route,
            "layers": self.layers,
            "heads": json_ready(self.heads),
            "settings": json_ready(self.settings),
            "versions": json_ready(self.versions),
            "elapsed_s": round(self.elapsed_s, 3),
            "unaudited": self.unaudited,
            "metrics": {name: spec.description for name, spec in METRICS.items()},
            "layer_metrics": {name: spec.description for name, spec in LAYER_METRICS.items()},
            "quality_metrics": {name: spec.description for name, spec in QUALITY_METRICS.items()},
            "findings": self.findings(),
            "probes": [_probe_dict(p) for p in self.probes],
            "positions": None if (profiles := self.position_profiles()) is None else profiles.to_dict(),
            "summary": {
                "collapse_share": COLLAPSE_SHARE,
                "collapse_points": self.collapse_points(),
                "collapse_status": {p.name: p.collapse_status() for p in self.probes if not p.skipped},
                "most_saturated": self.most_saturated(),
                "degenerate": json_ready(self.degenerate()),
                "verdicts": self.verdicts(),
            },
            "generation": None if self.generation is None else self.generation.to_dict(),
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
        try:
            return cls._parse(data)
        except KeyError as err:
            raise InputError(
                f"diagnose result without its field {err.args[0]!r}: it was edited or cut short; "
                "re-create it with `ssacli diagnose --json`"
            ) from None
        except (TypeError, ValueError, AttributeError) as err:
            raise InputError(
                f"malformed diagnose result ({err}); re-create it with `ssacli diagnose --json`"
            ) from None

    @classmethod
    def _parse(cls, data: dict[str, Any]) -> DiagnoseResult:
        probes = [
            ProbeResult(
                name=p["name"],
                levels=[float(v) for v in p["levels"]],
                metrics={k: array_from_json(v) for k, v in p["metrics"].items()},
                rows=np.nan_to_num(array_from_json(p["rows"])).astype(np.int64),
                extras={k: list(v) for k, v in p.get("extras", {}).items()},
                note=p.get("note"),
                layer_metrics={k: array_from_json(v) for k, v in p.get("layer_metrics", {}).items()},
                overflow=list(p.get("overflow") or []),
                insensitive=p.get("insensitive"),
                absorbers=list(p.get("absorbers") or []),  # absent before the reach rule: names fall back
                # absent before the per-prompt rates were kept: verdicts say the noise was not measured
                prompt_collapse=array_from_json(p["prompt_collapse"]) if p.get("prompt_collapse") else None,
                # absent from results written before it
                per_input={k: list(v) for k, v in (p.get("per_input") or {}).items()},
            )
            for p in data["probes"]
        ]
        shape = (len(data["layers"]), max(data["heads"], default=0))
        for probe in probes:
            for name, values in probe.metrics.items():
                if values.shape != (len(probe.levels), *shape):
                    raise InputError(
                        f"probe {probe.name}: metric {name} has shape {values.shape}, not the "
                        f"{(len(probe.levels), *shape)} (levels, layers, heads) the result lists; it was "
                        "edited or cut short: re-create it with `ssacli diagnose --json`"
                    )
        return cls(
            model=data["model"],
            weights=data.get("weights") if isinstance(data.get("weights"), dict) else None,
            family=data["family"],
            scorer=data["scorer"],
            route=data.get("route", "ssacli"),
            layers=list(data["layers"]),
            heads=list(data["heads"]),
            probes=probes,
            settings=dict(data.get("settings", {})),
            versions=dict(data.get("versions", {})),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            unaudited=data.get("unaudited"),
            generation=GenerationResult.from_dict(data["generation"]) if data.get("generation") else None,
            positions=PositionProfiles.from_dict(data["positions"]) if data.get("positions") else None,
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

    # ---- tables: one row per probe, metric, level, layer, head (ssacli.diagnosis.frames) ----------
    def to_records(self) -> list[dict[str, Any]]:
        """The per-head metrics in long format as dicts (model, probe, level, layer, head, metric,
        value; undefined values None). Needs nothing beyond the standard library."""
        return frames.records(self)

    def to_frame(self):
        """The same rows as a pandas DataFrame (NaN where undefined): ``pip install "ssacli[frame]"``."""
        return frames.to_frame(self)

    def to_csv(self) -> str:
        """The same rows as CSV text (a header line; undefined values empty)."""
        return frames.frame_csv(self)

    def to_parquet(self) -> bytes:
        """The same rows as the bytes of a Parquet file (undefined values null; needs pyarrow)."""
        return frames.frame_parquet(self)

    @classmethod
    def load(cls, path: str | Path) -> DiagnoseResult:
        """A result file written by ``ssacli diagnose --json``; every problem is one InputError line."""
        return cls.from_saved(read_json_file(path), path)

    @classmethod
    def from_saved(cls, data: dict[str, Any], path: str | Path) -> DiagnoseResult:
        """:meth:`from_dict` of a document read from ``path``: a malformed one is an InputError naming it."""
        try:
            return cls.from_dict(data)
        except InputError as err:  # another schema, a newer version: name the file too
            raise InputError(f"result file '{path}': {err}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InputError(f"result file '{path}' is malformed ({err!r}); re-create it") from None


# ---- helpers ---------------------------------------------------------------------------------------


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default


def _reach(probe: ProbeResult) -> dict[str, Any] | None:
    """Whether a magnitude probe's shift arrived where it acts (docs/diagnose.md, "Reached"): the
    measure, per level × layer the shift measured and its share of the shift asked, the rule, and
    where it was absorbed. None for probes that shift no magnitude."""
    measure = probe.reach_measure()
    if measure is None:
        return None
    index = probe.reach_index()
    return json_ready({
        "measure": measure, "kind": "offset" if probe.kind.additive else "factor",
        "shift": probe.reach_shift(), "share": probe.reach_share(), "rule_share": REACH_SHARE,
        "level": None if index is None else probe.levels[index], "layers": probe.reached_layers(),
        "reached": probe.reached(), "absorbed_layer": probe.absorbed_layer(),
        "absorbed_by": probe.absorbed_by(),
    })  # fmt: skip


def _probe_dict(probe: ProbeResult) -> dict[str, Any]:
    return {
        "name": probe.name,
        "levels": json_ready(list(probe.levels)),
        "note": probe.note,
        "metrics": {k: json_ready(v) for k, v in probe.metrics.items()},
        "rows": json_ready(probe.rows),
        "extras": {k: json_ready(v) for k, v in probe.extras.items()},
        "per_input": {k: json_ready(v) for k, v in probe.per_input.items()},
        "layer_metrics": {k: json_ready(v) for k, v in probe.layer_metrics.items()},
        "overflow": json_ready(probe.overflow),
        "insensitive": probe.insensitive,
        "absorbers": probe.absorbers,
        "prompt_collapse": None if probe.prompt_collapse is None else json_ready(probe.prompt_collapse),
        "summary": {
            "model": {k: json_ready(probe.model_mean(k)) for k in probe.metrics},
            "change_from_first": {k: json_ready(probe.change_from_first(k)) for k in probe.metrics},
            "collapse_point": probe.collapse_point(),
            "collapse_status": probe.collapse_status(),
            "fresh_collapse_rate": json_ready(probe.fresh_collapse_rate()),
            "baseline_collapsed_heads": [list(h) for h in probe.baseline_collapsed_heads()],
            "head_collapse_points": probe.head_collapse_points(),
            "layer_collapse_points": probe.layer_collapse_points(),
            "head_spread": {k: json_ready(v) for k, v in probe.head_spread().items()},
            "most_different_level": probe.levels[probe.most_different_level()],
            "logit_rms_ratio": probe.reach_model(),
            "reached_attention": probe.reached(),
            "reach": _reach(probe),
            "fading": probe.fading(),
            "quality": _quality(probe),
            "collapse_change": _collapse_change(probe),
            **({"shift": shift_summary(probe)} if shift_summary(probe) is not None else {}),
        },
    }


def _collapse_change(probe: ProbeResult) -> dict[str, Any]:
    """Per level: the change in fresh collapse from the unshifted level and its noise (the rule:
    :mod:`ssacli.diagnosis.outputs`)."""
    changes = [collapse_change(probe, i) for i in range(len(probe.levels))]
    return json_ready({
        "reference_level": probe.levels[changes[0].reference] if changes else None,
        "change": [c.change for c in changes], "noise": [c.noise for c in changes],
        "prompts": [c.prompts for c in changes], "noise_sigmas": NOISE_SIGMAS,
    })  # fmt: skip


def _quality(probe: ProbeResult) -> dict[str, Any]:
    """Per level: what the model still does (loss, output KL to the first level), whether its
    outputs held, and the rule's bound (:mod:`ssacli.diagnosis.outputs`)."""
    return {
        "loss": quality_values(probe, "loss"),
        "output_kl": quality_values(probe, "output_kl"),
        "reference_level": probe.levels[reference_index(probe.name, probe.levels)] if probe.levels else None,
        "outputs_held": [outputs_held(probe, i) for i in range(len(probe.levels))],
        "output_kl_held": OUTPUT_KL_HELD,
    }
