"""Section (d) of benchmarks/diagnose.py: the ``length`` probe up to the model's maximum positions.

For the bundled default model (``ssacli.defaults.DEFAULT_MODEL``) and for a random-init Llama whose
config allows long inputs (``--max-positions``), the length probe runs at m = 1, 2, 4, ... times
diagnose's base length and at the maximum itself, each level in a fresh process: the model is loaded,
the probe runs once at m = 1 as a warm-up (libraries, allocator and kernels set up), then the RSS is
read, the kernel's high-water mark reset and the probe run at level m (``_common.measure_peak``). The
figure is the peak RSS over the RSS before that call: what going to n tokens costs on top of the
loaded model. tracemalloc would miss it: torch allocates tensors outside Python's allocator.

The memory is fitted two ways: least squares peak = a + b·n (b: MB per 1,000 tokens) and the
log-log exponent p of peak ~ n^p, over every n, over n >= the block size and over the last step.
Diagnose scores ``block_size`` query rows (256) against every key at a time, so up to n = block size
one block is a whole [n, n] map per head and memory grows as n²; beyond it, as block × n. Linear
memory reads p -> 1 there; anything that materializes an [n, n] map per head reads p -> 2 (the
"[n, n] maps" column is that cost for every layer and head: layers × heads × n² × 4 bytes).
"""

from __future__ import annotations

import gc
import json
import math
import resource

import numpy as np
from _common import measure_peak, run_child, status_kb

GOAL_EXPONENT = 1.25  # the memory section's goal, read on the last doubling of n


def plan_levels(base: int, cap: int | None, longest: int | None) -> list[int]:
    """m = 1, 2, 4, ... while m · base fits ``cap`` (in the probe's units), then the cap itself.
    ``longest`` (tokens of the probe's unit) cuts the plan short for quick runs."""
    limit = min(x for x in (cap, longest) if x) if (cap or longest) else base
    levels, m = [], 1
    while base * m <= limit:
        levels.append(m)
        m *= 2
    if limit // base > levels[-1]:
        levels.append(limit // base)
    return levels


def describe(name: str, args, build) -> dict:
    """What the parent needs to plan a model's levels, without running anything heavy."""
    from ssacli import defaults

    loaded = load(name, args, build)
    if name == "bundled":
        model, kind, cap = loaded.attention_root, loaded.kind, loaded.max_positions
    else:
        model, kind, cap = loaded, "causal", args.max_positions
    icl = kind == "icl"
    config = model.config
    return {
        "label": defaults.DEFAULT_MODEL if name == "bundled" else "random-init Llama",
        "icl": icl,
        "base": defaults.ICL_POINTS if icl else defaults.PROBE_LENGTH,
        "cap": cap // 2 if icl and cap else cap,  # ICL inputs are points, two tokens each
        "positions": cap,
        "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads,
        "hidden": config.hidden_size,
    }


def load(name: str, args, build):
    """``bundled``: the default model through ssacli's loader; ``llama``: ``build`` (diagnose.py's
    random-init Llama) with ``--max-positions``."""
    import ssacli
    from ssacli import defaults

    if name == "bundled":
        return ssacli.load_model(defaults.DEFAULT_MODEL, device="cpu")
    if name == "llama":
        return build(args.heads, args.length_layers, "sdpa", args.max_positions)
    raise SystemExit(f"--length-models: unknown model {name!r}; use bundled and/or llama")


def child(args, build) -> None:
    """One measured length-probe call in this (fresh) process; prints a JSON line."""
    import ssacli

    model = load(args.length_model, args, build)

    def call(spec: str):
        return ssacli.diagnose(
            model, probes=[spec], random_ids=True, samples=args.length_samples,
            batch_size=args.length_batch, block_size=args.block_size, device="cpu",
        )  # fmt: skip

    spec = "length" if args.level == 0 else f"length:{args.level}"  # 0: every default level, one call
    call("length:1")  # warm-up at the smallest n
    gc.collect()
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # load + warm-up
    kept: dict = {}
    measured = measure_peak(lambda: kept.setdefault("result", call(spec)))
    probe = kept["result"].probe("length")
    tokens = [t for t in probe.extras.get("tokens", []) if t is not None]
    measured.update(
        tokens=max(tokens) if tokens else None,
        levels=[float(v) for v in probe.levels],
        note=probe.note,
        process_mb=max(before_mb, status_kb("VmHWM") / 1024),  # the whole process, model included
    )
    print(json.dumps(measured))


def measure(name: str, level: int, args) -> dict | None:
    arguments = [
        "--child", "length", "--length-model", name, "--level", str(level),
        "--heads", str(args.heads), "--length-layers", str(args.length_layers),
        "--block-size", str(args.block_size),
        "--max-positions", str(args.max_positions), "--length-samples", str(args.length_samples),
        "--length-batch", str(args.length_batch),
    ]  # fmt: skip
    return run_child(arguments, args.script, args.default_malloc, timeout=args.child_timeout)


def exponent(ns: list[float], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(n) (NaN with fewer than two positive values)."""
    x, y = np.asarray(ns, float), np.asarray(values, float)
    keep = y > 0
    if keep.sum() < 2:
        return math.nan
    return float(np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)[0])


def fit(ns: list[float], peaks: list[float], block: int) -> dict:
    """Straight line (slope in MB per 1,000 tokens, R²) and log-log exponents of peak against n:
    over every n, over n >= the block size (where a block no longer holds every row) and the last step."""
    x, y = np.asarray(ns, float), np.asarray(peaks, float)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    spread = ((y - y.mean()) ** 2).sum()
    long = [i for i, n in enumerate(ns) if n >= block]
    return {
        "slope": slope * 1000,
        "intercept": intercept,
        "r2": 1 - (residual**2).sum() / spread if spread > 0 else math.nan,
        "all": exponent(ns, peaks),
        "long": exponent([ns[i] for i in long], [peaks[i] for i in long]),
        "last": exponent(ns[-2:], peaks[-2:]),
    }


def model_section(name: str, args, build) -> dict | None:
    info = describe(name, args, build)
    unit = "points" if info["icl"] else "tokens"
    longest = args.length_longest // 2 if info["icl"] and args.length_longest else args.length_longest
    levels = plan_levels(info["base"], info["cap"], longest)
    print(
        f"\n{info['label']}: {info['layers']} layers × {info['heads']} heads, hidden {info['hidden']}, "
        f"maximum positions {info['positions']}; base {info['base']} {unit}, levels ×{levels}, "
        f"{args.length_samples} sample(s), batch {args.length_batch}, block {args.block_size}"
    )
    print(
        f"{'level':>6} {'n tokens':>9} {'wall s':>7} {'peak MB':>8} {'MB/1k tok':>10} "
        f"{'[n,n] maps MB':>14} {'process MB':>11}"
    )
    ns, peaks, seconds = [], [], []
    for level in levels:
        row = measure(name, level, args)
        if row is None or row["tokens"] is None:
            print(f"{level:>6} failed")
            continue
        n = row["tokens"]
        maps = info["layers"] * info["heads"] * n * n * 4 / 2**20
        print(
            f"{level:>6} {n:9.0f} {row['seconds']:7.2f} {row['peak_mb']:8.1f} "
            f"{row['peak_mb'] / n * 1000:10.2f} {maps:14.1f} {row['process_mb']:11.1f}"
        )
        if row["note"]:
            print(f"{'':>6} ({row['note']})")
        ns.append(n)
        peaks.append(row["peak_mb"])
        seconds.append(row["seconds"])
    if args.length_all:
        row = measure(name, 0, args)
        if row is not None:
            print(
                f"{'all':>6} {row['tokens']:9.0f} {row['seconds']:7.2f} {row['peak_mb']:8.1f}   "
                f"(the probe's default levels in one call: ×{[f'{v:g}' for v in row['levels']]})"
            )
    if len(ns) < 2:
        print("fit: fewer than two lengths measured")
        return None
    memory = fit(ns, peaks, args.block_size)
    long = [n for n in ns if n >= args.block_size]
    if len(long) < 2 or long[-1] < 2 * long[0]:  # one short step is within the measurement's noise
        spans = ", ".join(f"{n:.0f}" for n in long) or "no n"
        verdict = f"undecided: n ≥ block spans less than a doubling ({spans})"
    else:
        verdict = "linear" if memory["long"] <= GOAL_EXPONENT else "NOT linear"
    print(
        f"memory vs n: {memory['slope']:.2f} MB per 1,000 tokens {memory['intercept']:+.1f} MB "
        f"(straight line, R² {memory['r2']:.4f}); log-log exponent {memory['all']:.2f} over n "
        f"{ns[0]:.0f}–{ns[-1]:.0f}, {memory['long']:.2f} over n ≥ block {args.block_size}, "
        f"{memory['last']:.2f} over the last step ({ns[-2]:.0f}–{ns[-1]:.0f}) -> {verdict} "
        f"(goal ≤ {GOAL_EXPONENT:g} for n ≥ block; [n,n] maps read 2)"
    )
    print(
        f"time vs n: log-log exponent {exponent(ns, seconds):.2f} over every n, "
        f"{exponent(ns[-2:], seconds[-2:]):.2f} over the last step (the attention work is quadratic in n)"
    )
    return memory


def length_section(args, build) -> None:
    allocator = "glibc defaults" if args.default_malloc else "MALLOC_MMAP_THRESHOLD_=131072"
    print(
        "\n(d) the length probe up to the maximum positions: each level in a fresh process, peak RSS "
        "over the RSS\nright before the call (VmHWM after resetting it; model loaded and the probe "
        f"run once at ×1 first); {allocator}"
    )
    for name in args.length_models.split(","):
        model_section(name.strip(), args, build)
