"""The tables of docs/results/convert-smollm2.md, from the study's files (runs/convert-smollm2).

    python studies/convert-smollm2/tables.py [RUNS] > tables.md
    python studies/convert-smollm2/tables.py [RUNS] --json docs/results/convert-smollm2.json

Reads the converted folders' ssacli.json (fidelity per layer), the fine-tuned folders' trajectories,
logs/walltimes.txt and the report-*.json files written by studies/convert-smollm2/run.sh; prints
markdown. Missing pieces (an arm still running) are skipped and said so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ssacli.diagnosis.result import DiagnoseResult

RUNS = Path(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "runs/convert-smollm2")
ARMS = [
    ("conv-faithful", "converted, faithful m=auto (no training)"),
    ("ft-faithful-anneal-all", "faithful, n annealed → 1.5, --train all"),
    ("ft-authors-all", "authors' preset, --train all"),
    ("ft-authors-scorer", "authors' preset, --train scorer"),
    ("ft-faithful-bn-anneal-scorer", "faithful (b learned), n annealed → 1.5, --train scorer"),
    ("ft-softmax-all", "softmax control, --train all"),
    ("conv-authors", "converted, authors' preset (no training)"),
]
PROBE_METRICS = ("collapse_rate", "entropy", "sink_mass")


def meta(name: str) -> dict:
    file = RUNS / name / "ssacli.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def fidelity_table() -> None:
    fid = meta("conv-faithful").get("fidelity") or {}
    if not fid:
        print("(conv-faithful not converted yet)\n")
        return
    print(f"Overall: KL {fid['kl_per_token']:.3g} nats/token, top-1 agreement "
          f"{fid['top1_agreement']:.2%} over {fid['tokens']} tokens (target {fid['target']['max']:g}, "
          f"met: {fid['target']['met']}; "
          f"{fid['m_auto']['evaluations']} end-to-end evaluations).\n")  # fmt: skip
    print("| layer | m | attention-row KL at m | largest \\|logit\\| | SSA shift of it (x − t(x)) |")
    print("|---:|---:|---:|---:|---:|")
    for row in fid["layers"]:
        print(f"| {row['layer']} | {row['m']:g} | {row['attention_kl']:.2e} | {row['max_abs_logit']:.1f} | "
              f"{row['shift_at_max']:.2f} |")  # fmt: skip
    print()


def walltimes() -> None:
    file = RUNS / "logs" / "walltimes.txt"
    if not file.is_file():
        return
    print("| step | wall time |")
    print("|---|---:|")
    for line in file.read_text().splitlines():
        name, _, rest = line.partition(" ")
        value = rest.split()[0] if rest else ""
        try:
            shown = f"{float(value):.0f} s ({float(value) / 60:.1f} min)"
        except ValueError:
            shown = rest
        print(f"| {name} | {shown}{' ' + ' '.join(rest.split()[2:]) if len(rest.split()) > 2 else ''} |")
    print()


def trajectories() -> None:
    for name, label in ARMS:
        training = meta(name).get("training") or {}
        records = training.get("trajectory") or []
        if not name.startswith("ft-"):
            continue
        if not records:
            print(f"**{label}** (`{name}`): not run yet.\n")
            continue
        config = training["config"]
        print(f"**{label}** (`{name}`): step {training['step']}/{training['steps']}, "
              f"{config['batch_size']} × {config['seq_len']} tokens per step, lr {config['lr']:g}, "
              f"{training['seconds']:.0f} s, {training['tokens_per_s']:.0f} tokens/s\n")  # fmt: skip
        head = "| step | train loss | held-out loss | KL to original | top-1 | n (mean; min–max) | b (mean) |"
        print(head)
        print("|---:|---:|---:|---:|---:|---|---:|")
        for r in records:
            n, b = r["scorer"].get("n"), r["scorer"].get("b")
            n_text = f"{sum(n) / len(n):.4g}; {min(n):.4g}–{max(n):.4g}" if n else "–"
            b_text = f"{sum(b) / len(b):.3g}" if b else "–"
            loss = "–" if r["loss"] is None else f"{r['loss']:.3f}"
            kl = r.get("kl_to_source")
            kl_text = "–" if kl is None else f"{kl:.3g}"
            print(f"| {r['step']} | {loss} | {r['heldout_loss']:.3f} | {kl_text} | "
                  f"{r.get('top1_agreement', float('nan')):.1%} | {n_text} | {b_text} |")  # fmt: skip
        print()


def reports() -> dict[str, dict]:
    found = {}
    for name, _ in ARMS:
        file = RUNS / f"report-{name}.json"
        if file.is_file():
            found[name] = json.loads(file.read_text())
    return found


def quality_table(found: dict[str, dict]) -> None:
    if not found:
        print("(no reports yet)\n")
        return
    names = list(found)
    first = found[names[0]]
    keys = [(r["key"], r["label"].strip(), r["better"]) for r in first["quality"]]
    print("| measure (better) | original | " + " | ".join(f"`{n}`" for n in names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for key, label, better in keys:
        cells = []
        for n in names:
            row = next((r for r in found[n]["quality"] if r["key"] == key), None)
            cells.append("–" if row is None or row["after"] is None else f"{row['after']:.4g}")
        row0 = next(r for r in first["quality"] if r["key"] == key)
        print(f"| {label} ({better}) | {row0['before']:.4g} | " + " | ".join(cells) + " |")
    print()


def probe_table(found: dict[str, dict]) -> None:
    if not found:
        return
    names = list(found)
    original = DiagnoseResult.from_dict(found[names[0]]["diagnose"]["a"])
    after = {n: DiagnoseResult.from_dict(found[n]["diagnose"]["b"]) for n in names}
    print(
        "Model mean over layers and heads at the probe's strongest level; collapse point = first level "
        "where the collapse rate reaches its threshold (none: never).\n"
    )
    print("| probe (level) | measure | original | " + " | ".join(f"`{n}`" for n in names) + " |")
    print("|---|---|---:|" + "---:|" * len(names))
    for probe in original.probes:
        if probe.skipped:
            continue
        level = len(probe.levels) - 1
        for metric in [m for m in PROBE_METRICS if m in probe.metrics]:
            cells = []
            for n in names:
                other = after[n].probe(probe.name)
                ok = other is not None and not other.skipped and metric in other.metrics
                cells.append(f"{float(other.model_mean(metric)[-1]):.3f}" if ok else "–")
            print(f"| {probe.name} ({probe.levels[level]:g}) | {metric} | "
                  f"{float(probe.model_mean(metric)[level]):.3f} | " + " | ".join(cells) + " |")  # fmt: skip
        points = []
        for n in names:
            other = after[n].probe(probe.name)
            points.append(str(other.collapse_point()) if other is not None and not other.skipped else "–")
        print(f"| {probe.name} | collapse point | {probe.collapse_point()} | " + " | ".join(points) + " |")
    print()


def compact(found: dict[str, dict]) -> dict:
    """The numbers behind the tables, small enough to commit: per arm its conversion fidelity,
    trajectory and training record, and per report the quality rows, findings, collapse points and
    each probe's model-mean metrics per level (BEFORE and AFTER)."""
    out: dict = {"walltimes": (RUNS / "logs" / "walltimes.txt").read_text().splitlines(), "arms": {}}
    for name, label in ARMS:
        m = meta(name)
        if not m:
            continue
        training = m.get("training") or {}
        arm = {"label": label, "scorer": m.get("scorer"), "fidelity": m.get("fidelity"),
               "training": {k: v for k, v in training.items() if k != "history"}}  # fmt: skip
        report = found.get(name)
        if report is not None:
            probes = {}
            for side, key in (("before", "a"), ("after", "b")):
                result = DiagnoseResult.from_dict(report["diagnose"][key])
                for probe in result.probes:
                    if probe.skipped:
                        continue
                    entry = probes.setdefault(probe.name, {"levels": list(probe.levels)})
                    entry[side] = {m: [round(float(v), 5) for v in probe.model_mean(m)] for m in PROBE_METRICS
                                   if m in probe.metrics}  # fmt: skip
                    entry[f"{side}_collapse_point"] = probe.collapse_point()
            arm["report"] = {"quality": report["quality"], "settings": report["settings"],
                             "findings": report["diagnose"]["findings"],
                             "before_findings": report["diagnose"]["a"]["findings"],
                             "after_findings": report["diagnose"]["b"]["findings"], "probes": probes,
                             "elapsed_s": report["elapsed_s"]}  # fmt: skip
        out["arms"][name] = arm
    return out


def main() -> None:
    if "--json" in sys.argv:
        target = Path(sys.argv[sys.argv.index("--json") + 1])
        target.write_text(json.dumps(compact(reports()), indent=1) + "\n")
        return
    print("## Fidelity of the conversion (per layer)\n")
    fidelity_table()
    print("## Wall times\n")
    walltimes()
    print("## Trajectories\n")
    trajectories()
    found = reports()
    print("## Quality (ssacli report; BEFORE = the original for every column)\n")
    quality_table(found)
    print("## Attention probes\n")
    probe_table(found)


if __name__ == "__main__":
    main()
