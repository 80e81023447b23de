"""SSA attention (eager, fused) against softmax attention (eager, SDPA), side by side in one run.
Not part of the test suite; machines here are noisy, so compare the ratios, not the seconds.

    python benchmarks/attention.py                  # the table of docs/performance.md
    python benchmarks/attention.py --quick          # B=1, T in {256, 1024}
    python benchmarks/attention.py --device cuda    # the GPU table (scripts/gpu_bench.sh)
    python benchmarks/attention.py --profile        # where the fused forward's time goes (T=1024)
    python benchmarks/attention.py --check          # fused vs eager, outputs and gradients
    python benchmarks/attention.py --memory         # only the peak-memory table
    python benchmarks/attention.py --candidates "ssa fused"   # only SDPA and the named candidates
    python benchmarks/attention.py --blocks         # the block-size sweep behind fused.BLOCK_*

Shapes: B in {1, 8}, H = 8, D = 64, T in {256, 1024, 4096}, causal and not, fp32 (CPU) or bf16
(CUDA). Candidates, timed in interleaved rounds (best of --repeats, after one warm-up call each):

* sdpa: torch.nn.functional.scaled_dot_product_attention, softmax (FlashAttention on CUDA);
* softmax eager / ssa eager: what ssacli's eager path computes inside a model: logits q·kᵀ·scale,
  the scorer (ssacli.make_scorer) over the explicit boolean mask, weights @ v;
* ssa fused: ssacli.ssa_attention as it runs by default: on the CPU the native one-loop forward and
  backward (each logit tile formed by torch's sgemm and reduced in cache); on CUDA the path
  ssacli.kernels.routing.choose_backend picks (flex_attention without grad);
* ssa block loop (CPU, where the one-loop kernels run): the same call forced to backend="native-blocks",
  forward and backward in the block loop (torch's matmuls per block, the native block pass between
  them): the path of calls with a mask tensor or dropout.

"fwd" is one forward under no_grad; "fwd+bwd" a forward with grad then backward of out.sum() into
q, k, v (and b, n for SSA). Eager candidates whose [B, H, T, T] weights would exceed --eager-max-gb
are skipped (the reason is printed). Peak memory (CPU): fwd+bwd, B = 1, causal, each in a fresh
process (benchmarks/_common.py), after one warm-up call of the same shape (so compiling is not
counted); CUDA: torch.cuda.max_memory_allocated.

The candidates and their inputs are _attention_cases.py's; --profile and --blocks are
_attention_tuning.py's sweeps.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sys

import torch
from _attention_cases import CANDIDATES, DIM, HEADS, candidates, make_inputs, sync
from _attention_tuning import blocks, profile
from _common import interleaved_best, measure_peak, run_child

from ssacli.kernels import fused, native
from ssacli.scorers import make_scorer

# Issue 24's goals on the CPU (B = 1, T = 1,024, causal and not); the CUDA ones are an earlier issue's.
GOALS = {"cpu": {"fwd": 1.3, "fwd+bwd": 1.8}, "cuda": {"fwd": 1.3, "fwd+bwd": 1.5}}


def chosen(found: dict, args) -> dict:
    """The candidates --candidates names (SDPA, the base of every ratio, always), in their own order."""
    return {n: fn for n, fn in found.items() if not args.candidates or n == "sdpa" or n in args.candidates}


def time_shape(batch, length, causal, args, dtype):
    found, params, skipped = candidates(batch, length, causal, args.device, dtype, args.eager_max_gb)
    found = chosen(found, args)
    q, k, v = make_inputs(batch, length, args.device, dtype, grad=False)
    qg, kg, vg = make_inputs(batch, length, args.device, dtype, grad=True)

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v)
            sync(args.device)

        return run

    def forward_backward(name, fn):
        leaves = [qg, kg, vg] + [p.requires_grad_() for p in params.get(name, [])]

        def run():
            out = fn(qg, kg, vg)
            torch.autograd.grad(out.float().sum(), leaves)
            sync(args.device)

        return run

    repeats = args.repeats if batch * length <= 8 * 1024 else max(2, args.repeats // 2)
    rows = {"fwd": interleaved_best({k: forward(f) for k, f in found.items()}, repeats)}
    rows["fwd+bwd"] = interleaved_best({k: forward_backward(k, f) for k, f in found.items()}, repeats)
    return rows, skipped


def memory_child(args) -> None:
    """One fwd+bwd in this fresh process (CPU); prints {"peak_mb", ...}."""
    name, length = args.child, args.length

    def call(size):
        found, params, _ = candidates(1, size, True, "cpu", torch.float32, eager_max_gb=1e9)
        q, k, v = make_inputs(1, size, "cpu", torch.float32, grad=True)
        leaves = [q, k, v] + [p.requires_grad_() for p in params.get(name, [])]

        def run():
            return torch.autograd.grad(found[name](q, k, v).sum(), leaves)

        return run

    measured = call(length)
    measured()  # warm-up at the same shape: kernels compiled, libraries loaded; freed again
    gc.collect()
    print(json.dumps(measure_peak(measured)))


def memory_table(args, lengths, names) -> dict:
    peaks = {}
    for length in lengths:
        for name in names:
            if name != "sdpa" and "eager" in name and HEADS * length * length * 4 / 2**30 > args.eager_max_gb:
                continue
            if args.device == "cuda":
                found, params, _ = candidates(1, length, True, "cuda", torch.bfloat16, 1e9)
                q, k, v = make_inputs(1, length, "cuda", torch.bfloat16, grad=True)
                leaves = [q, k, v] + [p.requires_grad_() for p in params.get(name, [])]
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                torch.autograd.grad(found[name](q, k, v).float().sum(), leaves)
                torch.cuda.synchronize()
                peaks[(name, length)] = (torch.cuda.max_memory_allocated() - base) / 2**20
            else:
                result = run_child(["--child", name, "--length", str(length)], __file__)
                peaks[(name, length)] = result and result["peak_mb"]
    return peaks


def describe_machine(device) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}, torch {torch.__version__}, Python {platform.python_version()}"
    )


def main_table(args) -> None:
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    batches = [1] if args.quick else [1, 8]
    lengths = args.lengths or ([256, 1024] if args.quick else [256, 1024, 4096])
    print(f"machine: {describe_machine(args.device)}")
    print(f"H={HEADS} D={DIM} {dtype}; best of interleaved rounds; x = time / sdpa time\n")
    one_loop = args.device == "cpu" and native.one_loop_available()  # else no block loop to compare with
    names = list(chosen(dict.fromkeys(n for n in CANDIDATES if one_loop or n != "ssa block loop"), args))
    header = f"{'B':>2} {'T':>5} {'causal':>6} {'pass':>8} {'sdpa ms':>9} " + " ".join(
        f"{n + ' x':>15}" for n in names[1:]
    )
    print(header)
    summary = {}
    for batch in batches:
        for length in lengths:
            for causal in (True, False):
                rows, skipped = time_shape(batch, length, causal, args, dtype)
                for kind, best in rows.items():
                    base = best["sdpa"]
                    cells = [
                        f"{best[n] / base:15.2f}" if n in best else f"{'skipped':>15}" for n in names[1:]
                    ]
                    print(
                        f"{batch:>2} {length:>5} {causal!s:>6} {kind:>8} {base * 1e3:9.2f} " + " ".join(cells)
                    )
                    if "ssa fused" in best:
                        summary[(batch, length, causal, kind)] = best["ssa fused"] / base
                for name, why in skipped.items():
                    print(f"{'':>33}{name} skipped: {why}")
                sys.stdout.flush()
    goals = GOALS[args.device]
    if 1024 not in lengths or "ssa fused" not in names:
        print("\ngoals at T=1024: not measured (T=1024 or ssa fused was not among the lengths or candidates)")
        goals = {}
    else:
        print("\ngoals at B=1, T=1024, causal and not (fused SSA / SDPA softmax):")
    for kind, goal in goals.items():
        got = [summary[(1, 1024, c, kind)] for c in (True, False) if (1, 1024, c, kind) in summary]
        verdict = "met" if max(got) <= goal else "MISSED"
        print(f"  {kind:>8}: {', '.join(f'{x:.2f}x' for x in got)} (goal <= {goal}x) -> {verdict}")
    memory_section(args, names)


def memory_section(args, names) -> None:
    mem_lengths = args.lengths or ([256, 1024] if args.quick else [256, 1024, 4096])
    print("\npeak memory of fwd+bwd, B=1, causal, MB over the memory before the call:")
    peaks = memory_table(args, mem_lengths, names)
    print(f"{'T':>5} " + " ".join(f"{n:>14}" for n in names))
    for length in mem_lengths:
        cells = []
        for name in names:
            value = peaks.get((name, length))
            cells.append(f"{value:14.1f}" if value is not None else f"{'-':>14}")
        print(f"{length:>5} " + " ".join(cells))
    first, last = mem_lengths[0], mem_lengths[-1]
    if last > first and peaks.get(("ssa fused", first)) and peaks.get(("ssa fused", last)):
        growth = peaks[("ssa fused", last)] / peaks[("ssa fused", first)]
        exponent = math.log(growth) / math.log(last / first)
        print(
            f"ssa fused: x{growth:.1f} from T={first} to T={last} (linear x{last // first}, quadratic "
            f"x{(last // first) ** 2}): grows as T^{exponent:.2f}"
        )


def check(args) -> bool:
    """Fused SSA against the eager scorer on this device: outputs and the gradients of q, k, v, b, n
    (fp32; outputs within 1e-4, gradients within 1e-3, relative to the largest reference value)."""
    ok = True
    backends = ["auto"] + (["flex"] if args.device == "cuda" else [])
    cases = [  # (B, H, H_kv, Q, K, causal, padding)
        (2, 8, 8, 257, 257, True, False), (2, 8, 2, 200, 200, True, True),
        (1, 8, 8, 100, 300, True, False), (2, 8, 4, 130, 130, False, True),
    ]  # fmt: skip
    for backend in backends:
        for batch, heads, kv_heads, q_len, k_len, causal, padding in cases:
            gen = torch.Generator().manual_seed(0)
            q = torch.randn(batch, heads, q_len, DIM, generator=gen).to(args.device).requires_grad_()
            k = torch.randn(batch, kv_heads, k_len, DIM, generator=gen).to(args.device).requires_grad_()
            v = torch.randn(batch, kv_heads, k_len, DIM, generator=gen).to(args.device).requires_grad_()
            scorer = make_scorer("ssa:b=0.8,n=1.5", num_heads=heads).to(args.device)
            with torch.no_grad():  # per-head values, so a head mix-up would show
                scorer.b_raw.add_(torch.linspace(-0.5, 0.5, heads, device=args.device))
                scorer.n_raw.add_(torch.linspace(0.5, -0.5, heads, device=args.device))
            mask = None
            if padding:  # the first 7 keys of batch row 0 are padding
                mask = torch.ones(batch, 1, q_len, k_len, dtype=torch.bool, device=args.device)
                mask[0, :, :, :7] = False
            visible = torch.ones(q_len, k_len, dtype=torch.bool, device=args.device)
            if causal:
                visible = visible.tril(k_len - q_len)
            visible = visible if mask is None else visible & mask
            groups = heads // kv_heads
            logits = torch.matmul(q, k.repeat_interleave(groups, 1).transpose(-1, -2)) * DIM**-0.5
            reference = torch.matmul(scorer(logits, visible), v.repeat_interleave(groups, 1))
            got = fused.ssa_attention(q, k, v, scorer.b, scorer.n, causal=causal, mask=mask, backend=backend)
            upstream = torch.randn_like(reference)
            leaves = (q, k, v, scorer.b_raw, scorer.n_raw)
            ref_grads = torch.autograd.grad(reference, leaves, upstream)
            got_grads = torch.autograd.grad(got, leaves, upstream)
            errors = [(got - reference).abs().max() / reference.abs().max().clamp_min(1)]
            errors += [(g - r).abs().max() / r.abs().max().clamp_min(1) for g, r in zip(got_grads, ref_grads)]
            errors = [float(e.detach()) for e in errors]
            passed = errors[0] <= 1e-4 and max(errors[1:]) <= 1e-3
            ok &= passed
            print(
                f"{'PASS' if passed else 'FAIL'} {backend:>7} B={batch} H={heads}/{kv_heads} Q={q_len} "
                f"K={k_len} causal={causal} padding={padding}: out {errors[0]:.1e}, grads q k v b n "
                + " ".join(f"{e:.1e}" for e in errors[1:])
            )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="B=1, T in {256, 1024} only")
    parser.add_argument(
        "--lengths", type=lambda text: [int(t) for t in text.split(",")], help="T values, e.g. 64,128"
    )
    parser.add_argument(
        "--candidates", type=lambda text: {t.strip() for t in text.split(",")},
        help="time only these, comma-separated, e.g. 'ssa fused,ssa eager' (sdpa, the base, always runs)",
    )  # fmt: skip
    parser.add_argument("--eager-max-gb", type=float, default=1.0, help="skip eager above this weight size")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--check", action="store_true", help="fused vs eager outputs and gradients, then exit"
    )
    parser.add_argument("--memory", action="store_true", help="only the peak-memory table")
    parser.add_argument("--blocks", action="store_true", help="forward ratio for a few block sizes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.candidates and args.candidates - set(CANDIDATES):
        unknown = sorted(args.candidates - set(CANDIDATES))
        parser.error(f"--candidates: unknown {unknown}; one of {CANDIDATES}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.check:
        sys.exit(0 if check(args) else 1)
    if args.child:
        memory_child(args)
    elif args.profile:
        profile(args)
    elif args.blocks:
        blocks(args)
    elif args.memory:
        memory_section(args, list(chosen(dict.fromkeys(CANDIDATES[:4]), args)))
    else:
        main_table(args)


if __name__ == "__main__":
    main()
