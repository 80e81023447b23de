"""Tables and figures of the conversion-recipe study (docs/results/convert-recipe.md).

    python studies/convert-recipe/tables.py docs/results/convert-recipe/results.json \
        --smollm2 docs/results/convert-recipe/smollm2.json --out docs/results/convert-recipe

Reads what studies/convert-recipe/run.py wrote and writes ``tables.md`` (per-seed numbers, the
paired comparisons of the recipe against every other arm: differences, bootstrap interval,
sign-flip and t-test p, Holm over the family) and ``stages.png`` (n, KL to the original and held-out
perplexity at every evaluation of every run, transfer then distillation on one step axis).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ssacli.stats import holm, paired_summary, verdict  # noqa: E402
from ssacli.train.recipe import recipe_trajectory  # noqa: E402

REFERENCE = "recipe"
COLORS = {"recipe": "C0", "tied": "C1", "no-transfer": "C2", "anneal-finetune": "C3"}
METRICS = {  # name: (label, where in a run)
    "kl": ("held-out KL to the original", lambda r: (r.get("recipe") or {}).get("final", {}).get("kl")),
    "heldout_ppl": ("held-out ppl (training text's last tenth)", lambda r: _heldout_ppl(r)),
    "id": ("test ppl (WikiText-2 test)", lambda r: r["ppl"]["id"]),
    "ood": ("OOD ppl (tinyshakespeare)", lambda r: r["ppl"]["ood"]),
}


def _heldout_ppl(run: dict) -> float | None:
    if "recipe" in run:
        return run["recipe"]["final"]["heldout_ppl"]
    return math.exp(run["training"]["heldout"][-1][1])


def split(key: str) -> tuple[str, int]:
    arm, _, seed = key.rpartition("-s")
    return arm, int(seed)


def by_arm(runs: dict) -> dict[str, dict[int, dict]]:
    arms: dict[str, dict[int, dict]] = {}
    for key, run in runs.items():
        arm, seed = split(key)
        arms.setdefault(arm, {})[seed] = run
    return arms


def stage_seconds(run: dict) -> str:
    if "recipe" in run:
        s = run["recipe"]["seconds"]
        return f"{s.get('transfer', 0):.0f} + {s.get('distill', 0):.0f}"
    return f"{run['training']['seconds']:.0f} (fine-tune)"


def per_seed_table(results: dict) -> list[str]:
    rows = [
        "| arm | seed | final n (max) | KL | held-out ppl | test ppl | OOD ppl "
        "| seconds (transfer + distill) | total s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    original = results["original"]
    rows.append(f"| original (softmax) | – | – | 0 | – | {original['id']:.2f} | {original['ood']:.1f} | – | – |")  # noqa: E501
    for arm, seeds in by_arm(results["runs"]).items():
        for seed, run in sorted(seeds.items()):
            if "recipe" in run:
                final = run["recipe"]["final"]
                n, kl = f"{final['n_max']:g}", f"{final['kl']:.4f}" + ("" if final["met_max_kl"] else " (missed)")  # noqa: E501
            else:
                n, kl = f"{max(run['training']['scorer']['values']['n']):g}", "–"
            rows.append(
                f"| {arm} | {seed} | {n} | {kl} | {_heldout_ppl(run):.2f} | {run['ppl']['id']:.2f} | "
                f"{run['ppl']['ood']:.1f} | {stage_seconds(run)} | {run['seconds']:.0f} |"
            )
    return rows


def paired_tables(results: dict) -> tuple[list[str], dict]:
    arms = by_arm(results["runs"])
    reference = arms[REFERENCE]
    family, summaries = [], {}
    for arm in arms:
        if arm == REFERENCE:
            continue
        for metric, (_, get) in METRICS.items():
            a = {s: get(r) for s, r in arms[arm].items() if get(r) is not None}
            b = {s: get(r) for s, r in reference.items() if get(r) is not None}
            if len(set(a) & set(b)) == 0:
                continue
            summary = paired_summary(a, b)
            summaries[(arm, metric)] = summary
            family.append((arm, metric))
    adjusted = holm([summaries[k]["permutation_p"] for k in family])
    rows = [
        f"| {REFERENCE} − arm | metric | per-seed differences | mean [95 % bootstrap] | sign-flip p | "
        "t-test p | Holm p | recipe lower | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, p in zip(family, adjusted):
        s = summaries[key]
        diffs = ", ".join(f"{d:+.4g}" for d in s["differences"])
        t = "–" if s["t_test_p"] is None else f"{s['t_test_p']:.3g}"
        rows.append(
            f"| {key[0]} | {METRICS[key[1]][0]} | {diffs} | {s['mean_difference']:+.4g} "
            f"[{s['ci_low']:+.4g}, {s['ci_high']:+.4g}] | {s['permutation_p']:.3g} | {t} | {p:.3g} | "
            f"{s['b_lower']}/{len(s['differences'])} | {verdict(s, p=p)} |"
        )
    return rows, {f"{a}/{m}": s for (a, m), s in summaries.items()}


def smollm2_table(results: dict) -> list[str]:
    original = results["original"]
    rows = ["| model | n (max) | held-out KL | held-out ppl | test ppl | OOD ppl | seconds (transfer + distill) |",  # noqa: E501
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    rows.append(f"| SmolLM2-135M-Instruct (softmax) | – | 0 | "
                f"{next(iter(results['runs'].values()))['recipe']['final']['original_ppl']:.2f} | "
                f"{original['id']:.2f} | {original['ood']:.2f} | – |")  # fmt: skip
    for key, run in results["runs"].items():
        final = run["recipe"]["final"]
        budget = run["recipe"]["config"]["max_kl"]
        kl = f"{final['kl']:.4f}" + ("" if final["met_max_kl"] else f" (missed {budget})")
        rows.append(
            f"| {key} | {final['n_max']:g} | {kl} | {final['heldout_ppl']:.2f} | {run['ppl']['id']:.2f} | "
            f"{run['ppl']['ood']:.2f} | {stage_seconds(run)} |"
        )
    return rows


def mean_n(entry: dict) -> float:
    return sum(entry["scorer"]["n"]) / len(entry["scorer"]["n"])


def figure(results: dict, smollm2: dict | None, path: Path) -> None:
    panels = [("n", "n (mean over layers)"), ("kl_to_source", "KL to the original (held out)"),
              ("heldout_ppl", "held-out ppl")]  # fmt: skip
    sources = [("builtin:wikitext-softmax", results)] + ([("SmolLM2-135M", smollm2)] if smollm2 else [])
    fig, axes = plt.subplots(len(sources), 3, figsize=(13, 3.6 * len(sources)), squeeze=False)
    for row, (title, data) in enumerate(sources):
        for key, run in data["runs"].items():
            arm, seed = split(key)
            if "recipe" not in run:
                continue
            points = recipe_trajectory(run["recipe"])  # one step axis: transfer, then distillation
            x = [e["step"] for e in points]
            for col, (metric, label) in enumerate(panels):
                y = [mean_n(e) if metric == "n" else e[metric] for e in points]
                axes[row][col].plot(x, y, color=COLORS.get(arm, "k"), alpha=0.8, lw=1.2,
                                    label=arm if seed == 0 else None)  # fmt: skip
                axes[row][col].set_title(f"{title}: {label}", fontsize=9)
                axes[row][col].set_xlabel("step (transfer, then distillation)", fontsize=8)
        axes[row][0].set_yscale("log")
        axes[row][1].set_yscale("log")
        axes[row][1].axhline(0.05, color="grey", ls=":", lw=1)
        original = next(iter(data["runs"].values()))["recipe"]["final"]["original_ppl"]
        axes[row][2].axhline(original, color="k", ls="--", lw=1, label="original")
        axes[row][2].axhline(1.05 * original, color="grey", ls=":", lw=1, label="original + 5 %")
        axes[row][2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--smollm2")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = json.loads(Path(args.results).read_text())
    smollm2 = json.loads(Path(args.smollm2).read_text()) if args.smollm2 else None
    out = Path(args.out)
    paired, summaries = paired_tables(results)
    lines = ["# Conversion-recipe study: tables", "",
             f"Regenerate: `python studies/convert-recipe/tables.py {args.results}"
             + (f" --smollm2 {args.smollm2}" if args.smollm2 else "") + f" --out {args.out}`.", "",
             "## builtin:wikitext-softmax, per seed", "", *per_seed_table(results), "",
             f"## Paired: {REFERENCE} against every other arm (lower is better for every metric)", "",
             *paired, ""]  # fmt: skip
    if smollm2:
        lines += ["## SmolLM2-135M-Instruct", "", *smollm2_table(smollm2), ""]
    (out / "tables.md").write_text("\n".join(lines))
    (out / "paired.json").write_text(json.dumps(summaries, indent=1))
    figure(results, smollm2, out / "stages.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
