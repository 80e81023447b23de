"""diagnose's fused statistics on a GPU (issue 24 item 4), measured side by side in one run. Not a test.

    python benchmarks/gpu_stats.py --device cuda            # scripts/gpu_bench.sh runs this
    python benchmarks/gpu_stats.py --device cpu --quick     # the same code at a tiny size

Three sections, each printing a table:

* ``exact``: every metric of ``diagnose(stats="fused")`` against ``diagnose(stats="eager")`` (the
  reference path that reduces blocks of weights) on the same inputs, on the device, for tiny
  random-init models of several families (GQA, sliding windows, softcapping, learned sinks,
  absolute positions), float32 and bfloat16, with the probes that drive rows to collapse
  (``logit-scale:32``, ``dominant-key:32``, where the textbook entropy m + log l − u/l cancels) and
  padded inputs of unequal lengths. The largest absolute difference per metric, against 1e-6
  (relative for effective tokens, which count keys).
* ``long``: the same comparison on one sequence of ``--long-length`` tokens (32,768) through a
  model of SmolLM2-135M's configuration (30 layers, 9 heads over 3 KV heads, hidden 576; random
  init), float32 and bfloat16; with ``--long-weights DIR`` (made by scripts/smollm2_slice.py: the
  real model's first layers, which fit a GPU machine's 64 MiB upload where the whole model does not)
  on SmolLM2-135M-Instruct's real weights over real text (WikiText-2).
* ``time``: one probe level (``embed-scale:1``) over one sequence, diagnose with fused and with
  eager statistics against a plain SDPA forward of the same tokens, on the benchmark Llama of
  benchmarks/diagnose.py (4 layers × 8 heads × 32); best of ``--repeats`` interleaved rounds, device
  synchronized; peak memory over the loaded model from ``torch.cuda.max_memory_allocated`` (on the
  CPU: not measured here, see benchmarks/online_stats.py). Goals (issue 24): fused ≤ 1.5× SDPA at
  4,096 tokens; peak ≤ 2× SDPA's at 8,192.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/diagnose.py's model
from diagnose import build_model  # noqa: E402

ABS = 1e-6  # the exactness goal of issue 24, on every metric
EXACT_FAMILIES = [("llama", "causal"), ("mistral", "causal"), ("gemma2", "causal"), ("gpt_oss", "causal"),
                  ("qwen2", "causal"), ("gpt2", "causal"), ("bert", "masked")]  # fmt: skip
EXACT_PROBES = ["logit-scale:1,32", "dominant-key:0,32", "key-scale:1,8"]
LONG_PROBES = ["logit-scale:1,32", "dominant-key:0,32"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worst_differences(a, b, layers: slice = slice(None)) -> dict[str, float]:
    """Per metric, the largest |fused − eager| over probes, levels, the given layers and heads
    (effective tokens relative to max(1, value)); NaN placement must agree (a mismatch reads inf).
    Layer 0 sees the same inputs in both runs; later layers see what the previous layer's attention
    output made of them, so in bfloat16 (where the eager output rounds its weights to bf16 before
    the value matmul and the fused one does not) they measure the forward's divergence too."""
    from ssacli.diagnosis.metrics import METRICS

    worst: dict[str, float] = {}
    for pa, pb in zip(a.probes, b.probes, strict=True):
        if not np.array_equal(pa.rows, pb.rows):
            worst["rows"] = math.inf
        for name in METRICS:
            x = np.asarray(pa.metrics[name], float)[:, layers]
            y = np.asarray(pb.metrics[name], float)[:, layers]
            if not np.array_equal(np.isnan(x), np.isnan(y)):
                worst[name] = math.inf
                continue
            scale = np.maximum(1.0, np.abs(y)) if name == "effective_tokens" else 1.0
            worst[name] = max(worst.get(name, 0.0), float(np.nanmax(np.abs(x - y) / scale, initial=0)))
    return worst


def worst_of(worst: dict[str, float]) -> tuple[str, float]:
    return max(worst.items(), key=lambda kv: kv[1])


def compare(model, probes, device, **inputs):
    """diagnose with eager and with fused statistics on the same inputs: (worst difference at layer 0,
    over all layers, eager seconds, fused seconds, the fused run's stats_calls)."""
    import ssacli

    times = {}
    results = {}
    for mode in ("eager", "fused"):
        sync(device)
        start = time.perf_counter()
        results[mode] = ssacli.diagnose(model, probes, stats=mode, **inputs)
        sync(device)
        times[mode] = time.perf_counter() - start
    fused, eager = results["fused"], results["eager"]
    first = worst_differences(fused, eager, slice(0, 1))
    every = worst_differences(fused, eager)
    return first, every, times["eager"], times["fused"], fused.settings["stats_calls"]


def exact_section(args, device: torch.device) -> int:
    from ssacli.testing.tiny_models import build_tiny

    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randint(3, 120, (n,), generator=gen).tolist() for n in (args.exact_length, 24, 17)]
    print(f"\n## exact: fused vs eager statistics, tiny models, padded batch of 3, {', '.join(EXACT_PROBES)}")
    print("| family | dtype | layer 0: worst metric | diff | all layers: worst metric | diff | fused calls "
          "| layer 0 within 1e-6 |")  # fmt: skip
    print("|---|---|---|---:|---|---:|---:|---|")
    failed = 0
    families = [f for f in EXACT_FAMILIES if f[0] in args.exact_families.split(",")]
    for family, kind in families[: 2 if args.quick else None]:
        for dtype_name in args.dtypes.split(","):
            model = build_tiny(family, kind, dtype=DTYPES[dtype_name]).to(device)
            first, every, _, _, calls = compare(model, EXACT_PROBES, device, inputs=inputs, batch_size=3)
            (name0, value0), (name, value) = worst_of(first), worst_of(every)
            ok = value0 <= ABS and calls.get("eager", 0) == 0
            failed += not ok
            print(
                f"| {family} | {dtype_name} | {name0} | {value0:.2e} | {name} | {value:.2e} | {calls} "
                f"| {'yes' if ok else 'NO'} |",
                flush=True,
            )
    return failed


def smollm2_model(layers: int, positions: int, dtype: torch.dtype, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(  # SmolLM2-135M's config.json (HuggingFaceTB/SmolLM2-135M), more positions
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
        max_position_embeddings=positions, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype=dtype, device=device).eval()


def smollm2_slice(folder: Path, dtype: torch.dtype, device: torch.device):
    """SmolLM2-135M's real first layers and the renumbered ids of real text (scripts/smollm2_slice.py)."""
    import json

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    return model, json.loads((folder / "ids.json").read_text())


def long_section(args, device: torch.device) -> int:
    probes = args.long_probes.split(";")
    if args.long_weights:
        slice_note = (args.long_weights / "SLICE.md").read_text().strip()
        what = f"SmolLM2-135M-Instruct's real weights ({slice_note})"
    else:
        what = f"SmolLM2-135M's config ({args.long_layers} layers, random init, random tokens)"
    print(f"\n## long: fused vs eager statistics, one sequence of {args.long_length:,} tokens, {what}, "
          f"{', '.join(probes)}")  # fmt: skip
    print("| dtype | layer 0: worst metric | diff | layer 0: worst continuous metric | diff "
          "| layer 0: rows across τ | all layers: worst metric | diff | eager s | fused s "
          "| layer 0 within 1e-6 |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---|---:|---:|---:|---|")
    failed = 0
    for dtype_name in args.dtypes.split(","):
        if args.long_weights:
            model, ids = smollm2_slice(args.long_weights, DTYPES[dtype_name], device)
            if len(ids) < args.long_length:
                sys.exit(f"{args.long_weights}/ids.json: {len(ids)} tokens, fewer than {args.long_length}")
            warm = {"inputs": [ids[:64]], "batch_size": 1}
            inputs = {"inputs": [ids[: args.long_length]], "batch_size": 1}
        else:
            model = smollm2_model(args.long_layers, args.long_length, DTYPES[dtype_name], device)
            warm = {"random_ids": True, "samples": 1, "length": 64, "batch_size": 1}
            inputs = {"random_ids": True, "samples": 1, "length": args.long_length, "batch_size": 1}
        compare(model, probes[:1], device, **warm)  # warm-up: kernels and allocator
        first, every, eager_s, fused_s, _ = compare(model, probes, device, **inputs)
        (name0, value0), (name, value) = worst_of(first), worst_of(every)
        ok = value0 <= ABS
        failed += not ok
        # collapse rate is a share of rows whose max weight is >= τ: one row of n that two exact
        # computations put on either side of τ (its max weight within rounding of τ) moves it by 1/n.
        smooth = worst_of({k: v for k, v in first.items() if k != "collapse_rate"})
        across = first.get("collapse_rate", 0.0) * args.long_length
        print(
            f"| {dtype_name} | {name0} | {value0:.2e} | {smooth[0]} | {smooth[1]:.2e} | {across:.0f} "
            f"| {name} | {value:.2e} | {eager_s:.1f} | {fused_s:.1f} | {'yes' if ok else 'NO'} |",
            flush=True,
        )
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return failed


def timed(call, device: torch.device) -> tuple[float, float]:
    """Seconds and peak MB over what was allocated before (CUDA; NaN elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    kept = call()  # noqa: F841  (alive until the peak is read)
    sync(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20 if device.type == "cuda" else math.nan
    return seconds, peak


def time_one(model, length: int, args, device: torch.device) -> str:
    """One table row: best of the interleaved rounds per candidate, and its peak memory."""
    import ssacli

    ids = torch.randint(3, 1000, (1, length), generator=torch.Generator().manual_seed(0)).to(device)

    def sdpa():
        with torch.inference_mode():
            return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits

    def diag(mode):
        return lambda: ssacli.diagnose(
            model, ["embed-scale:1"], random_ids=True, samples=1, length=length, batch_size=1, stats=mode
        )

    calls = {"sdpa": sdpa, "fused": diag("fused")}
    if length <= args.eager_max:
        calls["eager"] = diag("eager")
    best = dict.fromkeys(calls, (math.inf, math.nan))
    for fn in calls.values():
        fn()  # warm-up (kernels, allocator)
    for _ in range(args.repeats):
        for k, fn in calls.items():
            seconds, mb = timed(fn, device)
            best[k] = (min(best[k][0], seconds), mb)
    (sdpa_s, sdpa_mb), (fused_s, fused_mb) = best["sdpa"], best["fused"]
    eager_s = best.get("eager", (math.nan, math.nan))[0]
    return (
        f"| {length} | {sdpa_s * 1e3:.1f} | {fused_s * 1e3:.1f} | {eager_s * 1e3:.1f} "
        f"| **{fused_s / sdpa_s:.2f}** | {eager_s / sdpa_s:.2f} | {sdpa_mb:.1f} | {fused_mb:.1f} "
        f"| **{fused_mb / sdpa_mb:.2f}** |"
    )


def time_section(args, device: torch.device) -> None:
    print("\n## time: one probe level (embed-scale:1), one sequence, the benchmark Llama (4 × 8 heads × 32)")
    print("| dtype | tokens | sdpa ms | fused ms | eager ms | **fused × sdpa** | eager × sdpa "
          "| sdpa MB | fused MB | **fused / sdpa MB** |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lengths = [int(x) for x in args.lengths.split(",")]
    for dtype_name in args.dtypes.split(","):
        model = build_model(8, 4, "sdpa", max_positions=max(8192, *lengths))
        model = model.to(DTYPES[dtype_name]).to(device)
        for length in lengths:
            print(f"| {dtype_name} " + time_one(model, length, args, device), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("goals (issue 55): fused ≤ 1.5× sdpa at 4,096–32,768 tokens; fused peak ≤ 2× sdpa's in bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sections", default="exact,time,long")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--exact-length", type=int, default=300, help="the longest of the 3 exact inputs")
    parser.add_argument("--long-length", type=int, default=32768)
    parser.add_argument("--long-layers", type=int, default=30)
    parser.add_argument("--long-probes", default=";".join(LONG_PROBES), help="probe specs, ';'-separated")
    parser.add_argument("--long-weights", type=Path, help="scripts/smollm2_slice.py output")
    parser.add_argument("--exact-families", default=",".join(f for f, _ in EXACT_FAMILIES))
    parser.add_argument("--lengths", default="1024,4096,8192,32768")
    parser.add_argument("--eager-max", type=int, default=8192, help="longest length eager stats are timed at")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the code path, not the numbers")
    args = parser.parse_args()
    if args.quick:
        args.exact_length, args.long_length, args.long_layers = 40, 96, 2
        args.lengths, args.repeats, args.dtypes = "64", 1, "float32"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device (for the CPU: --device cpu)")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"device: {name}; torch {torch.__version__}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    failed = 0
    for section in args.sections.split(","):  # in the order given: a time-limited run keeps the first
        if section == "exact":
            failed += exact_section(args, device)
        elif section == "time":
            time_section(args, device)
        elif section == "long":
            failed += long_section(args, device)
        else:
            sys.exit(f"unknown section {section!r} (exact, time, long)")
    summary = "every comparison within 1e-6" if not failed else f"{failed} comparison(s) OVER 1e-6"
    print(f"\nexactness: {summary}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
