"""The mechanism where the σ-shift reaches attention: the attention-only ICL backbone
(docs/results/mechanism.md, Part B; the design there was committed before the runs).

    ssacli icl sweep --plan docs/results/mechanism/plan-icl-quant.json --out runs/icl-mech-quant --jobs 2
    ssacli icl sweep --plan docs/results/mechanism/plan-icl-linear.json --out runs/icl-mech-linear --jobs 2
    python studies/mechanism/icl.py --sweep docs/results/mechanism/plan-icl-quant.json runs/icl-mech-quant \
        --sweep docs/results/mechanism/plan-icl-linear.json runs/icl-mech-linear --out docs/results/mechanism

For every trained run of the sweeps (SWEEP/runs/NAME/eval.json and its checkpoint beside it):

1. ``ssacli.diagnose`` on SAMPLES prompts of the model's task under the shifts the sweep measured
   the error at (embed-scale at the σ levels, outlier at 1 and the planted values, length ×1, ×2,
   ×4): model-mean saturation per level, per-head collapse, diagnose's collapse point and, for the
   magnitude probes, whether the shift reached attention (a model it did not reach is excluded
   from that shift's associations);
2. the failure at each level: the error there minus the model's own baseline error;
3. softmax models only: each head alone softened (T = HEAD_T), and the HEADS heads whose collapse
   rises most from σ = 1 to σ = SIGMA softened together at each T in TEMPERATURES, the error
   measured again at σ = 1 and σ = SIGMA on the sweep's own evaluation prompts.

Per-run measurements are cached in SWEEP/runs/NAME/mechanism.json (a rerun skips them). The
analysis (associations, interventions, verdict counts) is in ``icl_analysis.py``; this file writes
OUT/icl.json, OUT/icl-tables.md and OUT/icl.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from mechanism_common import level_key, load, soften_heads

from ssacli.files import write_json

SIGMA = 8.0  # the fixed shift of the primary endpoint and the interventions
SAMPLES = 32  # diagnose's prompts per level
LENGTH_LEVELS = (1, 2, 4)  # diagnose's length levels: 41, 82, 164 points (the plan's lengths)
MEASURES = ("collapse_rate", "max_weight", "entropy")
HEADS = 4  # heads softened together per softmax model (of 12)
TEMPERATURES = (2.0, 8.0, 64.0)
DECISIVE_T = 8.0
HEAD_T = 8.0  # each head alone, for the across-heads association


def headline(cell: dict) -> float:
    """The task's error: MSE / Var(y) for linear, the error rate otherwise (the sweep's headline)."""
    return cell["normalized_error"] if cell.get("normalized_error") is not None else cell["error"]


def failures(run: dict, plan: dict) -> dict[str, Any]:
    """{shift: {level: error at the level − the baseline error}} with levels as diagnose names them
    (σ; the outlier's value; the length's multiple of the trained length), and the baseline error."""
    trained = plan["points_end"]
    cells = [c for c in run["cells"] if c.get("coef_sigma", 1.0) == 1.0]
    base = next(c for c in cells if c["sigma"] == 1 and c["length"] == trained and c["outlier"] is None)
    base_error = headline(base)
    out: dict[str, Any] = {"baseline_error": base_error, "embed-scale": {}, "length": {}, "outlier": {}}
    for c in cells:
        if c["outlier"] is not None:
            after = c["after_outlier"] if c.get("after_outlier") is not None else headline(c)
            out["outlier"][level_key(c["outlier"])] = after - base_error
        elif c["length"] == trained:
            out["embed-scale"][level_key(c["sigma"])] = headline(c) - base_error
        elif c["sigma"] == 1 and c["length"] % trained == 0:
            out["length"][level_key(c["length"] // trained)] = headline(c) - base_error
    return out


def probe_summary(probe) -> dict[str, Any]:
    """What the analysis reads from one probe of a diagnose result (all JSON-ready)."""
    share = probe.reach_share()
    out = {
        "levels": [float(v) for v in probe.levels],
        "reached": probe.reached(),
        "absorbed_by": probe.absorbed_by(),
        "reach_share": None
        if share is None
        else [None if not np.isfinite(v).any() else float(np.nanmean(v)) for v in share],
        "collapse_point": probe.collapse_point(),
        "collapse_status": probe.collapse_status(),
        "collapse_rate_heads": np.asarray(probe.metrics["collapse_rate"]).tolist(),  # [level, layer, head]
        "max_weight_heads": np.asarray(probe.metrics["max_weight"]).tolist(),
    }
    for name in MEASURES + (("outlier_capture",) if probe.name == "outlier" else ()):
        out[name] = [float(x) for x in probe.model_mean(name)]
    return out


def diagnose_saturation(loaded, plan: dict, probes: list[str] | None = None) -> dict[str, Any]:
    import ssacli

    if probes is None:
        probes = [
            f"embed-scale:{','.join(f'{s:g}' for s in plan['sigmas'])}",
            f"outlier:1,{','.join(f'{v:g}' for v in plan['outliers'])}",
            f"length:{','.join(map(str, LENGTH_LEVELS))}",
        ]
    result = ssacli.diagnose(loaded, probes, samples=SAMPLES, seed=0)
    return {probe.name: probe_summary(probe) for probe in result.probes}


def errors_at(model, plan: dict, sigmas: tuple[float, ...]) -> list[float]:
    """The task error at each σ (trained length), on the sweep's own evaluation prompts."""
    from ssacli.icl.evaluate import evaluate

    cells = evaluate(model, sigmas=sigmas, lengths=(plan["points_end"],), prompts=plan["prompts"])
    return [headline({"error": c.error, "normalized_error": c.normalized_error}) for c in cells]


def head_rises(sat: dict[str, Any]) -> np.ndarray:
    """[layer, head]: collapse at σ = SIGMA minus at σ = 1 (embed-scale)."""
    probe = sat["embed-scale"]
    heads = np.asarray(probe["collapse_rate_heads"])
    return heads[probe["levels"].index(SIGMA)] - heads[0]


def interventions(folder: Path, plan: dict, sat: dict[str, Any]) -> dict[str, Any]:
    """Softmax models: each head alone at HEAD_T, then the HEADS most-rising heads at each T."""
    loaded = load(folder)
    backbone = loaded.model.backbone  # attention lives in the GPT-2 backbone (ssacli.models.icl)
    before = errors_at(loaded.model, plan, (1.0, SIGMA))
    rise = head_rises(sat)
    weight = np.asarray(sat["embed-scale"]["max_weight_heads"])
    weight_rise = weight[sat["embed-scale"]["levels"].index(SIGMA)] - weight[0]
    per_head = []
    for layer, head in np.ndindex(rise.shape):
        soften_heads(backbone, [(layer, head)], HEAD_T)
        after = errors_at(loaded.model, plan, (1.0, SIGMA))
        per_head.append(
            {
                "head": [layer, head],
                "rise": float(rise[layer, head]),
                "errors": after,
                "did": (after[1] - before[1]) - (after[0] - before[0]),
            }
        )
    order = sorted(np.ndindex(rise.shape), key=lambda i: (-rise[i], -weight_rise[i]))[:HEADS]
    chosen = [(int(a), int(b)) for a, b in order]
    softened = {}
    for t in TEMPERATURES:
        soften_heads(backbone, chosen, t)
        after = errors_at(loaded.model, plan, (1.0, SIGMA))
        collapse = diagnose_saturation(loaded, plan, [f"embed-scale:1,{SIGMA:g}"])["embed-scale"]
        softened[f"{t:g}"] = {
            "errors": after,
            "did": (after[1] - before[1]) - (after[0] - before[0]),
            "collapse": collapse["collapse_rate"],
            "heads_collapse": [float(np.asarray(collapse["collapse_rate_heads"])[-1][h]) for h in order],
        }
    return {"errors": before, "per_head": per_head, "heads": chosen, "softened": softened}


def measure_run(folder: Path, plan: dict) -> dict[str, Any]:
    """One run's record for the analysis, cached in its folder."""
    cache = folder / "mechanism.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    run = json.loads((folder / "eval.json").read_text())
    sat = diagnose_saturation(load(folder), plan)
    record = {
        "task": run["task"],
        "arm": run["label"],
        "seed": run["seed"],
        "scorer": run.get("spec"),
        "failure": failures(run, plan),
        "saturation": sat,
    }
    if run["label"] == plan["reference"]:
        record["intervention"] = interventions(folder, plan, sat)
    write_json(record, cache)
    return record


def measure_sweeps(sweeps: list[tuple[str, str]]) -> list[dict]:
    """Every evaluated run of each (plan, sweep folder); a sweep still running gives its finished runs."""
    records = []
    for plan_file, sweep in sweeps:
        plan = json.loads(Path(plan_file).read_text())
        for folder in sorted((Path(sweep) / "runs").iterdir()):
            if (folder / "eval.json").is_file():
                record = measure_run(folder, plan)
                records.append(record)
                collapse = record["saturation"]["embed-scale"]["collapse_rate"][plan["sigmas"].index(SIGMA)]
                print(
                    f"{folder.name}: collapse at σ={SIGMA:g} {collapse:.3f}, "
                    f"failure {record['failure']['embed-scale'][level_key(SIGMA)]:+.3f}",
                    flush=True,
                )
    return records


def main() -> None:
    from icl_analysis import analyse, figure, tables

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sweep",
        nargs=2,
        action="append",
        required=True,
        metavar=("PLAN", "FOLDER"),
        help="a sweep's plan and its --out folder (repeat for several)",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    records = measure_sweeps(args.sweep)
    summary = analyse(records)
    out = Path(args.out)
    write_json({"sweeps": args.sweep, **summary, "records": records}, out / "icl.json")
    (out / "icl-tables.md").write_text(tables(summary))
    figure(records, summary, out / "icl.png")
    print(json.dumps(summary["primary"], indent=1))


if __name__ == "__main__":
    main()
