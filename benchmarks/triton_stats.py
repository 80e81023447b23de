"""diagnose's statistics in the Triton kernel on a GPU (issue 55): parity of every GPU path first, then
time and peak memory against SDPA. Not a test; scripts/gpu_bench.sh runs it in two time-limited steps.

    python benchmarks/triton_stats.py --device cuda --sections parity   # every GPU path vs float64
    python benchmarks/triton_stats.py --device cuda --sections time     # statistics vs SDPA, 4k-32k
    python benchmarks/triton_stats.py --device cpu --quick              # both, tiny, interpreted

Sections (each line printed as soon as it is measured, so a run cut by its time limit still reports):

* parity: on two shapes — bf16 GQA causal with a window (T = 1,000; inputs on a grid of eighths, so the
  bf16 logits are exact and the comparison measures the kernels' own arithmetic, as
  tests/kernels/test_triton_stats.py) and fp32 SSA decoding 17 of 700 keys behind a padding mask — the
  statistics of each GPU path (``triton``, the new kernel; ``torch-blocks``, the block math it replaces)
  against tests/helpers/float_reference.py's float64 formulas, every RowStatistics field, normalized
  errors (max |got − want| / max(1, max |want|)); and SSA attention's forward through each GPU path
  (``triton``, ``flex``, ``torch-blocks``) against float64 on the same shapes (relative norms).
* time: B = 1, H = 8, D = 64, causal, T in {4k, 8k, 32k}, bf16 and fp32: diagnose's statistics of one
  attention call (top-5, the position bins of a T-token run) in the Triton kernel, plain softmax and
  SSA, against SDPA's forward pinned to FlashAttention (bf16; FlashAttention takes no fp32, so fp32 is
  pinned to the memory-efficient kernel and says so) and SDPA's default; the torch block math where
  its time allows (T ≤ 8k). Peak memory over what was allocated before each call
  (torch.cuda.max_memory_allocated). Goals (issue 55): statistics ≤ 1.5× SDPA's forward at 4k–32k,
  peak ≤ 2× SDPA's in bf16.

--device cpu sets TRITON_INTERPRET=1 before the kernels are imported (the Triton interpreter on CPU
tensors; tiny sizes with --quick); SDPA's pinned kernels, flex's compiled path and peak memory do not
exist there and are reported as such. Times: median of --repeats after --warmup calls, each between
two device synchronizations, milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers: the float64 reference
from triton_ssa import Bench, arguments, attention_inputs, fmt, ratio, reference, run_sections  # noqa: E402

STATS_GOAL, MEMORY_GOAL = 1.5, 2.0
STATS_BOUND = 1e-5  # normalized error of every statistic (the interpreter's worst is 2.6e-7)
ATTENTION_BOUND = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # tests/kernels/test_triton_ssa.py's
FIELDS = ("max", "total", "spread", "top", "first", "target", "target_logit", "logit_sq", "logit_n",
          "key_mass", "distance_mass", "distance_sum")  # fmt: skip
B_SSA, N_SSA = 0.8, 1.5


def _error(have: torch.Tensor, want: torch.Tensor) -> float:
    have, want = torch.broadcast_tensors(have.double(), want.double())
    finite = torch.isfinite(want)
    same = (have == want) | (have.isnan() & want.isnan())
    if not bool((same | finite).all()) or not bool(torch.isfinite(have[finite]).all()):
        return math.inf
    if not finite.any():
        return 0.0
    return (have[finite] - want[finite]).abs().max().item() / max(1.0, want[finite].abs().max().item())


class Shape(NamedTuple):  # (not a dataclass: tests/contracts/test_benchmarks.py loads this file unregistered)
    label: str
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    k_len: int
    dtype: torch.dtype
    window: int | None  # causal with this window; None: a padding mask instead, not causal
    ssa: bool


def shapes(quick: bool) -> list[Shape]:
    t, w = (48, 16) if quick else (1000, 256)
    return [
        Shape(f"bf16 GQA 8/2 causal window {w}, softmax", 2, 8, 2, t, t, torch.bfloat16, w, False),
        Shape("fp32 SSA decode 17 of 700, padding", 2, 4, 4, 17, 48 if quick else 700, torch.float32, None,
              True),
    ]  # fmt: skip


def parity_inputs(shape: Shape, device):
    gen = torch.Generator().manual_seed(3)
    sizes = [(shape.batch, shape.heads, shape.q_len, 64), (shape.batch, shape.kv_heads, shape.k_len, 64),
             (shape.batch, shape.kv_heads, shape.k_len, 64)]  # fmt: skip
    if shape.dtype == torch.bfloat16:  # eighths: exact products, so bf16 logits equal the reference's
        q, k, v = (torch.randint(-12, 13, s, generator=gen).double() / 8 for s in sizes)
    else:
        q, k, v = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in sizes)
    return [t.to(device, shape.dtype) for t in (q, k, v)]


def parity_call(shape: Shape, device):
    """(StatisticsCall, the visible keys [b, 1, q, k], b, n, the mask or None) of one parity shape."""
    from ssacli.diagnosis.positions import run_bins
    from ssacli.kernels.ssa_transform import ssa_transform
    from ssacli.kernels.stats_call import StatisticsCall

    pos = torch.arange(shape.k_len - shape.q_len, shape.k_len, device=device)[:, None]
    keys = torch.arange(shape.k_len, device=device)[None]
    mask = None
    if shape.window is not None:
        shown = ((keys <= pos) & (pos - keys < shape.window)).expand(shape.batch, 1, -1, -1)
    else:
        mask = torch.ones(shape.batch, 1, shape.q_len, shape.k_len, dtype=torch.bool, device=device)
        mask[-1, ..., shape.k_len - shape.k_len // 3 :] = False
        shown = mask
    b = torch.linspace(0.6, 1.2, shape.heads, device=device)
    n = torch.linspace(1.0, 2.0, shape.heads, device=device)
    transform = None
    if shape.ssa:

        def transform(x, count):
            return ssa_transform(x, n.view(-1, 1, 1), b.view(-1, 1, 1))

    call = StatisticsCall(
        scaling=0.125, mask=mask, causal=shape.window is not None, window=shape.window,
        transform=transform, ssa=(b, n) if shape.ssa else None, target=torch.tensor([2, 5], device=device),
        top_k=5, positions=run_bins(shape.k_len),
    )  # fmt: skip
    return call, shown, b, n, mask


def parity_reference(shape: Shape, q, k, v, call, shown) -> dict:
    """The float64 statistics (tests/helpers/float_reference.py), logits formed as the eager path does."""
    from tests.helpers.float_reference import logit_statistics

    group = shape.heads // shape.kv_heads
    k64, v64 = (t.double().repeat_interleave(group, 1) for t in (k, v))
    x = q.double() @ k64.transpose(-1, -2)
    if shape.dtype != torch.float32:  # a 16-bit product, then the scaling in 16 bits
        x = (x.to(shape.dtype).double() * call.scaling).to(shape.dtype).double()
    else:
        x = x * call.scaling
    t = x
    if call.ssa is not None:
        b, n = (p.double().view(-1, 1, 1) for p in call.ssa)
        t = n * torch.sign(x) * torch.log1p(b * x.abs())
    bins = (call.positions.sink_k, call.positions.bin_width)
    return logit_statistics(x, shown, v64, call.target, call.top_k, t=t, bins=bins)


def parity(bench: Bench) -> int:
    from ssacli.kernels.fused import ssa_attention
    from ssacli.kernels.online_stats import softmax_statistics

    failed = 0
    for shape in shapes(bench.args.quick):
        q, k, v = parity_inputs(shape, bench.device)
        call, shown, b, n, mask = parity_call(shape, bench.device)
        want = parity_reference(shape, q, k, v, call, shown)
        for path in ("triton", "torch-blocks"):
            began = time.perf_counter()
            try:
                out, got = softmax_statistics(q, k, v, call, backend=path)
            except Exception as err:  # noqa: BLE001 - a path that cannot run is reported, not fatal
                print(f"FAIL statistics {path:12} {shape.label}: {type(err).__name__}: {err}", flush=True)
                failed += 1
                continue
            seconds = time.perf_counter() - began
            errors = {name: _error(getattr(got, name), want[name]) for name in FIELDS}
            worst = max(errors, key=errors.get)
            out_err = ((out.double() - want["out"]).norm() / want["out"].norm()).item()
            ok = errors[worst] <= STATS_BOUND and out_err <= ATTENTION_BOUND[shape.dtype]
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} statistics {path:12} {shape.label}: worst {worst} "
                  f"{errors[worst]:.1e} (bound {STATS_BOUND:g}), output {out_err:.1e}; first call "
                  f"{seconds:.1f} s", flush=True)  # fmt: skip
        failed += attention_parity(bench, shape, (q, k, v, b, n, mask), ssa_attention)
    return failed


def attention_parity(bench: Bench, shape: Shape, inputs, ssa_attention) -> int:
    """SSA attention's forward through each GPU path against float64 (relative norm)."""
    q, k, v, b, n, mask = inputs
    causal = shape.window is not None  # the attention paths take no window: the causal band alone
    want = reference(*(t.double() for t in (q, k, v, b, n)), causal, mask)
    failed = 0
    for path in ("triton", "flex", "torch-blocks"):
        if bench.left() < 0:
            print(f"  attention {path}: not run: out of time", flush=True)
            continue
        began = time.perf_counter()
        try:
            with torch.no_grad():
                out = ssa_attention(q, k, v, b, n, causal=causal, mask=mask, backend=path)
        except Exception as err:  # noqa: BLE001
            print(f"  n/a attention  {path:12} {shape.label}: {type(err).__name__}: {str(err)[:100]}")
            continue
        err = ((out.double() - want).norm() / want.norm()).item()
        ok = err <= ATTENTION_BOUND[shape.dtype]
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} attention  {path:12} {shape.label}: output {err:.1e} "
              f"(bound {ATTENTION_BOUND[shape.dtype]:g}); first call {time.perf_counter() - began:.1f} s",
              flush=True)  # fmt: skip
    return failed


def peak_ms(bench: Bench, fn) -> tuple[str | float, float]:
    """(median ms or why none, peak MB over what was allocated before one call; NaN off CUDA)."""
    ms = bench.measure(fn)
    if not bench.cuda or not isinstance(ms, float):
        return ms, math.nan
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    kept = fn()  # noqa: F841  (alive until the peak is read)
    torch.cuda.synchronize()
    return ms, (torch.cuda.max_memory_allocated() - before) / 2**20


NAMES = ("sdpa-pinned", "sdpa-default", "stats-triton", "stats-triton-ssa", "stats-torch-blocks")


def time_row(bench: Bench, dtype: torch.dtype, length: int, heads: int, dim: int) -> str:
    """One table row: every candidate's median ms and peak MB, and the goal ratios."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ssacli.diagnosis.positions import run_bins
    from ssacli.kernels.online_stats import softmax_statistics
    from ssacli.kernels.ssa_transform import ssa_transform
    from ssacli.kernels.stats_call import StatisticsCall

    # FlashAttention takes no float32: fp32 is pinned to the memory-efficient kernel
    pinned = SDPBackend.FLASH_ATTENTION if dtype != torch.float32 else SDPBackend.EFFICIENT_ATTENTION
    inputs = attention_inputs(1, heads, heads, length, length, dim, dtype, bench.device)
    q, k, v = (t.detach() for t in inputs)
    bn = tuple(torch.full((heads,), x, device=bench.device) for x in (B_SSA, N_SSA))
    plain = StatisticsCall(scaling=dim**-0.5, causal=True, top_k=5, positions=run_bins(length))
    ssa = dataclasses.replace(plain, ssa=bn, transform=lambda x, c: ssa_transform(x, N_SSA, B_SSA))

    def sdpa_pinned():
        with sdpa_kernel(pinned):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    calls = {
        "sdpa-pinned": sdpa_pinned if bench.cuda else None,
        "sdpa-default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "stats-triton": lambda: softmax_statistics(q, k, v, plain, backend="triton"),
        "stats-triton-ssa": lambda: softmax_statistics(q, k, v, ssa, backend="triton"),
        "stats-torch-blocks": lambda: softmax_statistics(q, k, v, plain, backend="torch-blocks"),
    }
    if length > (8192 if not bench.args.quick else 32):  # the block math at 32k: seconds per call
        calls["stats-torch-blocks"] = None
    got = {name: peak_ms(bench, fn) if fn else ("not run here", math.nan) for name, fn in calls.items()}
    (base_ms, base_mb), (tri_ms, tri_mb) = got["sdpa-pinned"], got["stats-triton"]
    cells = [f"{fmt(ms)} ({mb:.0f} MB)" if mb == mb else fmt(ms) for ms, mb in got.values()]
    time_x = ratio(tri_ms, base_ms)
    mem_x = tri_mb / base_mb if base_mb == base_mb and base_mb > 0 else None

    def verdict(x, goal):
        if not bench.cuda:
            return "no verdict off a GPU"
        return "-" if x is None else f"{x:.2f} {'MET' if x <= goal else 'MISSED'}"

    mem_cell = verdict(mem_x, MEMORY_GOAL) if dtype == torch.bfloat16 else (f"{mem_x:.2f}" if mem_x else "-")
    label = str(dtype).replace("torch.", "") + (f" ({pinned.name.lower()})" if bench.cuda else "")
    return f"| {label} | {length} | " + " | ".join(cells) + f" | {verdict(time_x, STATS_GOAL)} | {mem_cell} |"


def time_section(bench: Bench) -> None:
    a = bench.args
    lengths = [4096, 8192, 32768] if not a.quick else [32]
    heads, dim = 8, 64
    print(f"\n## time: one attention call, B=1 H={heads} D={dim} causal; ms (median of {a.repeats}), peak MB")
    print("| dtype (sdpa pinned to) | T | " + " | ".join(NAMES) + " | triton / pinned (goal ≤ 1.5) "
          "| triton MB / pinned MB (goal ≤ 2, bf16) |")  # fmt: skip
    print("|---|---:|" + "---:|" * (len(NAMES) + 2))
    for dtype in (torch.bfloat16, torch.float32):
        for length in lengths:
            if bench.left() < 0:
                print(f"| {str(dtype).replace('torch.', '')} | {length} | not run: out of time |", flush=True)
                continue
            print(time_row(bench, dtype, length, heads, dim), flush=True)
            if bench.cuda:
                torch.cuda.empty_cache()


SECTIONS = ("parity", "time")


def main() -> int:
    args, sections = arguments(__doc__, SECTIONS)
    bench = Bench(args)
    return run_sections(sections, {"parity": lambda: parity(bench), "time": lambda: time_section(bench)})


if __name__ == "__main__":
    sys.exit(main())
