"""Tables, figure and the decision of the conversion trade-off study (docs/results/convert-tradeoff.md).

    python studies/convert-tradeoff/tables.py docs/results/convert-tradeoff

Reads RECORD/runs/*.json (studies/convert-tradeoff/run.py writes one per finished run) and writes
RECORD/tables.md, RECORD/paired.json and RECORD/tradeoff.png. Every arm is compared with the
softmax control on the seeds both finished: perplexities as ratios (the paired mean of log ratios
and its 95 % bootstrap interval, exponentiated), the output KL under key-scale sigma = 8 as a
relative change (the mean of per-seed differences over the control's mean, with its interval).
The decision rule is the page's, fixed before the runs.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ssacli.quality.tradeoff import MAX_RATIO, MIN_KL_DROP, apply_rule  # the rule's one owner
from ssacli.stats import paired_summary

ARMS = ("original", "control", "faithful", "n8", "n4", "n2", "n4-no-transfer", "n4-learned",
        "n4-kl", "n4-lm4", "control-lm4")  # fmt: skip
N_ARMS = ("faithful", "n8", "n4", "n2", "n4-no-transfer", "n4-learned")  # judged by the n rule
OBJECTIVES = (("n4-kl", "n4"), ("n4-lm4", "n4"), ("control-lm4", "control"))  # (arm, its lm_weight-1 twin)
PAIRS = "pairs_accuracy"  # the general measure (BLiMP minimal pairs), compared in points
RATIOS = (("heldout_ppl", "held-out ppl"), ("ood_ppl", "out-of-domain ppl"), ("ppl_2x", "ppl at 2x context"),
          ("ppl_4x", "ppl at 4x context"))  # fmt: skip
KL = "output_kl_key8"


def load(record: Path) -> dict[str, dict[int, dict[str, Any]]]:
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for file in sorted((record / "runs").glob("*.json")):
        result = json.loads(file.read_text())
        runs.setdefault(result["arm"], {})[result["seed"]] = result
    return runs


def ratio(control: dict[int, dict], arm: dict[int, dict], metric: str) -> dict[str, Any] | None:
    a = {s: math.log(r[metric]) for s, r in control.items() if r.get(metric)}
    b = {s: math.log(r[metric]) for s, r in arm.items() if r.get(metric)}
    summary = paired_summary(a, b)
    if not summary["seeds"]:
        return None
    low, high = summary["ci_low"], summary["ci_high"]
    return {
        "seeds": summary["seeds"],
        "ratio": math.exp(summary["mean_difference"]),
        "low": None if low is None else math.exp(low),
        "high": None if high is None else math.exp(high),
        "per_seed": [math.exp(d) for d in summary["differences"]],
    }


def relative_change(control: dict[int, dict], arm: dict[int, dict], metric: str) -> dict[str, Any] | None:
    a = {s: r[metric] for s, r in control.items() if r.get(metric) is not None}
    b = {s: r[metric] for s, r in arm.items() if r.get(metric) is not None}
    summary = paired_summary(a, b)
    if not summary["seeds"]:
        return None
    base = sum(summary["a"]) / len(summary["a"])
    scale = lambda v: None if v is None else v / base  # noqa: E731
    return {
        "seeds": summary["seeds"],
        "change": scale(summary["mean_difference"]),
        "low": scale(summary["ci_low"]),
        "high": scale(summary["ci_high"]),
        "arm_mean": sum(summary["b"]) / len(summary["b"]),
        "control_mean": base,
    }


def points(reference: dict[int, dict], arm: dict[int, dict], metric: str) -> dict[str, Any] | None:
    """arm − reference of an accuracy, in percentage points, paired by seed."""
    a = {s: 100 * r[metric] for s, r in reference.items() if r.get(metric) is not None}
    b = {s: 100 * r[metric] for s, r in arm.items() if r.get(metric) is not None}
    summary = paired_summary(a, b)
    if not summary["seeds"]:
        return None
    return {"seeds": summary["seeds"], "change": summary["mean_difference"], "low": summary["ci_low"],
            "high": summary["ci_high"]}  # fmt: skip


def compared(reference: dict[int, dict], arm: dict[int, dict]) -> dict[str, Any]:
    row = {metric: ratio(reference, arm, metric) for metric, _ in RATIOS}
    row[KL] = relative_change(reference, arm, KL)
    row[PAIRS] = points(reference, arm, PAIRS)
    return row


def paired(runs: dict[str, dict[int, dict]]) -> dict[str, dict[str, Any]]:
    control = runs.get("control", {})
    return {arm: compared(control, runs[arm]) for arm in ARMS if arm != "control" and arm in runs}


def objective(runs: dict[str, dict[int, dict]], seeds_needed: int) -> dict[str, Any]:
    """The objective rule: lm_weight w replaces 1 only if n4 at w beats n4 at 1 on held-out, OOD or
    minimal pairs (interval excluding no difference) and is worse on none."""
    rows, verdicts = {}, {}
    for arm, twin in OBJECTIVES:
        if arm not in runs or twin not in runs:
            continue
        row = compared(runs[twin], runs[arm])
        rows[arm] = row
        if twin != "n4":
            continue
        tests = [(row.get("heldout_ppl"), True), (row.get("ood_ppl"), True), (row.get(PAIRS), False)]
        if any(t is None or len(t["seeds"]) < seeds_needed or t.get("high") is None for t, _ in tests):
            verdicts[arm] = "undecided (seeds missing)"
            continue
        # lower is better for perplexity ratios (bounds vs 1), higher for accuracy points (vs 0)
        better = [(t["high"] < 1) if ppl else (t["low"] > 0) for t, ppl in tests]
        worse = [(t["low"] > 1) if ppl else (t["high"] < 0) for t, ppl in tests]
        verdicts[arm] = (
            "better: replace lm_weight 1" if any(better) and not any(worse) else "keep lm_weight 1"
        )
    return {"rows": rows, "verdicts": verdicts}


def decide(runs, rows: dict[str, dict[str, Any]], seeds_needed: int) -> dict[str, Any]:
    """The page's rule (:func:`ssacli.quality.tradeoff.apply_rule`: (a) output KL lower with the
    interval below zero and by >= 25 % on average; (b) the held-out ppl ratio's upper bound <= 1.05)
    on each n arm against the control. Undecided while an arm has fewer seeds."""
    verdicts = {}
    for arm, row in rows.items():
        if arm not in N_ARMS:
            continue
        kl, held = row.get(KL), row.get("heldout_ppl")
        if not kl or not held or len(kl["seeds"]) < seeds_needed:
            verdicts[arm] = "undecided (seeds missing)"
            continue
        if held["high"] is None or kl["high"] is None:  # the rule reads intervals: one seed has none
            verdicts[arm] = f"undecided (no interval from {len(kl['seeds'])} seed)"
            continue
        quality = {"value": held["ratio"], "low": held["low"], "high": held["high"]}
        robustness = {"value": kl["change"], "low": kl["low"], "high": kl["high"]}
        verdicts[arm] = apply_rule(quality, robustness)["verdict"]
    recommended = [a for a, v in verdicts.items() if v == "recommended"]
    best = min(recommended, key=lambda a: rows[a][KL]["change"]) if recommended else None
    # the transfer stage is kept only if n4 beats n4-no-transfer on held-out ppl (interval below 1)
    transfer = None
    if "n4" in runs and "n4-no-transfer" in runs:
        versus = ratio(runs["n4-no-transfer"], runs["n4"], "heldout_ppl")
        if versus is not None:
            enough = len(versus["seeds"]) >= seeds_needed and versus["high"] is not None
            keep = "keep it" if enough and versus["high"] < 1 else ("delete it" if enough else "undecided")
            transfer = {**versus, "decision": keep}
    return {"verdicts": verdicts, "recommended": best, "transfer": transfer}


def _fmt(row: dict[str, Any] | None, key: str) -> str:
    if row is None:
        return "–"
    if row.get("low") is None:
        return f"{row[key]:.3f}"
    return f"{row[key]:.3f} [{row['low']:.3f}, {row['high']:.3f}]"


def _pts(row: dict[str, Any] | None) -> str:
    if row is None:
        return "–"
    if row.get("low") is None:
        return f"{row['change']:+.1f}"
    return f"{row['change']:+.1f} [{row['low']:+.1f}, {row['high']:+.1f}]"


def _pct(row: dict[str, Any] | None) -> str:
    if row is None:
        return "–"
    if row.get("low") is None:
        return f"{100 * row['change']:+.0f} %"
    return f"{100 * row['change']:+.0f} % [{100 * row['low']:+.0f}, {100 * row['high']:+.0f}]"


def means(runs: dict[str, dict[int, dict]]) -> list[str]:
    metrics = [m for m, _ in RATIOS] + [KL, "collapse_key8", PAIRS]
    lines = ["| arm | seeds | " + " | ".join(metrics) + " |", "|---|---:|" + "---:|" * len(metrics)]
    for arm in ARMS:
        if arm not in runs:
            continue
        cells = []
        for metric in metrics:
            values = [r[metric] for r in runs[arm].values() if r.get(metric) is not None]
            if not values:
                cells.append("–")
                continue
            mean = sum(values) / len(values)
            std = (
                math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0
            )
            cells.append(f"{mean:.4g} ± {std:.2g}" if len(values) > 1 else f"{mean:.4g}")  # one seed: no std
        lines.append(f"| {arm} | {len(runs[arm])} | " + " | ".join(cells) + " |")
    return lines


def tables(runs, rows, decision, objectives, command: str) -> str:
    out = ["# Conversion trade-off: tables", "",
           f"Generated by `python studies/convert-tradeoff/tables.py {command}` from runs/*.json "
           "(no interval where fewer than two seeds are paired).", "",
           "## Per arm: mean ± std over seeds", "", *means(runs), "",
           "## Against the softmax control, paired by seed (95 % bootstrap intervals)", "",
           "| arm | seeds | held-out ppl ratio | out-of-domain ratio | 2x context ratio | 4x context ratio "
           "| output KL at key-scale 8 | minimal pairs (points) | verdict |",
           "|---|---:|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm, row in rows.items():
        seeds = len((row.get("heldout_ppl") or {}).get("seeds", []))
        cells = [_fmt(row.get(m), "ratio") for m, _ in RATIOS] + [_pct(row.get(KL)), _pts(row.get(PAIRS))]
        out.append(f"| {arm} | {seeds} | " + " | ".join(cells) + f" | {decision['verdicts'].get(arm, '')} |")
    out += ["", f"Recommended n (the rule of the page): {decision['recommended'] or 'none'}", ""]
    transfer = decision.get("transfer")
    if transfer:
        out += [f"Transfer stage: n4 / n4-no-transfer held-out ppl ratio {_fmt(transfer, 'ratio')} over "
                f"{len(transfer['seeds'])} seeds: {transfer['decision']}.", ""]  # fmt: skip
    if objectives["rows"]:
        out += ["## The objective: each arm against its lm_weight-1 twin, paired by seed", "",
                "| arm | against | held-out ppl ratio | out-of-domain ratio | minimal pairs (points) "
                "| verdict |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for arm, twin in OBJECTIVES:
            row = objectives["rows"].get(arm)
            if row is None:
                continue
            cells = [
                _fmt(row.get("heldout_ppl"), "ratio"),
                _fmt(row.get("ood_ppl"), "ratio"),
                _pts(row.get(PAIRS)),
            ]
            verdict = objectives["verdicts"].get(arm, "")
            out.append(f"| {arm} | {twin} | " + " | ".join(cells) + f" | {verdict} |")
        out.append("")
    return "\n".join(out)


def figure(rows: dict[str, dict[str, Any]], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for arm, row in rows.items():
        held, kl = row.get("heldout_ppl"), row.get(KL)
        if arm not in (*N_ARMS, "original") or not held or not kl:
            continue
        x, y = held["ratio"], 100 * kl["change"]
        xerr = None if held["low"] is None else [[x - held["low"]], [held["high"] - x]]
        yerr = None if kl["low"] is None else [[y - 100 * kl["low"]], [100 * kl["high"] - y]]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", capsize=3, label=arm)
        ax.annotate(arm, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.axvline(MAX_RATIO, color="tab:red", lw=0.8, ls="--")
    ax.axhline(-100 * MIN_KL_DROP, color="tab:red", lw=0.8, ls="--")
    ax.set_xlabel("held-out perplexity / softmax control's (paired, 95 % CI)")
    ax.set_ylabel("output KL at key-scale σ=8 vs control (%)")
    ax.set_title(f"Quality cost vs robustness gain, per arm ({model})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("record", type=Path)
    parser.add_argument("--seeds-needed", type=int, default=8)
    parser.add_argument("--title", default="bundled WikiText LM", help="the model, in the figure's title")
    args = parser.parse_args()
    runs = load(args.record)
    rows = paired(runs)
    decision = decide(runs, rows, args.seeds_needed)
    objectives = objective(runs, args.seeds_needed)
    command = str(args.record)  # the arguments that differ from their defaults, as the user gave them
    if args.seeds_needed != parser.get_default("seeds_needed"):
        command += f" --seeds-needed {args.seeds_needed}"
    if args.title != parser.get_default("title"):
        command += f" --title {args.title}"
    text = tables(runs, rows, decision, objectives, command)
    (args.record / "tables.md").write_text(text)
    (args.record / "paired.json").write_text(
        json.dumps({"paired": rows, "decision": decision, "objective": objectives}, indent=2) + "\n"
    )
    figure(rows, args.record / "tradeoff.png", args.title)
    print(text)


if __name__ == "__main__":
    main()
