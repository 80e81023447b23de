"""The sweeps behind benchmarks/attention.py's tuning flags: where the fused forward's time goes
(--profile) and the block sizes of ssacli.kernels.blocked (--blocks). Each prints its own table; none
is part of the main table."""

from __future__ import annotations

import time

import torch
from _attention_cases import B_SSA, DIM, HEADS, N_SSA, make_inputs
from _common import interleaved_best
from torch.nn import functional as F

from ssacli.kernels import fused, native
from ssacli.kernels.ssa_transform import ssa_transform


def profile(args) -> None:
    """Operator profile of the fused forward at B=1, T=1024, causal, next to SDPA; and torch's
    compiled flex_attention with the same score_mod on the CPU (forward only: no CPU backward)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torch.profiler import profile as torch_profile

    q, k, v = make_inputs(1, 1024, args.device, torch.float32, grad=False)
    b, n = torch.full((HEADS,), B_SSA), torch.full((HEADS,), N_SSA)
    flex = torch.compile(flex_attention, dynamic=False)
    causal_blocks = create_block_mask(lambda _b, _h, qi, ki: qi >= ki, None, None, 1024, 1024, device="cpu")
    scaled = q * (b * DIM**-0.5).view(1, HEADS, 1, 1)

    def score_mod(score, _b, h, _q, _k):
        return ssa_transform(score, n[h])

    def fused_forward():
        return fused.ssa_attention(q, k, v, b, n, causal=True)

    with torch.no_grad():
        half = torch.rand(1, HEADS, 512, 1024)  # as many logits as a causal T=1024 call scores
        for _ in range(3):
            fused_forward()
        start = time.perf_counter()
        flex(scaled, k, v, score_mod=score_mod, block_mask=causal_blocks, scale=1.0)
        print(f"compiling flex_attention with the SSA score_mod (CPU): {time.perf_counter() - start:.1f} s")
        best = interleaved_best(
            {
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                "ssa fused": fused_forward,
                "flex_attention SSA, compiled (CPU)": lambda: flex(
                    scaled, k, v, score_mod=score_mod, block_mask=causal_blocks, scale=1.0
                ),
                "log1p alone, 1 pass over T*T/2 logits": lambda: torch.log1p(half),
                "exp alone, same": lambda: torch.exp(half),
                "q.kT alone, all T*T logits (bmm)": lambda: torch.matmul(q, k.transpose(-1, -2)),
            },
            args.repeats,
        )
        for name, seconds in best.items():
            print(f"{name:>40}: {seconds * 1e3:7.2f} ms")
        with torch_profile() as prof:
            for _ in range(5):
                fused_forward()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def blocks(args) -> None:
    """Time of the blocked kernel / SDPA for a few block sizes (rows x keys), B = 1, forward and
    forward+backward: the sweep behind ssacli.kernels.blocked.BLOCK_ROWS / BLOCK_KEYS."""
    from ssacli.kernels import blocked

    default = (blocked.BLOCK_ROWS, blocked.BLOCK_KEYS, native.BACKWARD_KEYS)
    others = [(64, 1024, 256), (256, 1024, 256), (128, 512, 256), (128, 2048, 256), (128, 1024, 128),
              (128, 1024, 512)]  # fmt: skip
    settings = [default] + [s for s in others if s != default]
    b, n = torch.full((HEADS,), B_SSA), torch.full((HEADS,), N_SSA)
    print(
        "blocked SSA / sdpa, B=1, for block_rows x block_keys / the one-loop backward's keys "
        f"(default {default[0]}x{default[1]}/{default[2]}; the backward's keys matter only in fwd+bwd):"
    )

    def run(fn, grad, upstream, backward_keys=None):
        def call():
            before = native.BACKWARD_KEYS
            native.BACKWARD_KEYS = backward_keys or before  # read when the forward saves its context
            try:
                out = fn()
                if grad:
                    out.backward(upstream)
            finally:
                native.BACKWARD_KEYS = before

        return call

    for length in (1024, 4096):
        for grad in (False, True):
            qkv = make_inputs(1, length, "cpu", torch.float32, grad=grad)
            upstream = torch.randn_like(qkv[0])
            for causal in (True, False):
                fns = {
                    "sdpa": run(
                        lambda c=causal, qkv=qkv: F.scaled_dot_product_attention(*qkv, is_causal=c),
                        grad,
                        upstream,
                    )
                }
                for r, c, back in settings:
                    call = lambda r=r, c=c, causal=causal, qkv=qkv: fused.ssa_attention(  # noqa: E731
                        *qkv, b, n, causal=causal, block_rows=r, block_keys=c, backend="auto"
                    )
                    fns[f"{r}x{c}/{back}"] = run(call, grad, upstream, back)
                with torch.set_grad_enabled(grad):
                    best = interleaved_best(fns, args.repeats)
                cells = " ".join(
                    f"{name} {t / best['sdpa']:.2f}" for name, t in best.items() if name != "sdpa"
                )
                kind = "fwd+bwd" if grad else "fwd"
                print(f"  T={length} {kind:>7} causal={causal!s:>5}: {cells}", flush=True)
