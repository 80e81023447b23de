"""The per-layer figures of a saved diagnose result that the terminal report summarizes in its
findings: the shift measured where each probe acts, per level (reached or absorbed), the sink rate, massive
activations and kurtosis per layer at the first level, and the length-fading slopes per layer.

    python scripts/diagnose_example_tables.py docs/examples/smollm2-diagnose.json

Used for docs/diagnose.md's worked examples; reads only the JSON (schema 2 or later), loads no model.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def fmt(value: float | None, spec: str = ".3g") -> str:
    return "–" if value is None or not math.isfinite(value) else format(value, spec)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="a diagnose --json file")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.result).read_text())
    print("shift measured where each probe acts (least over layers) at each level, and the verdict:")
    for probe in data["probes"]:
        reach = probe["summary"].get("reach")
        if reach is None:  # length and numeric change the text, not a magnitude: nothing to reach
            ratio = probe["summary"].get("logit_rms_ratio")
            if ratio is None:  # a file from before the reach rule
                continue
            print(f"  {probe['name']:<13} not a magnitude probe: nothing to reach")
            continue
        sign = "+" if reach["kind"] == "offset" else "×"
        worst = [min(row) for row in reach["shift"]]
        levels = ", ".join(f"{lv:g}: {sign}{fmt(w, '.2f')}" for lv, w in zip(probe["levels"], worst))
        where = "reached" if reach["reached"] else f"absorbed by {reach.get('absorbed_by')}"
        print(f"  {probe['name']:<13} ({reach['measure']}) {levels}  ({where})")
    first = data["probes"][0]
    sink = first["metrics"]["sink_rate"][0]  # [layer][head] at the first level
    layer = first["layer_metrics"]
    fading = next((p["summary"].get("fading") for p in data["probes"] if p["name"] == "length"), None)
    print(f"\nper layer at the first level of {first['name']} (sink rate: share of heads over ε = 0.3):")
    header = "layer  sink rate  top1 |h|  median |h|  top1/median  kurtosis"
    header += "  Δentropy/doubling  Δmax w/doubling" if fading else ""
    print(header)
    for i, heads in enumerate(sink):
        rate = sum(heads) / len(heads)
        row = (f"{i:>5}  {rate:>9.2f}  {fmt(layer['massive_top1'][0][i]):>8}  "
               f"{fmt(layer['hidden_median'][0][i]):>10}  {fmt(layer['massive_ratio'][0][i]):>11}  "
               f"{fmt(layer['kurtosis'][0][i]):>8}")  # fmt: skip
        if fading:
            row += (f"  {fmt(fading['entropy_layers'][i], '+.3f'):>17}  "
                    f"{fmt(fading['max_weight_layers'][i], '+.3f'):>15}")  # fmt: skip
        print(row)


if __name__ == "__main__":
    main()
