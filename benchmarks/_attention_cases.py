"""What benchmarks/attention.py times: the shapes, their inputs and the candidate attentions (SDPA,
eager softmax and SSA, fused SSA, and on the CPU SSA's block loop); its tuning sweeps
(_attention_tuning.py) time the same inputs."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ssacli.kernels import fused, native
from ssacli.scorers import make_scorer

HEADS, DIM = 8, 64
B_SSA, N_SSA = 0.8, 1.5  # the paper's init


def make_inputs(batch, length, device, dtype, grad):
    gen = torch.Generator().manual_seed(0)
    shape = (batch, HEADS, length, DIM)
    q, k, v = (torch.randn(shape, generator=gen).to(device, dtype).requires_grad_(grad) for _ in range(3))
    return q, k, v


# every candidate's name, in the tables' order (candidates() below builds them)
CANDIDATES = ("sdpa", "softmax eager", "ssa eager", "ssa fused", "ssa block loop")


def candidates(batch, length, causal, device, dtype, eager_max_gb):
    """name -> (forward fn(q, k, v, params), params) for every candidate that fits."""
    scale = DIM**-0.5
    ssa_scorer = make_scorer(f"ssa:b={B_SSA},n={N_SSA}", num_heads=HEADS).to(device)
    softmax_scorer = make_scorer("softmax")
    b = torch.full((HEADS,), B_SSA, device=device)
    n = torch.full((HEADS,), N_SSA, device=device)
    visible = None
    if causal:
        visible = torch.ones(length, length, dtype=torch.bool, device=device).tril()

    def eager(scorer):
        def run(q, k, v):
            logits = torch.matmul(q, k.transpose(-1, -2)) * scale
            return torch.matmul(scorer(logits, visible).to(v.dtype), v)

        return run

    found = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "softmax eager": eager(softmax_scorer),
        "ssa eager": eager(ssa_scorer),
        "ssa fused": lambda q, k, v: fused.ssa_attention(q, k, v, b, n, scale=scale, causal=causal),
    }
    if device == "cpu" and native.one_loop_available():  # what the one loop adds over the block loop
        found["ssa block loop"] = lambda q, k, v: block_loop(q, k, v, b, n, scale, causal)
    weights_gb = batch * HEADS * length * length * 4 / 2**30
    skipped = {}
    if weights_gb > eager_max_gb:
        for name in ("softmax eager", "ssa eager"):
            found.pop(name)
            skipped[name] = f"{weights_gb:.1f} GB of weights > --eager-max-gb {eager_max_gb:g}"
    params = {"ssa eager": list(ssa_scorer.parameters()), "ssa fused": [b, n], "ssa block loop": [b, n]}
    return found, params, skipped


def block_loop(q, k, v, b, n, scale, causal):
    """ssa fused in the block loop (torch's matmuls and the native block pass), forward and backward: the
    path of calls with a mask tensor or dropout, or where torch's sgemm is not found."""
    return fused.ssa_attention(q, k, v, b, n, scale=scale, causal=causal, backend="native-blocks")


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()
