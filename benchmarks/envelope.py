"""The resource envelope of ``ssacli diagnose`` for 1B / 7B / 70B decoders, extrapolated from per-layer
costs measured on real checkpoints by benchmarks/real_model.py (its ``layers`` section). Prints the
markdown table of docs/performance.md ("Real checkpoints"). Not part of the test suite.

    python benchmarks/envelope.py RECORD.json [RECORD.json ...] [--levels LEVELS.json]

Each RECORD is real_model.py's JSON with ``load`` (the model's shape) and ``layers`` (one model, one
dtype); docs/results/real-models/ holds the ones docs/performance.md was made from. The time model,
fitted on each measured model (one estimate per record), in CPU core-seconds of one probe level of B
sequences × L tokens:

    layers × (a · P_layer · B·L  +  b · heads · L² · B)  +  c · vocab · hidden · B·L

a: a decoder layer's plain forward per parameter and token (the matrix products); b: what diagnose's
statistics add per head and query-key pair (the diagnose layer minus the plain layer); c: the rest of
the call (embedding, the LM head over the vocabulary, the loss, tabulation) per vocabulary entry,
hidden unit and token. Weights are arithmetic (parameters × bytes). The working set above the weights
is the measured one scaled by B·L·vocab (the LM head's float32 logits, the largest tensor of a level
on a large vocabulary), from --levels (real_model.py's ``levels`` record). Every target row is an
extrapolation; nothing here was run on a GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GIB = 2**30

# The targets' shapes, from their published config.json files (the 7B's also from its GGUF header,
# read for issue 55: qwen2, 28 blocks, 3584 wide, 18944 feed-forward, 28 heads over 4 KV heads).
TARGETS = {
    "1B (Llama-3.2-1B)": {
        "layers": 16, "hidden": 2048, "ffn": 8192, "heads": 32, "kv_heads": 8, "head_dim": 64,
        "vocab": 128256, "tied": True, "bias": False,
    },
    "7B (DeepSeek-R1-Distill-Qwen-7B)": {
        "layers": 28, "hidden": 3584, "ffn": 18944, "heads": 28, "kv_heads": 4, "head_dim": 128,
        "vocab": 152064, "tied": False, "bias": True,
    },
    "70B (Llama-3-70B)": {
        "layers": 80, "hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8, "head_dim": 128,
        "vocab": 128256, "tied": False, "bias": False,
    },
}  # fmt: skip


def layer_parameters(s: dict) -> int:
    """A gated-MLP decoder block: q, k, v, o projections, gate/up/down, two norms (biases on q, k, v)."""
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    attention = s["hidden"] * (q + 2 * kv) + q * s["hidden"] + ((q + 2 * kv) if s["bias"] else 0)
    return attention + 3 * s["hidden"] * s["ffn"] + 2 * s["hidden"]


def parameters(s: dict) -> int:
    embeddings = s["vocab"] * s["hidden"] * (1 if s["tied"] else 2)
    return s["layers"] * layer_parameters(s) + embeddings + s["hidden"]


def coefficients(record: dict) -> dict:
    shape, layers = record["load"]["shape"], record["layers"]
    tokens, length, batch = layers["tokens"], layers["length"], layers["batch"]
    n, p = shape["layers"], layers["layer_parameters"]
    plain, diag = layers["plain"], layers["diagnose"]
    return {
        "a": plain["layers_cpu_s"] / (n * p * tokens),
        "b": max(0.0, diag["layers_cpu_s"] - plain["layers_cpu_s"])
        / (n * shape["heads"] * length**2 * batch),
        "c": (diag["call_cpu_s"] - diag["layers_cpu_s"]) / (shape["vocab"] * shape["hidden"] * tokens),
    }


def level_cpu_s(k: dict, s: dict, batch: int, length: int) -> float:
    tokens = batch * length
    per_layer = k["a"] * layer_parameters(s) * tokens + k["b"] * s["heads"] * length**2 * batch
    return s["layers"] * per_layer + k["c"] * s["vocab"] * s["hidden"] * tokens


def working_set_per_logit(levels: dict) -> float:
    """Bytes above the loaded weights per float32 logit, at the base-length levels of a levels record."""
    vocab, settings = levels["load"]["shape"]["vocab"], levels["settings"]
    batch, length = settings["batch_size"], settings["length"]
    base = [v["over_loaded_mb"] for k, v in levels["levels"]["levels"].items() if not k.startswith("length")]
    return max(base) * 2**20 / (batch * length * vocab * 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("records", nargs="+")
    parser.add_argument("--levels", default=None, help="real_model.py's levels record (the working set)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()
    records = [json.loads(Path(r).read_text()) for r in args.records]
    fits = {Path(r["model"]).name + f" ({r['load']['dtype']})": coefficients(r) for r in records}
    for name, k in fits.items():
        print(f"{name}: a {k['a']:.3g} core-s/(param·token), b {k['b']:.3g} core-s/(head·L²·B), "
              f"c {k['c']:.3g} core-s/(vocab·hidden·token)")  # fmt: skip
    per_logit = None
    if args.levels:
        per_logit = working_set_per_logit(json.loads(Path(args.levels).read_text()))
        print(f"working set above the weights: {per_logit:.2f} × the level's float32 logits")
    b, n = args.batch, args.length
    names = list(fits)
    print(f"\n| model | parameters | weights fp32 / bf16 GiB | working set GiB ({b} × {n} tokens) | "
          + " | ".join(f"one level, core-s, from {name}" for name in names) + " |")  # fmt: skip
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    for name, s in TARGETS.items():
        params = parameters(s)
        work = f"{per_logit * b * n * s['vocab'] * 4 / GIB:.2f}" if per_logit else "–"
        times = " | ".join(f"{level_cpu_s(k, s, b, n):,.0f}" for k in fits.values())
        print(f"| {name} | {params / 1e9:.2f} B | {params * 4 / GIB:.1f} / {params * 2 / GIB:.1f} | {work} "
              f"| {times} |")  # fmt: skip


if __name__ == "__main__":
    main()
