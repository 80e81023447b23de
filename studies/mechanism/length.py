"""The mechanism under a length shift (docs/results/mechanism.md, Part A).

    python studies/mechanism/length.py --runs runs/convert-tradeoff --record docs/results/convert-tradeoff \
        --data ../shared/data/wikitext2/test.txt --out docs/results/mechanism

For every model of the conversion trade-off study (RUNS/runs/ARM-sSEED/model, and the original)
``ssacli.diagnose`` runs the length probe at 1, 2, 4 × the fine-tuning context on held-out
prompts, with the position cap lifted to 4 × (a RoPE model has no position table; diagnose caps at
the config's maximum by default). The failure at each level is the model's own
log(ppl at L / ppl at 1×) from the study's records (RECORD/runs/*.json), the same tokens for every
model. Then:

* the association, at each level, across models (arms × seeds): Spearman's ρ of a saturation
  measure against the failure, 95 % bootstrap interval resampling seeds (a seed's arms together);
* intervention 1, SSA's n: per arm, paired by seed against the softmax control, Δ collapse at 4×
  and Δ failure at 4×;
* intervention 2, a temperature on the collapsing heads only: each control model, its HEADS heads
  with the highest collapse rate at 4× set to softmax(x / T), measured again at 1× and 4×: the
  difference in differences Δ log ppl(4×) − Δ log ppl(1×), paired over seeds.

Per-model diagnoses are cached in RUNS/runs/NAME/mechanism.json (a rerun skips them); OUT gets
length.json (everything), tables.md and length.png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from mechanism_common import association as seed_association
from mechanism_common import interval, load, soften_heads

from ssacli.files import write_json
from ssacli.stats import paired_summary


def _load_tradeoff_runner():
    """The conversion trade-off study's runner (studies/convert-tradeoff/run.py), loaded by path: its
    perplexity is the one this study's failure measure must match (the same windows, the same tokens)."""
    path = Path(__file__).resolve().parents[1] / "convert-tradeoff" / "run.py"
    spec = importlib.util.spec_from_file_location("convert_tradeoff_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


perplexity = _load_tradeoff_runner().perplexity

LEVELS = (1, 2, 4)
MEASURES = ("collapse_rate", "max_weight", "sink_mass", "entropy")
PPL_KEYS = {1: "heldout_ppl", 2: "ppl_2x", 4: "ppl_4x"}
CONTROL = "control"
HEADS = 4  # heads softened per control model (of 16)
TEMPERATURE = 2.0


def saturation(loaded, text: str, seq: int, samples: int) -> dict[str, Any]:
    """Model means per level of each measure, per-head collapse and max weight, and fading."""
    import ssacli

    loaded.max_positions = max(LEVELS) * seq  # RoPE: no table; the study's levels go past the config
    result = ssacli.diagnose(loaded, [f"length:{','.join(map(str, LEVELS))}"], text=text, samples=samples,
                             length=seq, seed=0)  # fmt: skip
    probe = result.probes[0]
    tokens = probe.extras.get("tokens")
    out: dict[str, Any] = {"levels": list(probe.levels), "tokens": tokens}
    for name in MEASURES:
        out[name] = [float(x) for x in probe.model_mean(name)]
    for name in ("collapse_rate", "max_weight"):
        out[f"{name}_heads"] = np.asarray(probe.metrics[name]).tolist()  # [level, layer, head]
    fading = probe.fading()
    slopes = None if fading is None else np.asarray(fading["entropy"], float)
    out["fading_entropy"] = None if slopes is None else float(np.nanmean(slopes))
    return out


def measure_models(runs: Path, record: Path, data: str, seq: int, samples: int, model0: str) -> list[dict]:
    from ssacli.train.data import TextData

    rows = []
    for file in sorted((record / "runs").glob("*.json")):
        result = json.loads(file.read_text())
        name = f"{result['arm']}-s{result['seed']}"
        if result["arm"] == "original" and result["seed"] != 0:
            continue
        folder = runs / "runs" / name
        cache = folder / "mechanism.json"
        if cache.is_file():
            sat = json.loads(cache.read_text())
        else:
            loaded = load(model0 if result["arm"] == "original" else str(folder / "model"))
            sat = saturation(loaded, TextData.load(data, loaded.tokenizer).heldout_text, seq, samples)
            write_json(sat, cache)
            print(f"{name}: collapse " + ", ".join(f"{c:.4f}" for c in sat["collapse_rate"]), flush=True)
        failure = {lv: math.log(result[PPL_KEYS[lv]] / result["heldout_ppl"]) for lv in LEVELS}
        rows.append({"arm": result["arm"], "seed": result["seed"], "saturation": sat, "failure": failure,
                     "ppl": {lv: result[PPL_KEYS[lv]] for lv in LEVELS}})  # fmt: skip
    return rows


def association(rows: list[dict], measure, level: int) -> dict[str, Any]:
    """Spearman ρ across the rows of (measure at level, failure at level); seeds resampled."""
    points: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        points.setdefault(r["seed"], []).append((measure(r, level), r["failure"][level]))
    return seed_association(points)


def measure_at(name: str):
    index = LEVELS.index
    if name == "delta_collapse":
        return lambda r, lv: r["saturation"]["collapse_rate"][index(lv)] - r["saturation"]["collapse_rate"][0]
    return lambda r, lv: r["saturation"][name][index(lv)]


def temperature_intervention(runs: Path, rows: list[dict], data: str, seq: int, samples: int, tokens: int):
    from ssacli.train.data import TextData

    out = []
    for r in [r for r in rows if r["arm"] == CONTROL]:
        folder = runs / "runs" / f"{CONTROL}-s{r['seed']}"
        cache = folder / "mechanism-temperature.json"
        if cache.is_file():
            out.append(json.loads(cache.read_text()))
            continue
        heads4 = np.asarray(r["saturation"]["collapse_rate_heads"][LEVELS.index(4)])
        weight4 = np.asarray(r["saturation"]["max_weight_heads"][LEVELS.index(4)])
        order = sorted(np.ndindex(heads4.shape), key=lambda i: (-heads4[i], -weight4[i]))[:HEADS]
        heads = [(int(a), int(b)) for a, b in order]
        loaded = load(str(folder / "model"))
        held = TextData.load(data, loaded.tokenizer).heldout_stream[:tokens]
        before = {f"{lv}x": perplexity(loaded, held, lv * seq) for lv in (1, 4)}
        soften_heads(loaded.model, heads, TEMPERATURE)
        after = {f"{lv}x": perplexity(loaded, held, lv * seq) for lv in (1, 4)}
        sat = saturation(loaded, TextData.load(data, loaded.tokenizer).heldout_text, seq, samples)
        entry = {
            "seed": r["seed"], "heads": heads, "ppl_before": before, "ppl_after": after,
            "collapse_before": r["saturation"]["collapse_rate"], "collapse_after": sat["collapse_rate"],
            "heads_collapse_before": [float(heads4[h]) for h in order],
            "heads_collapse_after": [float(np.asarray(sat["collapse_rate_heads"][-1])[h]) for h in order],
        }  # fmt: skip
        write_json(entry, cache)
        print(f"temperature {CONTROL}-s{r['seed']}: ppl 1x {before['1x']:.3f}->{after['1x']:.3f}, "
              f"4x {before['4x']:.3f}->{after['4x']:.3f}", flush=True)  # fmt: skip
        out.append(json.loads(cache.read_text()))
    return out


def _ci(summary: dict[str, Any]) -> str:
    if summary.get("ci_low") is None:  # one seed (the SmolLM2 models): the point, no interval
        return f"{summary['mean_difference']:+.4f} (1 seed: no interval)"
    return f"{summary['mean_difference']:+.4f} [{summary['ci_low']:+.4f}, {summary['ci_high']:+.4f}]"


def tables(summary: dict[str, Any]) -> str:
    """The page's tables, from length.json's numbers."""
    out = [
        "# Mechanism, Part A: tables", "",
        "Generated by `python studies/mechanism/length.py` (docs/results/mechanism.md).", "",
        f"## Association across the {summary['models']} trained models, within each level", "",
        "Spearman ρ of the measure at the level against the failure at the level (log ppl ratio "
        "to 1×), 95 % bootstrap over seeds.", "", "| measure | 2× | 4× |", "|---|---|---|",
    ]  # fmt: skip
    for name in (*MEASURES, "delta_collapse"):
        cells = [interval(summary["associations"][f"{name}@{lv}x"]) for lv in (2, 4)]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "## Within each arm, across its seeds (collapse at 4× vs failure at 4×)", "",
            "| arm | models | ρ [95 % CI] |", "|---|---:|---|"]  # fmt: skip
    for arm, row in summary["within_arm"].items():
        out.append(f"| {arm} | {row['models']} | {interval(row)} |")
    out += ["", "## Intervention 1: each arm against the softmax control, paired by seed", "",
            "| arm | seeds | Δ collapse at 4× [95 % CI] | Δ failure at 4× [95 % CI] |",
            "|---|---:|---|---|"]  # fmt: skip
    for arm, row in summary["n_intervention"].items():
        if row["collapse_4x"]["seeds"]:
            seeds = len(row["collapse_4x"]["seeds"])
            out.append(f"| {arm} | {seeds} | {_ci(row['collapse_4x'])} | {_ci(row['failure_4x'])} |")
    temp = summary["temperature"]
    title = f"## Intervention 2: T = {temp['t']:g} on the {temp['heads']} most collapsed heads per control"
    out += ["", title, "", "| seed | heads | collapse 4× | ppl 1× | ppl 4× |", "|---:|---|---|---|---|"]
    for e in temp["runs"]:
        heads = ", ".join(f"L{a}H{b}" for a, b in e["heads"])
        cells = [f"{e['collapse_before'][-1]:.4f} → {e['collapse_after'][-1]:.4f}"] + [
            f"{e['ppl_before'][k]:.3f} → {e['ppl_after'][k]:.3f}" for k in ("1x", "4x")
        ]
        out.append(f"| {e['seed']} | {heads} | " + " | ".join(cells) + " |")
    did = temp["did"]
    if did["seeds"]:
        out += ["", f"Difference in differences, Δ log ppl(4×) − Δ log ppl(1×): {_ci(did)}, higher on "
                f"{did['b_higher']} of {len(did['seeds'])} seeds.", ""]  # fmt: skip
    return "\n".join(out) + "\n"


def figure(rows: list[dict], softened: list[dict], path: Path) -> None:
    """Left, centre: per model, collapse rate and entropy at 4x against the failure at 4x (one colour
    per arm). Right: the temperature intervention, per seed, the change of log ppl at 1x and at 4x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    arms = sorted({r["arm"] for r in rows})
    colours = plt.get_cmap("tab10")
    at4 = LEVELS.index(4)
    for index, arm in enumerate(arms):
        mine = [r for r in rows if r["arm"] == arm]
        fail = [100 * r["failure"][4] for r in mine]
        for ax, name in zip(axes[:2], ("collapse_rate", "entropy")):
            ax.scatter([r["saturation"][name][at4] for r in mine], fail, s=14, color=colours(index % 10),
                       label=arm)  # fmt: skip
    for ax, name in zip(
        axes[:2], ("collapse rate at 4x (rows with max weight >= 0.9)", "normalized entropy at 4x")
    ):
        ax.set_xlabel(name, size=8)
        ax.set_ylabel("failure at 4x: log(ppl 4x / ppl 1x), %", size=8)
    axes[0].legend(fontsize=6, ncol=2)
    axes[0].set_title("collapse vs length failure, per model", size=9)
    axes[1].set_title("entropy vs length failure, per model", size=9)
    for e in softened:
        one, four = (100 * math.log(e["ppl_after"][k] / e["ppl_before"][k]) for k in ("1x", "4x"))
        axes[2].plot([1, 4], [one, four], "o-", color="grey", lw=0.8)
    axes[2].set_xticks([1, 4])
    axes[2].set_xlabel("context (x the fine-tuning length)", size=8)
    axes[2].set_ylabel("change of log ppl when softened, %", size=8)
    axes[2].set_title(f"T = {TEMPERATURE:g} on the {HEADS} most collapsed heads (controls)", size=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", required=True, help="the trade-off study's --out")
    parser.add_argument("--record", required=True, help="the trade-off study's --record")
    parser.add_argument("--data", required=True, help="the trade-off study's --data (held-out prompts)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="builtin:wikitext-softmax", help="the original")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16384)
    args = parser.parse_args()
    runs, record, out = Path(args.runs), Path(args.record), Path(args.out)
    rows = measure_models(runs, record, args.data, args.seq_len, args.samples, args.model)
    trained = [r for r in rows if r["arm"] != "original"]
    associations = {
        f"{name}@{lv}x": association(trained, measure_at(name), lv)
        for lv in (2, 4)
        for name in (*MEASURES, "delta_collapse")
    }
    within_arm = {
        arm: association([r for r in trained if r["arm"] == arm], measure_at("collapse_rate"), 4)
        for arm in sorted({r["arm"] for r in trained})
    }
    control = {r["seed"]: r for r in trained if r["arm"] == CONTROL}
    n_arms = {}
    for arm in sorted({r["arm"] for r in trained} - {CONTROL}):
        mine = {r["seed"]: r for r in trained if r["arm"] == arm}
        n_arms[arm] = {
            "collapse_4x": paired_summary({s: control[s]["saturation"]["collapse_rate"][2] for s in control},
                                          {s: mine[s]["saturation"]["collapse_rate"][2] for s in mine}),
            "failure_4x": paired_summary({s: control[s]["failure"][4] for s in control},
                                         {s: mine[s]["failure"][4] for s in mine}),
        }  # fmt: skip
    softened = temperature_intervention(runs, rows, args.data, args.seq_len, args.samples, args.tokens)

    def change(e: dict, level: str) -> float:
        return math.log(e["ppl_after"][level] / e["ppl_before"][level])

    did = {e["seed"]: change(e, "4x") - change(e, "1x") for e in softened}
    zero = {s: 0.0 for s in did}
    summary = {
        "plan": vars(args), "levels": LEVELS, "models": len(trained),
        "primary": associations["collapse_rate@4x"], "associations": associations, "within_arm": within_arm,
        "n_intervention": n_arms, "temperature": {"heads": HEADS, "t": TEMPERATURE, "runs": softened,
                                                  "did": paired_summary(zero, did)},
        "rows": rows,
    }  # fmt: skip
    write_json(summary, out / "length.json")
    figure(trained, softened, out / "length.png")
    (out / "length-tables.md").write_text(tables(summary))
    print(json.dumps({"primary": summary["primary"], "did": summary["temperature"]["did"]}, indent=1))


if __name__ == "__main__":
    main()
