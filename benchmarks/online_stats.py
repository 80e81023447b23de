"""diagnose's fused statistics (``stats="fused"``) against its eager statistics and an SDPA forward of
the same batch, in time and peak memory, measured side by side in one run (issue 24). Not a test.

    python benchmarks/online_stats.py [--lengths 1024,4096] [--repeats 3] [--memory-lengths 1024,4096]
    python benchmarks/online_stats.py --sections split --lengths 1024,4096 --repeats 7

Model: the benchmark Llama of benchmarks/diagnose.py (4 layers, 8 heads × 32, hidden 256, random
init, fp32, CPU). One probe level (``embed-scale:1``) over one sequence of random tokens (batch 1),
with the fused pass in its three forms, each forced by SSACLI_BACKEND: the native one-loop kernel
(ssacli.kernels.native.stats_flash, the default on the CPU for plain softmax calls), the native row
pass between torch's matmuls per block (``native-blocks``, the path of calls with a mask tensor or a
probe on the logits) and torch ops (``torch-blocks``, the path where nothing native is built), each
candidate once per round, rounds interleaved; best of the rounds and × the SDPA forward of the
round's best. Peak memory: each (mode, length) in a fresh process (benchmarks/_common.py), MB above
the loaded model. The machine and its load are printed; on a shared machine read the ratios.
``--sections split``: SDPA, the default diagnose and the same without the sink and position metrics'
terms, per round, with each round's ratios (median and spread): what those terms cost.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics

import torch
from _common import interleaved_best, interleaved_times, measure_peak, run_child
from diagnose import build_model

from ssacli.kernels import routing

PROBE = "embed-scale:1"
GOAL_TIME = 1.5  # fused diagnose of one probe level <= 1.5 × the SDPA forward at 4,096 tokens
GOAL_MEMORY = 2.0  # peak over the loaded model <= 2 × the SDPA forward's at 8,192 tokens


def diagnose_call(model, length: int, stats: str, block_size: int):
    import ssacli

    return ssacli.diagnose(
        model, probes=[PROBE], random_ids=True, samples=1, length=length, batch_size=1,
        block_size=block_size, stats=stats,
    )  # fmt: skip


def forward_call(model, length: int):
    ids = torch.randint(3, 1000, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)


def on_backend(backend: str, call):
    """call() with SSACLI_BACKEND=backend (the fused statistics' path), the variable restored after."""

    def run():
        before = os.environ.get(routing.ENVIRONMENT)
        os.environ[routing.ENVIRONMENT] = backend
        try:
            return call()
        finally:
            if before is None:
                del os.environ[routing.ENVIRONMENT]
            else:
                os.environ[routing.ENVIRONMENT] = before

    return run


def candidates(model, length: int, block_size: int) -> dict:
    return {
        "sdpa forward": lambda: forward_call(model, length),
        "diagnose, eager stats": lambda: diagnose_call(model, length, "eager", block_size),
        "diagnose, fused stats, torch ops": on_backend(
            "torch-blocks", lambda: diagnose_call(model, length, "fused", block_size)
        ),
        "diagnose, fused stats, native row pass in the block loop": on_backend(
            "native-blocks", lambda: diagnose_call(model, length, "fused", block_size)
        ),
        "diagnose, fused stats": lambda: diagnose_call(model, length, "fused", block_size),
    }


def time_section(args) -> None:
    model = build_model(args.heads, args.layers, "sdpa")
    print(
        "| tokens | sdpa ms | eager stats ms | fused, torch ops ms | fused, native row pass ms "
        "| fused, native one loop ms | eager × sdpa | torch ops × sdpa | row pass × sdpa "
        "| **one loop × sdpa** | eager / one loop |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in [int(x) for x in args.lengths.split(",")]:
        best = interleaved_best(candidates(model, length, args.block_size), args.repeats)
        sdpa, eager, plain, rows, fused = (best[k] * 1e3 for k in best)
        print(
            f"| {length} | {sdpa:.0f} | {eager:.0f} | {plain:.0f} | {rows:.0f} | {fused:.0f} "
            f"| {eager / sdpa:.2f} | {plain / sdpa:.2f} | {rows / sdpa:.2f} | **{fused / sdpa:.2f}** "
            f"| {eager / fused:.2f} |",
            flush=True,
        )
    print(f"goal: fused ≤ {GOAL_TIME:g}× sdpa at 4096 tokens (see the 4096 row)")


def without_positions(call):
    """call() with the sink and position metrics' bins off (diagnosis.run.run_bins gives None: no
    position terms in the statistics, no position sums after), what they cost by difference."""
    import ssacli.diagnosis.run as run

    def off():
        real = run.run_bins
        run.run_bins = lambda *args, **kwargs: None
        try:
            return call()
        finally:
            run.run_bins = real

    return off


def split_row(model, length: int, args) -> str:
    """One length's row of split_section."""
    calls = {
        "sdpa": lambda: forward_call(model, length),
        "diagnose": lambda: diagnose_call(model, length, "fused", args.block_size),
        "without": without_positions(lambda: diagnose_call(model, length, "fused", args.block_size)),
    }
    ms = {name: [t * 1e3 for t in times] for name, times in interleaved_times(calls, args.repeats).items()}
    spread = {}
    for name in ("diagnose", "without"):
        r = [a / b for a, b in zip(ms[name], ms["sdpa"], strict=True)]
        spread[name] = f"{statistics.median(r):.2f} ({min(r):.2f}–{max(r):.2f})"
    gap = statistics.median(a - b for a, b in zip(ms["diagnose"], ms["without"], strict=True))
    cells = [length, args.repeats, f"{min(ms['sdpa']):.0f}", f"{min(ms['diagnose']):.0f}",
             f"**{spread['diagnose']}**", f"{min(ms['without']):.0f}", spread["without"], f"{gap:.0f}",
             f"{os.getloadavg()[0]:.2f}"]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


def split_section(args) -> None:
    """SDPA's forward, diagnose's default path, and the same without the position terms, each once
    per round in interleaved rounds: per round each diagnose over that round's SDPA; median (min-max)."""
    model = build_model(args.heads, args.layers, "sdpa")
    print("| tokens | rounds | sdpa ms (best) | diagnose ms (best) | **diagnose × sdpa** "
          "| without the position terms ms (best) | without × sdpa | position terms ms | load |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in [int(x) for x in args.lengths.split(",")]:
        print(split_row(model, length, args), flush=True)
    print(f"goal: diagnose ≤ {GOAL_TIME:g}× sdpa at 4096 tokens (see the 4096 row)")


def child(args) -> None:
    model = build_model(args.heads, args.layers, "sdpa", max_positions=max(8192, args.length))
    calls = {
        "sdpa": lambda t: forward_call(model, t),
        "eager": lambda t: diagnose_call(model, t, "eager", args.block_size),
        "fused": lambda t: diagnose_call(model, t, "fused", args.block_size),
    }
    call = calls[args.child]
    # warm-up at a negligible footprint: the native library loaded, so the peak is the steady state's
    call(16)
    gc.collect()
    print(json.dumps(measure_peak(lambda: call(args.length))))


def memory_section(args) -> None:
    print(
        "| tokens | sdpa MB | eager stats MB | fused stats MB | fused s | **fused / sdpa** "
        "| fused MB per 1k tokens |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for length in [int(x) for x in args.memory_lengths.split(",")]:
        got = {}
        for mode in ("sdpa", "eager", "fused"):
            if mode == "eager" and length > args.eager_max:
                got[mode] = None
                continue
            arguments = ["--child", mode, "--length", str(length), "--heads", str(args.heads),
                         "--layers", str(args.layers), "--block-size", str(args.block_size)]  # fmt: skip
            got[mode] = run_child(arguments, __file__, timeout=args.timeout)
        peak = {m: got[m]["peak_mb"] if got[m] else float("nan") for m in got}
        sdpa, eager, fused = peak["sdpa"], peak["eager"], peak["fused"]
        seconds = got["fused"]["seconds"] if got["fused"] else float("nan")
        eager_text = "skipped" if got["eager"] is None else f"{eager:.1f}"
        print(
            f"| {length} | {sdpa:.1f} | {eager_text} | {fused:.1f} | {seconds:.1f} | "
            f"**{(fused / sdpa if sdpa else float('nan')):.2f}** | {fused / length * 1000:.1f} |",
            flush=True,
        )
    print(f"goal: fused ≤ {GOAL_MEMORY:g}× sdpa's peak at 8192 tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="time,memory", help="time, memory and/or split")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--memory-lengths", default="1024,4096")
    parser.add_argument("--eager-max", type=int, default=8192, help="longest length eager stats run at")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--child", default=None)
    parser.add_argument("--length", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    load = os.getloadavg()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads, load average {load[0]:.1f}; torch {torch.__version__}"
    )
    sections = args.sections.split(",")
    if "time" in sections:
        time_section(args)
    if "split" in sections:
        split_section(args)
    if "memory" in sections:
        memory_section(args)


if __name__ == "__main__":
    main()
