"""The tables of docs/results/saturation-matters.md from the study's JSON records (run.py: one
``PROBE.json`` per probe; secondary.py: ``natural-CORPUS.json`` and ``per-prompt-PROBE.json``).
Prints Markdown; every number is read from the records, none typed by hand.

    python studies/saturation-matters/tables.py docs/results/saturation-matters
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import PROBES  # noqa: E402

from ssacli.diagnosis.attribution_result import READINGS  # noqa: E402
from ssacli.stats import bootstrap_ci  # noqa: E402


def ci(interval, spec=".3f", scale=1.0) -> str:
    if interval is None:
        return "(no interval)"
    low, high = (scale * v for v in interval)
    return f"[{low:+{spec}}, {high:+{spec}}]"


def rho_text(rho) -> str:
    return "—" if rho is None else f"{rho['rho']:+.2f} {ci(rho['interval'], '.2f')}"


def names(heads) -> str:
    return " ".join(f"L{layer}H{head}" for layer, head in heads)


def primary(folder: Path) -> list[str]:
    out = [
        "| probe, level | damage (nats/token) | set (chosen on → measured on) | removed | share | "
        "beats null (null: median [5 %, 95 %]) | reading | heads alone, summed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for probe in PROBES:
        path = folder / f"{probe.split(':')[0]}.json"
        if not path.exists():
            out.append(f"| {probe} | not run yet | | | | | | |")
            continue
        r = json.loads(path.read_text())
        mean = sum(r["damage"]) / len(r["damage"])
        head = f"{r['probe']} at {r['level']:g}"
        damage = f"{mean:+.4f} {ci(r['damage_interval'], '.4f')}"
        for one in [*r["sets"], r["ceiling"]]:
            if one is None:
                continue
            if one is r["ceiling"]:
                label = f"every head ({len(one['heads'])}), {len(one['measured_on'])} prompts"
            else:
                label = (f"{names(one['heads'])} ({len(one['chosen_on'])} → "
                         f"{len(one['measured_on'])})")  # fmt: skip
            share = "—" if one["share"] is None else f"{one['share']:.0%}"
            beats = "—" if one["percentile"] is None else f"{one['percentile']:.0f}% of {len(one['null'])}"
            if one["null"]:  # what random sets remove: the null's median and its central 90 %
                low, mid, high = np.percentile(one["null"], [5, 50, 95])
                beats += f" (null {mid:+.2f} [{low:+.2f}, {high:+.2f}])"
            reading = "—" if one["reading"] is None else READINGS[one["reading"]]
            parts = "—" if not one["per_head"] else f"{sum(one['per_head'].values()):+.4f}"
            removed = f"{one['mean']:+.4f} {ci(one['interval'], '.4f')}"
            cells = [head, damage, label, removed, share, beats, reading, parts]
            out.append("| " + " | ".join(cells) + " |")
            head = damage = ""
    return out


def cross_fitted(folder: Path) -> list[str]:
    """Not in the plan (added after the two halves disagreed, and labelled so on the page): every
    prompt measured with the set chosen on the other half, pooled over both halves, with a bootstrap
    interval over the prompts (:func:`ssacli.stats.bootstrap_ci`, 10,000 resamples, seed 0) and the
    share of the whole damage; no null percentile (each half drew its own random sets)."""
    out = ["| probe, level | prompts | damage removed, cross-fitted (nats/token) | share of the damage | "
           "same heads chosen on both halves |", "|---|---|---|---|---|"]  # fmt: skip
    for probe in PROBES:
        path = folder / f"{probe.split(':')[0]}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        removed = [v for one in r["sets"] for v in one["removed"]]
        mean, damage = sum(removed) / len(removed), sum(r["damage"]) / len(r["damage"])
        same = sorted(map(tuple, r["sets"][0]["heads"])) == sorted(map(tuple, r["sets"][1]["heads"]))
        out.append(f"| {r['probe']} at {r['level']:g} | {len(removed)} | {mean:+.4f} "
                   f"{ci(bootstrap_ci(removed, resamples=10_000, seed=0), '.4f')} | {mean / damage:.0%} | "
                   f"{'yes' if same else 'no'} |")  # fmt: skip
    return out


def per_head(folder: Path) -> list[str]:
    out = ["| probe | set | each head alone (damage removed, nats/token) |", "|---|---|---|"]
    for probe in PROBES:
        path = folder / f"{probe.split(':')[0]}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        for index, one in enumerate(r["sets"]):
            alone = ", ".join(f"{h} {v:+.4f}" for h, v in one["per_head"].items())
            out.append(f"| {r['probe']} at {r['level']:g} | {'A → B' if index == 0 else 'B → A'} | {alone} |")
    return out


def association(folder: Path) -> list[str]:
    out = [
        "| shift | documents | output damage (nats/token) | fresh collapse change (points) | "
        "Spearman ρ, collapse vs damage, per document |",
        "|---|---|---|---|---|",
    ]
    for path in sorted(folder.glob("natural-*.json")):
        r = json.loads(path.read_text())
        s = r["summary"]
        loss, collapse, rho = s["loss"], s["collapse"], s["association"]
        out.append(
            f"| {r['corpus']} (natural; damage mixes difficulty) | {s['documents']} | "
            f"{loss['mean_change']:+.3f} {ci(loss['interval'])} | "
            f"{100 * collapse['mean_change']:+.2f} {ci(collapse['interval'], '.2f', 100)} | "
            f"{rho_text(rho)} |"
        )
    for probe in PROBES:
        path = folder / f"per-prompt-{probe.split(':')[0]}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        n = len(r["damage"])
        damage = sum(r["damage"]) / n
        change = [b - a for a, b in zip(r["collapse_reference"], r["collapse_shifted"], strict=True)]
        rho = r["association"]
        out.append(
            f"| {r['probe']} (same tokens) | {n} | {damage:+.4f} | {100 * sum(change) / n:+.2f} | "
            f"{rho_text(rho)} |"
        )
    return out


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs/results/saturation-matters")
    print("### Attribution: the top heads by collapse rise against the random layer-matched null\n")
    print("\n".join(primary(folder)))
    print("\n### Cross-fitted over both halves (post hoc, not in the plan)\n")
    print("\n".join(cross_fitted(folder)))
    print("\n### Each head of the chosen sets alone\n")
    print("\n".join(per_head(folder)))
    print("\n### Saturation against damage, per document\n")
    print("\n".join(association(folder)))


if __name__ == "__main__":
    main()
