"""SSA inference on the CPU: ssacli's fast path (the native kernels) against torch's flex_attention
compiled for the CPU (dynamic shapes, SSA as its score_mod: not one of ssacli's paths, the row that
shows why none is needed) and SDPA softmax, no-grad forward, per shape. Not a test.

    python benchmarks/inference.py [--repeats 5] [--quick]

H = 8 heads of 64, fp32, random inputs; each candidate once per round, rounds interleaved, best of
``--repeats`` (benchmarks/_common.interleaved_best); × = time / SDPA's in the same round. "blocked"
is ``backend="auto"``: the native kernels (ssacli.kernels.native, the CPU float32 path); "torch
blocks" is ``backend="torch-blocks"``, the block loop with its torch block math (what runs where
nothing native is built); "flex" is torch's flex_attention with the same transform, one
``torch.compile`` with dynamic shapes for every length (its cost is printed first). The last column
is what ``auto`` picks (``ssacli.kernels.routing.choose_backend``). The machine and its load are
printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved_best  # noqa: E402

from ssacli.kernels import fused, native, routing  # noqa: E402
from ssacli.kernels.ssa_transform import ssa_transform  # noqa: E402

HEADS, DIM = 8, 64
B_SSA, N_SSA = 1.0, 1.5
SHAPES = [(1, 64), (1, 128), (1, 256), (1, 512), (1, 1024), (1, 2048), (8, 64), (8, 128), (8, 256), (8, 512)]
QUICK = [(1, 64), (1, 256)]


def inputs(batch: int, length: int):
    gen = torch.Generator().manual_seed(length)
    return [torch.randn(batch, HEADS, length, DIM, generator=gen) for _ in range(3)]


def compiled_flex():
    """SSA through torch's flex_attention compiled for the CPU with dynamic shapes: b·scale folded into
    q as ssacli's kernels do, a causal block mask per shape."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=True)
    n = torch.full((HEADS,), N_SSA)

    def score_mod(score, _b, h, _q, _k):
        return ssa_transform(score, n[h])

    def run(q, k, v, causal):
        length = q.shape[-2]
        mask = None
        if causal:
            mask = create_block_mask(
                lambda _b, _h, qi, ki: ki <= qi, None, None, length, length, device="cpu"
            )
        scaled = q * (B_SSA * DIM**-0.5)
        return flex(scaled, k, v, score_mod=score_mod, block_mask=mask, scale=1.0)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two small shapes: the code path")
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads, load average {load[0]:.1f}; torch {torch.__version__}"
    )
    q, k, v = inputs(1, 64)
    flex = compiled_flex()
    start = time.perf_counter()
    with torch.no_grad():
        flex(q, k, v, True)
    print(f"first flex call (compiles it, dynamic shapes; later processes reuse torch's cache): "
          f"{time.perf_counter() - start:.1f} s\n")  # fmt: skip
    print("| B | T | causal | logits | sdpa ms | **blocked × sdpa** | torch blocks × sdpa | flex × sdpa "
          "| flex / blocked | auto picks |")  # fmt: skip
    print("|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---|")
    for batch, length in QUICK if args.quick else SHAPES:
        q, k, v = inputs(batch, length)
        logits = batch * HEADS * length * length
        for causal in (True, False):

            def ssa(backend, causal=causal, q=q, k=k, v=v):
                return lambda: fused.ssa_attention(q, k, v, B_SSA, N_SSA, causal=causal, backend=backend)

            def sdpa(causal=causal, q=q, k=k, v=v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            with torch.no_grad():
                candidates = {"sdpa": sdpa, "blocked": ssa("auto"), "torch": ssa("torch-blocks")}
                candidates["flex"] = lambda causal=causal, q=q, k=k, v=v: flex(q, k, v, causal)
                best = interleaved_best(candidates, args.repeats)
                picked = routing.choose_backend(routing.Call("cpu", q.dtype, native=native.kernels_here()))
            base = best["sdpa"]
            print(
                f"| {batch} | {length} | {'yes' if causal else 'no'} | {logits:,} | {base * 1e3:.2f} "
                f"| **{best['blocked'] / base:.2f}** | {best['torch'] / base:.2f} "
                f"| {best['flex'] / base:.2f} | {best['flex'] / best['blocked']:.2f} | {picked} |",
                flush=True,
            )
    print(f"\nauto on the CPU: the native kernels where they are built (here: {native.available()}), "
          "the torch block math otherwise. Goal (issue 24): SSA forward <= 1.3× SDPA at B = 1, "
          "T = 1024")  # fmt: skip


if __name__ == "__main__":
    main()
