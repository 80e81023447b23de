"""backend="auto" (ssacli.kernels.fused.choose_backend), decided from a call's plain facts, so the
CUDA decisions are tested here without a GPU: a CUDA call whose n needs a gradient never goes to
flex_attention, whose backward adds n's gradient with one atomic per score (12-187× SDPA on an H200,
docs/results/gpu-h200/gpu_bench-2.log); it goes to the Triton kernels where triton is installed and
the call fits them, else to the blocked kernel. Nothing here imports triton."""

from __future__ import annotations

import sys

import pytest
import torch

from ssacli.kernels import fused
from ssacli.kernels.fused import Call, choose_backend


def cuda(**facts) -> Call:
    """A bf16 CUDA training call of 4,096² logits with a learned n, triton installed, unless overridden."""
    base = dict(device="cuda", dtype=torch.bfloat16, logits=2**24, training=True, n_grad=True, triton=True)
    return Call(**{**base, **facts})


@pytest.mark.parametrize(
    "facts, expected",
    [
        ({}, "triton"),  # learned n: the Triton kernels, no atomics
        ({"triton": False}, "blocked"),  # learned n, no triton: not flex's atomic backward either
        ({"n_grad": False}, "flex"),  # n fixed (the recipe's distillation), b learned: flex's backward
        ({"n_grad": False, "training": False}, "flex"),  # inference
        ({"dtype": torch.float32}, "triton"),
        ({"dtype": torch.float16, "masked": True}, "triton"),  # padding masks and caches are supported
        ({"dtype": torch.float64}, "blocked"),  # the Triton kernels take 16- and 32-bit floats only
        ({"window": True}, "blocked"),  # no sliding window in the Triton kernels yet
        ({"head_dim": 256}, "blocked"),  # beyond the head sizes the kernels are tuned for
        ({"dropout": 0.1}, "blocked"),  # only the blocked kernel drops weights
        ({"dropout": 0.1, "n_grad": False}, "blocked"),
    ],
)
def test_cuda_calls(facts, expected):
    assert choose_backend(cuda(**facts)) == expected


@pytest.mark.parametrize("n_grad", [False, True])
def test_cpu_calls_never_take_triton(n_grad):
    """The CPU keeps its rules (blocked or compiled flex) whether or not n is learned and triton is
    installed: the Triton kernels run on CUDA."""
    for training in (False, True):
        call = Call("cpu", torch.float32, 2**24, training=training, n_grad=n_grad and training, triton=True)
        assert choose_backend(call) in ("blocked", "flex")


def test_ssa_attention_routes_a_learned_n(monkeypatch):
    """ssa_attention(backend="auto") hands choose_backend the call's facts: n_grad follows n's
    requires_grad under grad mode, and the device, dtype and head size are the query's."""
    seen: list[Call] = []

    def spy(call: Call) -> str:
        seen.append(call)
        return "blocked"

    monkeypatch.setattr(fused, "choose_backend", spy)
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    n = torch.tensor(1.5, requires_grad=True)
    fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    fused.ssa_attention(q, q, q, 0.8, 1.5, causal=True)
    with torch.no_grad():
        fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    assert [c.n_grad for c in seen] == [True, False, False]
    assert [c.training for c in seen] == [True, True, False]
    assert {(c.device, c.dtype, c.head_dim, c.logits) for c in seen} == {("cpu", torch.float32, 8, 50)}
    assert all(c.triton == fused.triton_installed() for c in seen)


def test_triton_is_found_not_imported():
    """Deciding needs to know whether triton is there, not to import it (about a second)."""
    before = "triton" in sys.modules
    fused.triton_installed()
    assert ("triton" in sys.modules) == before


def test_triton_backend_without_triton_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as if not installed: importing it raises
    monkeypatch.setitem(sys.modules, "ssacli.kernels.triton_ssa", None)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"ssacli\[gpu\]"):
        fused.ssa_attention(q, q, q, 0.8, 1.5, backend="triton")
