"""Hand-written diagnose results for the report tests: 2 layers × 3 heads, every array written
out here, so each expected number in a test (model means, collapse points, B − A deltas, the
findings) is worked out from these arrays, not read back from the code under test."""

from __future__ import annotations

import numpy as np

from ssacli.diagnosis.probe_result import ProbeResult
from ssacli.diagnosis.result import DiagnoseResult

NAN = float("nan")
SKIP_NOTE = "no numeric tokens in this vocabulary"


def probe_result(name, levels, collapse, max_weight, *, capture=None, extras=None, note=None) -> ProbeResult:
    """A probe whose other metrics follow from max_weight (entropy = 1 - max_weight, ...)."""
    collapse = np.asarray(collapse, dtype=float)
    max_weight = np.asarray(max_weight, dtype=float)
    metrics = {
        "entropy": 1.0 - max_weight,
        "max_weight": max_weight,
        "collapse_rate": collapse,
        "effective_tokens": 10.0 * (1.0 - max_weight) + 1.0,
        "topk_mass": np.minimum(max_weight + 0.1, 1.0),
        "sink_mass": 0.5 * max_weight,
        "outlier_capture": np.full_like(max_weight, NAN) if capture is None else np.asarray(capture, float),
        "row_mass": np.where(np.isfinite(max_weight), 1.0, NAN),
    }
    rows = np.full((len(levels), 2), 12, dtype=np.int64)
    return ProbeResult(name, [float(v) for v in levels], metrics, rows, extras or {}, note)


def skipped_probe() -> ProbeResult:
    empty = np.full((2, 2, 3), NAN)
    return probe_result("numeric", [1, 2], empty, empty, note=SKIP_NOTE)


def diagnose_result(probes, model="tiny<gpt>&co", scorer="softmax") -> DiagnoseResult:
    return DiagnoseResult(
        model=model,
        family="gpt2",
        scorer=scorer,
        route="ssacli",
        layers=["transformer.h.0.attn", "transformer.h.1.attn"],
        heads=[3, 3],
        probes=probes,
        settings={"inputs": ["builtin:probe-texts", "n=4"], "device": "cpu", "dtype": "float32", "tau": 0.9},
        versions={"ssacli": "test", "torch": "x"},
        elapsed_s=1.25,
    )


# embed-scale of A: collapse-rate model means 0.1, 0.3, 0.6 at levels 1, 2, 4 -> collapse point 4.
A_EMBED_COLLAPSE = [
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.6]],
    [[0.2, 0.2, 0.2], [0.4, 0.4, 0.4]],
    [[0.5, 0.5, 0.5], [0.6, 0.7, 0.8]],
]
A_EMBED_MAX = [
    [[0.2, 0.2, 0.2], [0.2, 0.2, 0.2]],
    [[0.4, 0.4, 0.4], [0.5, 0.5, 0.5]],
    [[0.55, 0.6, 0.65], [0.7, 0.8, 0.93]],  # the heatmap's layer 1, head 2 reads ".93"
]
# outlier: collapse-rate means 0, 0.1, 0.3 -> never collapses.
OUTLIER_COLLAPSE = [
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]],
    [[0.3, 0.3, 0.3], [0.3, 0.3, 0.3]],
]
OUTLIER_MAX = [
    [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]],
    [[0.2, 0.2, 0.2], [0.2, 0.2, 0.2]],
    [[0.3, 0.3, 0.3], [0.3, 0.3, 0.3]],
]
OUTLIER_CAPTURE = [
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    [[0.2, 0.2, 0.2], [0.2, 0.2, 0.2]],
    [[0.4, 0.4, 0.4], [0.4, 0.4, 0.4]],
]


def result_a() -> DiagnoseResult:
    embed = probe_result(
        "embed-scale", [1, 2, 4], A_EMBED_COLLAPSE, A_EMBED_MAX, extras={"loss": [3.0, 3.5, None]}
    )
    outlier = probe_result("outlier", [0, 10, 100], OUTLIER_COLLAPSE, OUTLIER_MAX, capture=OUTLIER_CAPTURE)
    return diagnose_result([embed, outlier, skipped_probe()])


def result_b() -> DiagnoseResult:
    """B sweeps embed-scale one level further (8) and misses one head's max weight on outlier."""
    collapse = [
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],  # mean 0     (A 0.1 -> Δ -0.1)
        [[0.1, 0.1, 0.1], [0.2, 0.2, 0.2]],  # mean 0.15  (A 0.3 -> Δ -0.15)
        [[0.3, 0.3, 0.3], [0.4, 0.4, 0.4]],  # mean 0.35  (A 0.6 -> Δ -0.25)
        [[0.5, 0.5, 0.5], [0.7, 0.7, 0.7]],  # mean 0.6   -> B collapses at 8
    ]
    peak = [
        [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]],
        [[0.3, 0.3, 0.3], [0.3, 0.3, 0.3]],
        [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]],
        [[0.7, 0.7, 0.7], [0.7, 0.7, 0.7]],
    ]
    outlier_max = [[[NAN, 0.4, 0.4], [0.4, 0.4, 0.4]], OUTLIER_MAX[1], OUTLIER_MAX[2]]  # mean 0.4 (5 heads)
    embed = probe_result("embed-scale", [1, 2, 4, 8], collapse, peak)
    outlier = probe_result("outlier", [0, 10, 100], OUTLIER_COLLAPSE, outlier_max, capture=OUTLIER_CAPTURE)
    return diagnose_result([embed, outlier, skipped_probe()], model="other", scorer="ssa")


def wide_result(model="m") -> DiagnoseResult:
    """Every column a probe table can have (capture, row mass, two extras) and long values."""
    probe = probe_result(
        "dominant-key",
        [0, 2, 4, 8, 16, 32],
        [[[0.0] * 3] * 2] * 6,
        [[[0.123456] * 3] * 2] * 6,
        capture=[[[0.000123] * 3] * 2] * 6,
        extras={"loss": [3.5] * 6, "error": [0.125] * 6},
    )
    probe.metrics["row_mass"] = np.full((6, 2, 3), 0.777)
    probe.layer_metrics["target_logit_rms"] = np.array([[1.0, 1.0]] + [[12.5, 14.0]] * 5)
    return diagnose_result([probe], model=model)
