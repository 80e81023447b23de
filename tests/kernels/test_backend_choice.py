"""The one backend choice (ssacli.kernels.routing.choose_backend), decided from a call's plain facts,
so the CUDA decisions are tested here without a GPU: a CUDA call whose n needs a gradient never goes to
flex_attention, whose backward adds n's gradient with one atomic per score (12-187× SDPA on an H200,
docs/results/gpu-h200/gpu_bench-2.log); it goes to the Triton kernels where triton is installed and
the call fits them, else to the torch block math. On the CPU the native one loop, then the native
block math, then (nothing native) the torch block math; diagnose's statistics take the same CPU
ladder. The eager reference is chosen by the same function (scope "model": what a model's attention
call asks before its fused kernel). A forced backend= is returned as it is, or refused where it cannot
run; SSACLI_BACKEND is read where the caller says "auto". Each forced path is checked against the
reference in tests/kernels/test_fused.py (test_each_forced_path_matches_the_reference). Nothing here
imports triton."""

from __future__ import annotations

import sys

import pytest
import torch

from ssacli.errors import UsageError
from ssacli.kernels import fused, routing
from ssacli.kernels.routing import Call, choose_backend


def cuda(**facts) -> Call:
    """A bf16 CUDA training call with a learned n, triton installed, unless overridden."""
    base = dict(device="cuda", dtype=torch.bfloat16, training=True, n_grad=True, triton=True)
    return Call(**{**base, **facts})


@pytest.mark.parametrize(
    "facts, expected",
    [
        ({}, "triton"),  # learned n: the Triton kernels, no atomics
        ({"triton": False}, "torch-blocks"),  # learned n, no triton: not flex's atomic backward either
        ({"n_grad": False}, "flex"),  # n fixed (the recipe's distillation), b learned: flex's backward
        ({"n_grad": False, "training": False}, "flex"),  # inference
        ({"dtype": torch.float32}, "triton"),
        ({"dtype": torch.float16, "mask": True}, "triton"),  # padding masks, caches
        ({"dtype": torch.float64}, "torch-blocks"),  # the Triton kernels take 16- and 32-bit floats only
        ({"window": True}, "torch-blocks"),  # no sliding window in the Triton kernels yet
        ({"head_dim": 256}, "torch-blocks"),  # beyond the head sizes the kernels are tuned for
        ({"dropout": 0.1}, "torch-blocks"),  # only the blocked kernel drops weights
        ({"dropout": 0.1, "n_grad": False}, "torch-blocks"),
        ({"kind": "statistics"}, "torch-blocks"),  # nothing native on CUDA
        ({"native": "one-loop"}, "triton"),  # the native kernels are the CPU's
        ({"backend": "fused"}, "triton"),
    ],
)
def test_cuda_calls(facts, expected):
    assert choose_backend(cuda(**facts)) == expected


def cpu(**facts) -> Call:
    """A float32 CPU inference call where the native one loop runs, unless overridden."""
    return Call(**{**dict(device="cpu", dtype=torch.float32, native="one-loop"), **facts})


@pytest.mark.parametrize(
    "facts, expected",
    [
        ({}, "one-loop"),
        ({"training": True, "n_grad": True, "triton": True}, "one-loop"),  # never triton on the CPU
        ({"dtype": torch.bfloat16}, "one-loop"),  # computed in float32
        ({"mask": True}, "native-blocks"),  # a mask tensor: the block loop
        ({"dropout": 0.1}, "native-blocks"),
        ({"native": "blocks"}, "native-blocks"),  # no usable sgemm
        ({"native": ""}, "torch-blocks"),  # nothing native built
        ({"native": "", "training": True}, "torch-blocks"),
        ({"dtype": torch.float64}, "torch-blocks"),  # float64: nothing native computes it
        # diagnose's statistics: the same ladder
        ({"kind": "statistics"}, "one-loop"),
        ({"kind": "statistics", "mask": True}, "native-blocks"),  # not StatisticsCall.plain
        ({"kind": "statistics", "native": ""}, "torch-blocks"),
    ],
)
def test_cpu_calls(facts, expected):
    assert choose_backend(cpu(**facts)) == expected


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
        {"backend": "flex", "kind": "statistics"},  # flex and Triton run SSA attention only
        {"backend": "triton", "kind": "statistics"},
        {"backend": "blocks"},  # not a backend
    ],
)
def test_a_forced_path_that_cannot_run_here_is_refused(facts):
    with pytest.raises(ValueError, match="backend"):
        choose_backend(cpu(**facts))


@pytest.mark.parametrize("kind", ["attention", "statistics"])
def test_the_eager_reference_is_chosen_by_the_same_function(kind):
    """A model's call (scope "model") takes the reference where asked or where its weights are needed
    (whatever names a fast path), a fused kernel otherwise; "fused" refuses a call that needs them."""
    model = dict(kind=kind, scope="model")
    assert choose_backend(cpu(**model)) == "fused"
    assert choose_backend(cpu(**model, backend="eager")) == "eager"
    assert choose_backend(cpu(**model, backend="native-blocks")) == "fused"
    for backend in ("auto", "eager", "torch-blocks"):
        assert choose_backend(cpu(**model, backend=backend, weights_needed="a softcap")) == "eager"
    what = "fused statistics are" if kind == "statistics" else "fused attention is"
    with pytest.raises(UsageError, match=f"{what} not possible here: a softcap"):
        choose_backend(cpu(**model, backend="fused", weights_needed="a softcap"))
    assert choose_backend(cpu(kind=kind, backend="eager")) == "eager"


def test_ssacli_backend_is_read_where_the_caller_says_auto(monkeypatch):
    monkeypatch.delenv(routing.ENVIRONMENT, raising=False)
    assert routing.requested("auto") == "auto"
    monkeypatch.setenv(routing.ENVIRONMENT, "torch-blocks")
    assert routing.requested("auto") == "torch-blocks"
    assert routing.requested("one-loop") == "one-loop"  # an explicit backend= wins
    monkeypatch.setenv(routing.ENVIRONMENT, "sideways")
    with pytest.raises(UsageError, match="SSACLI_BACKEND takes auto, fused, eager"):
        routing.requested("auto")


def test_ssa_attention_routes_a_learned_n(monkeypatch):
    """ssa_attention(backend="auto") hands choose_backend the call's facts: n_grad follows n's
    requires_grad under grad mode, and the device, dtype and head size are the query's."""
    seen: list[Call] = []

    def spy(call: Call) -> str:
        seen.append(call)
        return "torch-blocks"

    monkeypatch.delenv(routing.ENVIRONMENT, raising=False)
    monkeypatch.setattr(routing, "choose_backend", spy)
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    n = torch.tensor(1.5, requires_grad=True)
    fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    fused.ssa_attention(q, q, q, 0.8, 1.5, causal=True)
    with torch.no_grad():
        fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    assert [c.n_grad for c in seen] == [True, False, False]
    assert [c.training for c in seen] == [True, True, False]
    assert {(c.device, c.dtype, c.head_dim, c.kind) for c in seen} == {("cpu", torch.float32, 8, "attention")}
    assert all(c.triton == routing.triton_installed() and c.backend == "auto" for c in seen)


def test_ssacli_backend_moves_ssa_attention_and_statistics(monkeypatch):
    """SSACLI_BACKEND reaches both kernels' choices (their backend= left at "auto")."""
    from ssacli.kernels.online_stats import softmax_statistics
    from ssacli.kernels.stats_call import StatisticsCall

    seen: list[Call] = []
    monkeypatch.setattr(routing, "choose_backend", lambda call: seen.append(call) or "torch-blocks")
    monkeypatch.setenv(routing.ENVIRONMENT, "torch-blocks")
    q = torch.randn(1, 2, 5, 8)
    fused.ssa_attention(q, q, q, 0.8, 1.5, causal=True)
    softmax_statistics(q, q, q, StatisticsCall(scaling=0.25, causal=True))
    assert [(c.kind, c.backend, c.native) for c in seen] == [
        ("attention", "torch-blocks", ""),  # a forced torch path looks nothing native up
        ("statistics", "torch-blocks", ""),
    ]


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
