"""What ``ssacli.diagnose`` costs next to a plain forward, in time and in peak memory, measured side by
side in one run (machines here are noisy: compare ratios, not seconds). Not part of the test suite.

    python benchmarks/diagnose.py [--sections time,memory,length] [--heads 8] [--repeats 7]
        [--lengths 512,2048,4096,8192] [--max-positions 4096] [--length-models bundled,llama]

Model: a random-init Llama built from its config (4 layers, hidden 256, vocab 1000, rope,
max_position_embeddings 8192), eval, fp32, on the CPU.

Time: one probe level (``embed-scale:1``) on the same 8 x 256-token batch as every baseline, each
candidate called once per round, rounds interleaved so that a slow spell hits every candidate alike;
best and median of the rounds. The chain sdpa -> eager -> ssacli softmax (full map) -> observed with
a no-op recorder -> observed (row_sums) -> diagnose() shows where the extra time goes.

Memory: every (mode, length) runs in a fresh subprocess: model built, one 16-token warm-up call,
then RSS is read (/proc/self/status VmRSS), the kernel's high-water mark is reset (write 5 to
/proc/self/clear_refs; ru_maxrss otherwise), the call runs, and peak = VmHWM - that RSS. Children run
with MALLOC_MMAP_THRESHOLD_=131072 (each tensor over 128 KiB is its own mapping, returned when freed),
so the peak follows live tensors rather than glibc's caching (--default-malloc: without it).

Length probe (section d, benchmarks/_diagnose_length.py): the ``length`` probe at ×1, ×2, ×4 ... up to
the model's maximum positions, for the bundled default model and this Llama with
max_position_embeddings = --max-positions (default 4096; 8192 or more for bigger n) and
--length-layers layers (default 2), each level in a fresh process as above; wall time, peak memory,
the slope of memory against n and its log-log exponent. About 2 minutes on one thread; --length-longest
N stops at N tokens, --length-all adds the probe's default levels in one call.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import platform
import statistics
import time
from collections.abc import Callable

import torch
from _common import measure_peak, run_child
from _diagnose_length import child as length_child
from _diagnose_length import length_section

GOAL_TIME = 3.0  # diagnose() of one probe level <= 3 x the sdpa forward of the same batches
GOAL_MEMORY = 1.25  # "roughly linear": peak ~ L^p with p <= 1.25 from the shortest to the longest length
PROBE = "embed-scale:1"


# ---- the model -------------------------------------------------------------------------------------


def build_model(heads: int, layers: int, impl: str, max_positions: int = 8192) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=1024, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation(impl)
    return model


def recorder_for(model: torch.nn.Module, block_size: int, *, reduce: bool = True, label: bool = False):
    """A diagnose Recorder on ``model``'s attention layers (``reduce=False``: record() does nothing)."""
    from ssacli.attention.interface import attention_modules
    from ssacli.diagnosis.recorder import Recorder

    class Timed(Recorder):
        def record(self, *args, **kwargs) -> None:
            if not reduce:
                return
            if not label:
                return super().record(*args, **kwargs)
            with torch.profiler.record_function("Recorder.record (row_sums)"):
                return super().record(*args, **kwargs)

    layer_of = {id(m): i for i, (_, m) in enumerate(attention_modules(model))}
    return Timed(layer_of, tau=0.9, top_k=5, block_size=block_size, causal=True)


def diagnose_call(model, length: int, samples: int, batch_size: int, block_size: int):
    import ssacli

    return ssacli.diagnose(
        model, probes=[PROBE], random_ids=True, samples=samples, length=length,
        batch_size=batch_size, block_size=block_size,
    )  # fmt: skip


# ---- time ------------------------------------------------------------------------------------------


def interleaved(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Seconds of every call of each function, one call of each per round (after a warm-up)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def time_section(args) -> float:
    from ssacli.attention.forward import observing
    from ssacli.attention.interface import apply_scorer

    b, t = args.batch_size, args.time_length
    base = build_model(args.heads, args.layers, "sdpa")
    models = {impl: copy.deepcopy(base) for impl in ("sdpa", "eager", "ssacli")}
    models["eager"].set_attn_implementation("eager")
    apply_scorer(models["ssacli"], "softmax")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (b, t), generator=generator)
    mask = torch.ones_like(ids)
    target = torch.randint(1, t // 2, (b,), generator=generator)  # as diagnose picks one per sample

    def forward(model, recorder=None) -> Callable[[], None]:
        def run() -> None:
            with torch.inference_mode():
                if recorder is None:
                    model(input_ids=ids, attention_mask=mask, use_cache=False)
                    return
                recorder.valid, recorder.target = mask.bool(), target
                with observing(recorder):
                    model(input_ids=ids, attention_mask=mask, use_cache=False)

        return run

    scored = models["ssacli"]
    fns = {
        "sdpa forward": forward(models["sdpa"]),
        "eager forward": forward(models["eager"]),
        "ssacli softmax, full map": forward(scored),
        "observed, no-op record": forward(scored, recorder_for(scored, args.block_size, reduce=False)),
        "observed (row_sums)": forward(scored, recorder_for(scored, args.block_size)),
        "diagnose() end to end": lambda: diagnose_call(
            models["sdpa"], t, args.samples, args.batch_size, args.block_size
        ),
    }
    print(
        f"\n(a) time: {args.samples} x {t} tokens, batch {b}, probe {PROBE}, block {args.block_size}, "
        f"{args.repeats} interleaved rounds after a warm-up"
    )
    times = interleaved(fns, args.repeats)
    best_sdpa, median_sdpa = min(times["sdpa forward"]), statistics.median(times["sdpa forward"])
    print(f"{'what':<26} {'best ms':>8} {'median ms':>10} {'x sdpa':>7} {'x sdpa med':>11} {'x eager':>8}")
    best_eager = min(times["eager forward"])
    for name, values in times.items():
        best, median = min(values), statistics.median(values)
        print(
            f"{name:<26} {best * 1e3:8.1f} {median * 1e3:10.1f} {best / best_sdpa:7.2f} "
            f"{median / median_sdpa:11.2f} {best / best_eager:8.2f}"
        )
    diag, observed = times["diagnose() end to end"], times["observed (row_sums)"]
    best_gap = min(diag) - min(observed)
    median_gap = statistics.median(diag) - statistics.median(observed)
    print(
        "diagnose()'s own work around the forward (inputs, targets, loss, apply/restore, results): "
        f"{best_gap * 1e3:+.1f} ms best, {median_gap * 1e3:+.1f} ms median (diagnose - observed)"
    )
    ratio = min(times["diagnose() end to end"]) / best_sdpa
    core = min(times["observed (row_sums)"]) / best_sdpa
    verdict = "met" if ratio <= GOAL_TIME else "MISSED"
    print(
        f"goal time: diagnose() <= {GOAL_TIME:g}x sdpa forward: {ratio:.2f}x end to end "
        f"(observed forward alone {core:.2f}x) -> {verdict}"
    )
    if args.profile or ratio > GOAL_TIME:
        profile(scored, fns["observed (row_sums)"], args)
    return ratio


def profile(scored, run_observed: Callable[[], None], args) -> None:
    """Top ops of one observed forward, with the Recorder's share labelled."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from ssacli.attention.forward import observing

    recorder = recorder_for(scored, args.block_size, label=True)
    run_observed()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (args.batch_size, args.time_length), generator=generator)
    recorder.valid = torch.ones_like(ids, dtype=torch.bool)
    recorder.target = torch.randint(1, args.time_length // 2, (args.batch_size,), generator=generator)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.inference_mode(), observing(recorder):
            scored(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\nprofile of one observed forward (torch.profiler, self CPU, total {total / 1e3:.0f} ms):")
    for event in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]:
        share = event.self_cpu_time_total / total
        print(f"  {event.key:<34} {event.self_cpu_time_total / 1e3:8.1f} ms {share:6.1%}  x{event.count}")
    for event in events:
        if event.key.startswith("Recorder.record"):
            inside = event.cpu_time_total
            print(f"  inside {event.key}: {inside / 1e3:.1f} ms ({inside / total:.0%})")


# ---- memory ----------------------------------------------------------------------------------------


def ratio(value: float | None, base: float | None) -> float:
    """value / base, NaN where either is missing or the base peak is 0 MB (a tiny run can fit in memory
    the process already holds)."""
    return value / base if value is not None and base else float("nan")


def child(args) -> None:
    """One measured call in this (fresh) process; prints a JSON line."""
    mode, length = args.child, args.length
    impl = {"sdpa": "sdpa", "diagnose": "sdpa", "eager-maps": "eager"}[mode]
    model = build_model(args.heads, args.layers, impl)

    def call(t: int):
        if mode == "diagnose":
            return diagnose_call(model, t, 1, 1, args.block_size)
        ids = torch.randint(3, 1000, (1, t), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            return model(
                input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                output_attentions=mode == "eager-maps",
            )  # fmt: skip

    call(16)  # warm-up: library and kernel set-up, at a negligible footprint
    gc.collect()
    print(json.dumps(measure_peak(lambda: call(length))))


def measure(mode: str, length: int, args) -> dict | None:
    arguments = [
        "--child", mode, "--length", str(length), "--heads", str(args.heads),
        "--layers", str(args.layers), "--block-size", str(args.block_size),
    ]  # fmt: skip
    return run_child(arguments, __file__, args.default_malloc)


def memory_section(args) -> float | None:
    lengths = [int(x) for x in args.lengths.split(",")]
    heads, layers = args.heads, args.layers
    allocator = (
        "glibc malloc defaults (its caching makes peaks vary from run to run)"
        if args.default_malloc
        else "MALLOC_MMAP_THRESHOLD_=131072, so RSS follows live tensors, not malloc's cache"
    )
    print(
        f"\n(b, c) peak memory, batch 1, 1 sample, block {args.block_size}: peak RSS over the RSS right "
        "before the call,\neach in a fresh process (VmHWM after resetting it via /proc/self/clear_refs); "
        f"{allocator}"
    )
    rows = {}
    for length in lengths:
        modes = ("sdpa", "diagnose") + (("eager-maps",) if length <= args.full_maps_max else ())
        rows[length] = {mode: measure(mode, length, args) for mode in modes}
        rows[length].setdefault("eager-maps", None)
    if any(r and not r["reset"] for row in rows.values() for r in row.values()):
        print("  (clear_refs unavailable: peaks are ru_maxrss, a whole-process high-water mark)")
    first = lengths[0]
    base_diag = (rows[first]["diagnose"] or {}).get("peak_mb")
    base_maps = (rows[first]["eager-maps"] or {}).get("peak_mb")
    measured_maps = [n for n in lengths if rows[n]["eager-maps"]]
    header = (
        f"{'tokens':>6} {'sdpa MB':>8} {'diagnose MB':>12} {'x' + str(first):>7} {'s':>6} "
        f"{'eager+maps MB':>14} {'x' + str(first):>7} {'maps alone MB':>14} {'quadratic x':>12}"
    )
    print(header)
    for n in lengths:
        sdpa, diag, maps = rows[n]["sdpa"], rows[n]["diagnose"], rows[n]["eager-maps"]
        maps_alone = layers * heads * n * n * 4 / 2**20  # fp32 [1, h, n, n] per layer
        if maps:
            eager_text = f"{maps['peak_mb']:14.1f} {ratio(maps['peak_mb'], base_maps):7.1f}"
        elif measured_maps:  # computed, not run: the largest measured figure scaled quadratically
            top = measured_maps[-1]
            scaled = rows[top]["eager-maps"]["peak_mb"] * (n / top) ** 2
            eager_text = f"{'~' + format(scaled, '.0f') + ' (calc)':>14} {ratio(scaled, base_maps):7.1f}"
        else:
            eager_text = f"{'-':>14} {'-':>7}"
        print(
            f"{n:>6} {_mb(sdpa):>8} {_mb(diag):>12} "
            f"{ratio(diag['peak_mb'] if diag else None, base_diag):7.1f} "
            f"{(diag['seconds'] if diag else float('nan')):6.1f} {eager_text} {maps_alone:14.1f} "
            f"{(n / first) ** 2:12.0f}"
        )
    last = lengths[-1]
    if not (rows[last]["diagnose"] and base_diag):
        print("goal memory: not measured")
        return None
    growth = rows[last]["diagnose"]["peak_mb"] / base_diag
    if last == first or growth <= 0:
        print("goal memory: one length measured, no growth to fit")
        return None
    exponent = math.log(growth) / math.log(last / first)
    verdict = "met" if exponent <= GOAL_MEMORY else "MISSED"
    maps_text = ""
    if base_maps and measured_maps and measured_maps[-1] != first:
        top = measured_maps[-1]
        maps_p = math.log(rows[top]["eager-maps"]["peak_mb"] / base_maps) / math.log(top / first)
        maps_text = f"; full maps grow as L^{maps_p:.2f} ({first} to {top})"
    print(
        f"goal memory: diagnose peak grows {growth:.1f}x from {first} to {last} tokens, i.e. as "
        f"L^{exponent:.2f} (linear {last / first:g}x, quadratic {(last / first) ** 2:g}x; goal "
        f"L^p with p <= {GOAL_MEMORY:g}){maps_text} -> {verdict}"
    )
    return growth


def _mb(result: dict | None) -> str:
    return "failed" if result is None else f"{result['peak_mb']:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--time-length", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--lengths", default="512,2048,4096,8192")
    parser.add_argument("--full-maps-max", type=int, default=4096, help="longest eager+maps run")
    parser.add_argument("--profile", action="store_true", help="profile even when the time goal is met")
    parser.add_argument("--default-malloc", action="store_true", help="keep glibc's adaptive mmap threshold")
    parser.add_argument("--sections", default="time,memory,length", help="which of time,memory,length")
    parser.add_argument("--max-positions", type=int, default=4096, help="(d) the Llama's max positions")
    parser.add_argument("--length-models", default="bundled,llama", help="(d) bundled and/or llama")
    parser.add_argument("--length-longest", type=int, help="(d) stop at this many tokens")
    parser.add_argument("--length-samples", type=int, default=1, help="(d) samples per level")
    parser.add_argument("--length-batch", type=int, default=1, help="(d) sequences per forward")
    parser.add_argument("--length-layers", type=int, default=2, help="(d) the Llama's layers")
    parser.add_argument("--length-all", action="store_true", help="(d) also every level in one call")
    parser.add_argument("--child-timeout", type=int, default=900, help="seconds per measured process")
    hidden = {"child": dict(choices=("sdpa", "diagnose", "eager-maps", "length"))}
    hidden |= {"length": dict(type=int), "length-model": {}, "level": dict(type=int)}
    for name, options in hidden.items():
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS, **options)
    args = parser.parse_args()
    args.script = __file__
    if args.child == "length":
        length_child(args, build_model)
        return
    if args.child:
        child(args)
        return
    sections = {s.strip() for s in args.sections.split(",")}
    if unknown := sections - {"time", "memory", "length"}:
        parser.error(f"--sections: unknown {', '.join(sorted(unknown))}; use time, memory, length")
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    )
    if sections & {"time", "memory"}:
        print(f"(a-c) Llama {args.layers} layers, {args.heads} heads, hidden 256, vocab 1000, random init")
    if "time" in sections:
        time_section(args)
    if "memory" in sections:
        memory_section(args)
    if "length" in sections:
        length_section(args, build_model)


if __name__ == "__main__":
    main()
