"""The one backend choice (ssacli.kernels.routing.choose_backend), decided from a call's plain facts,
so the CUDA decisions are tested here without a GPU: a CUDA call whose n needs a gradient never goes to
flex_attention, whose backward adds n's gradient with one atomic per score (12-187× SDPA on an H200,
docs/results/gpu-h200/gpu_bench-2.log); it goes to the Triton kernels where triton is installed and
the call fits them, else to the torch block math. On the CPU the native one loop, then the native
block math, then (nothing native) compiled flex for large inference calls or the torch block math;
diagnose's statistics take the same ladder (backend="blocked"). A forced backend= is returned as
it is, or refused where it cannot run. Each forced path is checked against the reference in
tests/kernels/test_fused.py (test_each_forced_path_matches_the_reference). Nothing here imports triton."""

from __future__ import annotations

import sys

import pytest
import torch

from ssacli.kernels import fused, routing
from ssacli.kernels.routing import Call, choose_backend


def cuda(**facts) -> Call:
    """A bf16 CUDA training call of 4,096² logits with a learned n, triton installed, unless overridden."""
    base = dict(device="cuda", dtype=torch.bfloat16, logits=2**24, training=True, n_grad=True, triton=True)
    return Call(**{**base, **facts})


@pytest.mark.parametrize(
    "facts, expected",
    [
        ({}, "triton"),  # learned n: the Triton kernels, no atomics
        ({"triton": False}, "torch-blocks"),  # learned n, no triton: not flex's atomic backward either
        ({"n_grad": False}, "flex"),  # n fixed (the recipe's distillation), b learned: flex's backward
        ({"n_grad": False, "training": False}, "flex"),  # inference
        ({"dtype": torch.float32}, "triton"),
        ({"dtype": torch.float16, "masked": True, "mask": True}, "triton"),  # padding masks, caches
        ({"dtype": torch.float64}, "torch-blocks"),  # the Triton kernels take 16- and 32-bit floats only
        ({"window": True}, "torch-blocks"),  # no sliding window in the Triton kernels yet
        ({"head_dim": 256}, "torch-blocks"),  # beyond the head sizes the kernels are tuned for
        ({"dropout": 0.1}, "torch-blocks"),  # only the blocked kernel drops weights
        ({"dropout": 0.1, "n_grad": False}, "torch-blocks"),
        ({"backend": "blocked"}, "torch-blocks"),  # nothing native on CUDA
        ({"native": "one-loop"}, "triton"),  # the native kernels are the CPU's
    ],
)
def test_cuda_calls(facts, expected):
    assert choose_backend(cuda(**facts)) == expected


def cpu(**facts) -> Call:
    """A float32 CPU inference call of 2**24 logits where the native one loop runs, unless overridden."""
    return Call(**{**dict(device="cpu", dtype=torch.float32, logits=2**24, native="one-loop"), **facts})


@pytest.mark.parametrize(
    "facts, expected",
    [
        ({}, "one-loop"),
        ({"training": True, "n_grad": True, "triton": True}, "one-loop"),  # never triton on the CPU
        ({"dtype": torch.bfloat16}, "one-loop"),  # computed in float32
        ({"mask": True, "masked": True}, "native-blocks"),  # a mask tensor: the block loop
        ({"dropout": 0.1}, "native-blocks"),
        ({"native": "blocks"}, "native-blocks"),  # no usable sgemm
        ({"native": ""}, "flex"),  # nothing native: compiled flex for large inference calls
        ({"native": "", "training": True}, "torch-blocks"),  # flex has no CPU backward
        ({"native": "", "masked": True}, "torch-blocks"),  # nor a compilable CPU mask or window
        ({"native": "", "dropout": 0.1}, "torch-blocks"),  # nor dropout
        ({"native": "", "logits": 2**19 - 1}, "torch-blocks"),  # below FLEX_CPU_MIN_LOGITS
        ({"dtype": torch.float64}, "flex"),  # float64: nothing native
        ({"dtype": torch.float64, "training": True}, "torch-blocks"),
        # diagnose's statistics: the blocked ladder alone (no flex)
        ({"backend": "blocked"}, "one-loop"),
        ({"backend": "blocked", "mask": True}, "native-blocks"),  # not StatisticsCall.plain
        ({"backend": "blocked", "native": ""}, "torch-blocks"),
    ],
)
def test_cpu_calls(facts, expected):
    assert choose_backend(cpu(**facts)) == expected


def test_cpu_flex_needs_the_compiler(monkeypatch):
    monkeypatch.setenv("SSACLI_COMPILE", "0")
    assert choose_backend(cpu(native="")) == "torch-blocks"
    monkeypatch.delenv("SSACLI_COMPILE")
    monkeypatch.setattr(routing, "FLEX_CPU_FAILED", ["a failed compilation"])
    assert choose_backend(cpu(native="")) == "torch-blocks"


@pytest.mark.parametrize("path", ["one-loop", "native-blocks", "torch-blocks", "flex", "triton"])
def test_a_forced_path_is_returned_as_it_is(path):
    assert choose_backend(cpu(backend=path)) == path


@pytest.mark.parametrize(
    "facts",
    [
        {"backend": "one-loop", "native": "blocks"},
        {"backend": "one-loop", "mask": True},
        {"backend": "one-loop", "dropout": 0.1},
        {"backend": "one-loop", "device": "cuda"},
        {"backend": "native-blocks", "native": ""},
        {"backend": "native-blocks", "dtype": torch.float64},
        {"backend": "blocks"},  # not a backend
    ],
)
def test_a_forced_path_that_cannot_run_here_is_refused(facts):
    with pytest.raises(ValueError, match="backend"):
        choose_backend(cpu(**facts))


def test_the_native_facts_come_from_the_native_module():
    """native=None (what ssa_attention and softmax_statistics pass) asks ssacli.kernels.native, so
    native.disabled() moves the choice down the ladder."""
    from ssacli.kernels import native

    if not native.flash_available():
        pytest.skip("the native kernel or torch's sgemm is not available here")
    assert choose_backend(cpu(native=None, backend="blocked")) == "one-loop"
    with native.disabled(flash_only=True):
        assert choose_backend(cpu(native=None, backend="blocked")) == "native-blocks"
    with native.disabled():
        assert choose_backend(cpu(native=None, backend="blocked")) == "torch-blocks"


def test_ssa_attention_routes_a_learned_n(monkeypatch):
    """ssa_attention(backend="auto") hands choose_backend the call's facts: n_grad follows n's
    requires_grad under grad mode, and the device, dtype and head size are the query's."""
    seen: list[Call] = []

    def spy(call: Call) -> str:
        seen.append(call)
        return "torch-blocks"

    monkeypatch.setattr(routing, "choose_backend", spy)
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    n = torch.tensor(1.5, requires_grad=True)
    fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    fused.ssa_attention(q, q, q, 0.8, 1.5, causal=True)
    with torch.no_grad():
        fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    assert [c.n_grad for c in seen] == [True, False, False]
    assert [c.training for c in seen] == [True, True, False]
    assert {(c.device, c.dtype, c.head_dim, c.logits) for c in seen} == {("cpu", torch.float32, 8, 50)}
    assert all(c.triton == routing.triton_installed() and c.backend == "auto" for c in seen)


def test_triton_is_found_not_imported():
    """Deciding needs to know whether triton is there, not to import it (about a second)."""
    before = "triton" in sys.modules
    routing.triton_installed()
    assert ("triton" in sys.modules) == before


def test_triton_backend_without_triton_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as if not installed: importing it raises
    monkeypatch.setitem(sys.modules, "ssacli.kernels.triton_ssa", None)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"ssacli\[gpu\]"):
        fused.ssa_attention(q, q, q, 0.8, 1.5, backend="triton")
