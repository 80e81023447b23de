"""The length probe on a 1B-class random-init Llama, doubling the length until it no longer fits a
memory budget (issue 24 item 2). Not a test.

    python benchmarks/long_context.py --device cuda [--budget-gb 24] [--start 4096] [--longest 262144]
    python benchmarks/long_context.py --device cpu --quick      # the code path at a tiny size

Model: TinyLlama-1.1B's configuration (22 layers, 32 heads over 4 KV heads, head dim 64, hidden 2048,
MLP 5632, vocab 32,000; 1.10 B parameters), random init, ``--dtype`` (bfloat16), built from its
config on the device (nothing is downloaded), rope positions up to ``--longest``.
Each level is ``ssacli.diagnose(model, ["length:m"])`` with one sequence of random tokens (batch 1,
``--stats`` auto = the fused statistics): m × 64 tokens, timed once with the device synchronized.

Memory: on CUDA the whole process is held to ``--budget-gb`` (model included) with
``torch.cuda.set_per_process_memory_fraction``; a level that needs more raises an out-of-memory
error, which ends the table ("does not fit"). The peak column is ``torch.cuda.max_memory_allocated``
during the call minus what was allocated before it (the loaded model): what n tokens cost on top of
the weights, fitted as MB per 1,000 tokens. On the CPU nothing enforces the budget (peak RSS over the
RSS before the call is reported instead). A level that took longer than ``--level-seconds`` ends the
table too: the next would take about 4× as long (attention is quadratic in n).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import measure_peak  # noqa: E402

from ssacli.defaults import PROBE_LENGTH  # noqa: E402

# TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T's config.json
ONE_B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
             num_key_value_heads=4, vocab_size=32000, rms_norm_eps=1e-5, rope_theta=10000.0)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=500, rms_norm_eps=1e-5, rope_theta=10000.0)  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build(sizes: dict, positions: int, dtype: torch.dtype, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**sizes, max_position_embeddings=positions, attn_implementation="sdpa")
    torch.manual_seed(0)
    with device:  # initialized where it will run: 1.1 B parameters take seconds on a GPU
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def run_level(model, tokens: int, args, device: torch.device) -> dict:
    import ssacli

    def call():
        return ssacli.diagnose(
            model, [f"length:{tokens // PROBE_LENGTH}"], random_ids=True, samples=1, batch_size=1,
            block_size=args.block_size, stats=args.stats,
        )  # fmt: skip

    if device.type != "cuda":
        kept: dict = {}
        measured = measure_peak(lambda: kept.setdefault("result", call()))
        return {"seconds": measured["seconds"], "peak_mb": measured["peak_mb"], **reached(kept["result"])}
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    result = call()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    return {"seconds": seconds, "peak_mb": peak, **reached(result)}


def reached(result) -> dict:
    """The tokens the probe's longest level really fed the model, and the fused calls it made."""
    probe = result.probe("length")
    tokens = [t for t in probe.extras.get("tokens", []) if t is not None]
    return {"tokens": max(tokens) if tokens else None, "calls": result.settings.get("stats_calls", {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--budget-gb", type=float, default=24.0)
    parser.add_argument("--start", type=int, default=4096, help="first length in tokens")
    parser.add_argument("--longest", type=int, default=262144, help="stop doubling here")
    parser.add_argument("--level-seconds", type=float, default=120.0, help="stop after a level this slow")
    parser.add_argument("--block-size", type=int, default=1024, help="query rows per block")
    parser.add_argument("--stats", default="auto", choices=("auto", "fused", "eager"))
    parser.add_argument("--quick", action="store_true", help="a tiny model and lengths: the code path")
    args = parser.parse_args()
    sizes = ONE_B
    if args.quick:
        sizes, args.start, args.longest, args.block_size = TINY, 128, 256, 64
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device (for the CPU: --device cpu)")
        total = torch.cuda.get_device_properties(device).total_memory
        share = min(1.0, args.budget_gb * 2**30 / total)
        torch.cuda.set_per_process_memory_fraction(share, device.index or 0)  # it wants an index
        name = torch.cuda.get_device_name(device)
        budget = f"held to {args.budget_gb:g} GB of {total / 2**30:.0f}"
    else:
        name, budget = platform.processor() or "cpu", "not enforced on the CPU"
    print(f"device: {name}; torch {torch.__version__}; {os.cpu_count()} cores; memory budget {budget}")
    began = time.perf_counter()
    model = build(sizes, args.longest, DTYPES[args.dtype], device)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: random-init Llama, {sizes['num_hidden_layers']} layers × {sizes['num_attention_heads']} "
        f"heads ({sizes['num_key_value_heads']} KV), hidden {sizes['hidden_size']}, {params / 1e9:.2f} B "
        f"parameters, {args.dtype}, built in {time.perf_counter() - began:.1f} s; stats {args.stats}, "
        f"block {args.block_size} rows"
    )
    run_level(model, 2 * PROBE_LENGTH, args, device)  # warm-up: kernels, compilation, allocator
    print("\n| tokens | s | peak MB over the model | MB per 1k tokens | fits | attention calls |")
    print("|---:|---:|---:|---:|---|---|")
    ns, peaks, tokens = [], [], args.start
    while tokens <= args.longest:
        try:
            got = run_level(model, tokens, args, device)
        except torch.OutOfMemoryError:
            print(f"| {tokens:,} | | | | **no**: out of memory within the budget | |", flush=True)
            break
        ns.append(tokens)
        peaks.append(got["peak_mb"])
        per_1k = got["peak_mb"] / tokens * 1000
        if got["tokens"] != tokens:
            sys.exit(f"the length probe fed {got['tokens']} tokens, not {tokens}: the table would be wrong")
        row = f"| {tokens:,} | {got['seconds']:.1f} | {got['peak_mb']:.0f} | {per_1k:.1f} | yes"
        print(f"{row} | {got['calls']} |", flush=True)
        if got["seconds"] > args.level_seconds:
            print(f"(stopped: this level took over {args.level_seconds:g} s; the next takes ~4×)")
            break
        tokens *= 2
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if len(ns) >= 2:
        slope, intercept = np.polyfit(np.asarray(ns, float), np.asarray(peaks, float), 1)
        last = math.log(peaks[-1] / peaks[-2]) / math.log(ns[-1] / ns[-2]) if peaks[-2] > 0 else math.nan
        print(f"\nmemory: {slope * 1000:.1f} MB per 1,000 tokens + {intercept:.0f} MB (least squares); "
              f"log-log exponent over the last doubling {last:.2f}")  # fmt: skip
    print(f"longest length that fit: {max(ns):,} tokens" if ns else "nothing fit")


if __name__ == "__main__":
    main()
