"""The cost of the sink and position metrics (issue 42 item 4): diagnose's fused statistics of one
attention call with and without the position terms (ssacli.kernels.positions), side by side in one
run, per path, next to an SDPA forward of the same call. Not a test.

    python benchmarks/positions.py [--length 8192] [--repeats 3] [--paths one-loop,row-pass,torch]
                                   [--check-rows 512]     # --repeats 0: the exactness check alone

The call: SmolLM2-135M's attention shape (9 query heads over 3 K/V heads of 64, causal, batch 1,
float32, CPU), random q, k, v; the run's bins (ssacli.diagnosis.positions.run_bins: the first 4 keys,
then 64 bins). Paths: the native one-loop kernel (the default for plain softmax calls on the CPU), the
native row pass between torch's matmuls (calls with a mask or a probe on the logits) and the torch
block math (elsewhere, and GPUs), each with and without the terms, candidates interleaved per round;
best of the rounds. The machine, its load and the thread count are printed: on a shared machine read
the ratios, not the seconds. First (``--check-rows R``, 0 to skip) each path's terms are checked
against the eager reference: float64 weights of the same float32 q, k (softmax of the float64 logits)
through weight_statistics, for the last R query rows against every key: the largest absolute error
of a share (key bins, distance bins; each row's shares sum to 1) and the largest relative error of a
row's mean distance and of a share above 1e-3.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch
import torch.nn.functional as F
from _common import interleaved_best

from ssacli.diagnosis.positions import run_bins
from ssacli.kernels import native
from ssacli.kernels.online_stats import softmax_statistics
from ssacli.kernels.row_stats import weight_statistics
from ssacli.kernels.stats_call import StatisticsCall

HEADS, KV_HEADS, DIM = 9, 3, 64  # SmolLM2-135M


def inputs(length: int):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, length, DIM, generator=gen)
    k = torch.randn(1, KV_HEADS, length, DIM, generator=gen)
    v = torch.randn(1, KV_HEADS, length, DIM, generator=gen)
    return q, k, v


def statistics(path: str, q, k, v, positions) -> callable:
    call = StatisticsCall(scaling=DIM**-0.5, causal=True, positions=positions)

    backend = {"one-loop": "one-loop", "row-pass": "native-blocks"}.get(path, "torch-blocks")

    def run():
        return softmax_statistics(q, k, v, call, backend=backend)

    return run


def _shares(stats, rows: slice):
    total = stats.total[..., rows]
    return {
        "key bins": stats.key_mass[..., rows, :] / total[..., None],
        "distance bins": stats.distance_mass[..., rows, :] / total[..., None],
        "mean distance": stats.distance_sum[..., rows] / total,
    }


def exactness(paths: list[str], q, k, v, bins, rows: int) -> None:
    """Each path's position terms against float64 weights of the last ``rows`` query rows."""
    length = q.shape[-2]
    last = slice(length - rows, length)
    groups = HEADS // KV_HEADS
    logits = (
        q[..., last, :].double() @ k.repeat_interleave(groups, 1).double().transpose(-1, -2)
    ) * DIM**-0.5
    positions = torch.arange(length - rows, length)
    visible = torch.arange(length)[None] <= positions[:, None]
    weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1)
    want = _shares(weight_statistics(weights, visible[None, None], positions=bins, query_positions=positions),
                   slice(None))  # fmt: skip
    del logits, weights
    print(f"exactness against float64 weights, the last {rows} rows × {length} keys, {HEADS} heads:")
    for path in paths:
        got = _shares(statistics(path, q, k, v, bins)()[1], last)
        parts = []
        for name, ref in want.items():
            gap = (got[name] - ref).abs()
            big = ref.abs() > 1e-3
            relative = float((gap[big] / ref[big].abs()).max())
            parts.append(f"{name} {float(gap.max()):.1e} abs, {relative:.1e} rel")
        print(f"  {path:<9} " + "; ".join(parts))


def sdpa(q, k, v) -> callable:
    groups = HEADS // KV_HEADS
    kr, vr = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)

    def run():
        with torch.inference_mode():
            return F.scaled_dot_product_attention(q, kr, vr, is_causal=True)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default="one-loop,row-pass,torch")
    parser.add_argument("--check-rows", type=int, default=512)
    args = parser.parse_args()
    load = os.getloadavg()
    machine = platform.processor() or platform.machine()
    print(f"{machine}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}")  # fmt: skip
    q, k, v = inputs(args.length)
    bins = run_bins(args.length)
    print(f"call: {HEADS} heads over {KV_HEADS} K/V × {DIM}, {args.length} tokens, causal; bins: first "
          f"{bins.sink_k}, then {bins.bin_width} tokens ({bins.key_bins(args.length)} key bins, "
          f"{bins.distance_bins(args.length)} distance bins)")  # fmt: skip
    paths = [p for p in args.paths.split(",") if p]
    if not native.available():
        paths = [p for p in paths if p == "torch"]
        print("native kernels not built here: the torch path only")
    elif not native.one_loop_available() and "one-loop" in paths:
        paths.remove("one-loop")
        print("torch's sgemm not found: no one-loop kernel")
    if args.check_rows > 0:
        exactness(paths, q, k, v, bins, min(args.check_rows, args.length))
    if args.repeats < 1:
        return  # the exactness check alone
    fns = {"sdpa forward": sdpa(q, k, v)}
    for path in paths:
        fns[f"{path} today"] = statistics(path, q, k, v, None)
        fns[f"{path} + positions"] = statistics(path, q, k, v, bins)
    best = interleaved_best(fns, args.repeats)
    sdpa_s = best["sdpa forward"]
    print(f"\n{'candidate':<24}{'best s':>9}{'× sdpa':>9}{'× today':>9}")
    rows = {}
    for name, seconds in best.items():
        path = name.rsplit(" ", 1)[0] if name.endswith("today") else name.split(" + ")[0]
        today = best.get(f"{path} today")
        plain = today is None or name.endswith("today") or name == "sdpa forward"
        ratio = "" if plain else f"{seconds / today:9.3f}"
        print(f"{name:<24}{seconds:9.3f}{seconds / sdpa_s:9.2f}{ratio:>9}")
        rows[name] = round(seconds, 4)
    print(json.dumps({"length": args.length, "load": load[0], "best_s": rows}))


if __name__ == "__main__":
    main()
