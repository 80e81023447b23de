"""Regenerate docs/img/collapse.png, the README's figure (a few seconds on a CPU).

    python scripts/readme_figure.py [OUT.png]

Diagnoses the two bundled ICL models with the `logit-scale` and `dominant-key` probes at their
default levels and default settings (the same numbers as
`ssacli diagnose builtin:every-softmax --probe logit-scale --probe dominant-key --compare builtin:every-ssa`)
and plots the model-mean max weight and collapse rate against the level.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import ssacli  # noqa: E402

MODELS = {
    "softmax (every-softmax)": "builtin:every-softmax",
    "SSA (every-ssa)": "builtin:every-ssa",
}
COLORS = {"builtin:every-softmax": "#d62728", "builtin:every-ssa": "#1f77b4"}
PROBES = {
    "logit-scale": "every attention logit × α",
    "dominant-key": "one key's logit + M",
}
SYMBOL = {"logit-scale": "α", "dominant-key": "M"}


def measure() -> dict[str, dict[str, dict[str, list[float]]]]:
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for ref in MODELS.values():
        result = ssacli.diagnose(ref, probes=list(PROBES))
        out[ref] = {}
        for name in PROBES:
            probe = result.probe(name)
            out[ref][name] = {
                "levels": list(probe.levels),
                "max_weight": probe.model_mean("max_weight").tolist(),
                "collapse_rate": probe.model_mean("collapse_rate").tolist(),
            }
    return out


def plot(data, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5), dpi=100, sharey=True)
    for ax, (name, what) in zip(axes, PROBES.items()):
        for label, ref in MODELS.items():
            d = data[ref][name]
            xs = range(len(d["levels"]))
            ax.plot(xs, d["max_weight"], "-o", color=COLORS[ref], ms=4, label=f"{label}: max weight")
            ax.plot(
                xs, d["collapse_rate"], "--", color=COLORS[ref], alpha=0.7, label=f"{label}: collapse rate"
            )
        levels = data[next(iter(MODELS.values()))][name]["levels"]
        ax.set_xticks(range(len(levels)), [f"{v:g}" for v in levels])
        ax.set_xlabel(f"{SYMBOL[name]}  ({name}: {what})")
        ax.set_title(name, fontsize=10)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("model mean")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.86))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    path = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).resolve().parent.parent / "docs/img/collapse.png"
    )
    data = measure()
    for ref, probes in data.items():
        for name, d in probes.items():
            mw = ", ".join(f"{v:.3f}" for v in d["max_weight"])
            cr = ", ".join(f"{v:.3f}" for v in d["collapse_rate"])
            print(f"{ref} {name} levels {d['levels']}\n  max weight    {mw}\n  collapse rate {cr}")
    plot(data, path)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
