"""The one backend choice (ssacli.kernels.routing.choose_backend), decided from a call's plain facts, so
the CUDA decisions are tested here without a GPU: a CUDA call whose n needs a gradient never goes to
flex_attention, whose backward adds n's gradient with one atomic per score (12-187× SDPA on an H200,
docs/results/gpu-h200/gpu_bench-2.log); it goes to the Triton kernels where triton is installed and the
call fits them, else to the torch block math. diagnose's statistics on CUDA go to the Triton statistics
kernel where triton is installed and the call has nothing the kernel lacks (a probe on the logits, a
softcap, a sink...: ssacli.kernels.stats_call.triton_lacks), else to the torch block math;
tests/kernels/test_triton_stats.py holds that kernel against float64. On the CPU the native one loop,
then the native block math, then (nothing native) the torch block math; diagnose's statistics take the
same CPU ladder. The eager reference is chosen by the same function (scope "model": what a model's
attention call asks before its fused kernel). A forced backend= is returned as it is, or refused where
it cannot run; SSACLI_BACKEND is read where the caller says "auto". Each forced path is checked against
the reference in tests/kernels/test_fused.py (test_each_forced_path_matches_the_reference). Nothing here
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
        ({"kind": "statistics"}, "torch-blocks"),  # a statistics call the Triton kernel lacks a term of
        ({"native": "one-loop"}, "triton"),  # the native kernels are the CPU's
        ({"backend": "fused"}, "triton"),
    ],
)
def test_cuda_calls(facts, expected):
    assert choose_backend(cuda(**facts)) == expected


def cuda_statistics(**facts) -> Call:
    """A CUDA statistics call (compute dtype float32, so bf16 inputs too) of plain softmax or SSA with
    nothing else on the logits (ssacli.kernels.stats_call.triton_lacks found nothing), triton installed,
    unless overridden."""
    base = dict(device="cuda", dtype=torch.float32, kind="statistics", triton=True, triton_stats=True)
    return Call(**{**base, **facts})


@pytest.mark.parametrize(
    "facts, expected",
    [
        ({}, "triton"),  # one kernel per call, not dozens of small ones per block
        ({"window": True}, "triton"),  # the statistics kernel takes windows (the attention kernels do not)
        ({"mask": True}, "triton"),  # a mask tensor: the CPU one loop's limit, not the Triton kernel's
        ({"head_dim": 128}, "triton"),
        ({"native": "one-loop"}, "triton"),  # the native kernels are the CPU's
        ({"backend": "fused"}, "triton"),
        ({"triton": False}, "torch-blocks"),  # no triton installed
        ({"triton_stats": False}, "torch-blocks"),  # a probe on the logits, a softcap, a sink, ...
        ({"dtype": torch.float64}, "torch-blocks"),  # float64 math: the kernel accumulates in float32
        ({"head_dim": 256}, "torch-blocks"),  # beyond the head sizes it is laid out for
        ({"backend": "torch-blocks"}, "torch-blocks"),
        ({"backend": "triton", "triton_stats": False}, "triton"),  # forced: the kernel refuses itself
        ({"scope": "model"}, "fused"),  # a model's call asks for the fused pass, which then decides
        ({"device": "cpu", "native": "one-loop"}, "one-loop"),  # never Triton on the CPU
        ({"device": "cpu"}, "torch-blocks"),  # nothing native built there
    ],
)
def test_cuda_statistics_calls(facts, expected):
    assert choose_backend(cuda_statistics(**facts)) == expected


def test_the_statistics_facts_name_what_the_triton_kernel_lacks():
    """ssacli.kernels.stats_call.triton_lacks, the fact behind Call.triton_stats: plain softmax or
    SSA's transform (with its b and n as data), a causal band, a window, a boolean mask or a float one
    that adds nothing, float16/bfloat16/float32 inputs; anything else is named."""
    from ssacli.kernels.stats_call import StatisticsCall, triton_lacks

    q = torch.zeros(1, 2, 3, 4)
    hidden = torch.eye(3, dtype=torch.bool)
    fits = [
        StatisticsCall(scaling=1.0, causal=True, window=2),
        StatisticsCall(scaling=1.0, transform=lambda x, c: x, ssa=(torch.ones(2), torch.ones(2))),
        StatisticsCall(scaling=1.0, mask=torch.ones(1, 1, 3, 3, dtype=torch.bool)),
        StatisticsCall(scaling=1.0, mask=torch.zeros(1, 1, 3, 3).masked_fill(hidden, -3e38)),
    ]
    for call in fits:
        assert triton_lacks(call, q) is None
        assert triton_lacks(call, q.bfloat16()) is None
    assert triton_lacks(fits[0], q.double()) == "torch.float64 inputs"
    lacking = {
        "a softcap": dict(softcap=30.0), "a position bias": dict(position_bias=torch.zeros(1, 2, 3, 3)),
        "a probe on the logits": dict(probe=lambda x, cols: x), "a learned sink": dict(sink=torch.zeros(1)),
        "a keyless term": dict(keyless=torch.zeros(1, 2, 1)),
        "a transform other than SSA's": dict(transform=lambda x, c: x * 2),
        "a float mask that adds a bias": dict(mask=torch.full((1, 1, 3, 3), 0.5)),
    }  # fmt: skip
    for reason, part in lacking.items():
        assert triton_lacks(StatisticsCall(scaling=1.0, **part), q) == reason


@pytest.fixture
def asked(monkeypatch) -> list[Call]:
    """The Calls handed to choose_backend from here on (each answered "torch-blocks")."""
    seen: list[Call] = []

    def spy(call: Call) -> str:
        seen.append(call)
        return "torch-blocks"

    monkeypatch.delenv(routing.ENVIRONMENT, raising=False)
    monkeypatch.setattr(routing, "choose_backend", spy)
    return seen


def test_statistics_calls_hand_choose_backend_their_facts(asked):
    """softmax_statistics asks choose_backend with the call's facts: the head size, the window, and
    on the CPU no Triton (whatever is installed), so a CPU call never reads the kernel's facts."""
    from ssacli.kernels import online_stats
    from ssacli.kernels.stats_call import StatisticsCall

    q = torch.randn(1, 2, 5, 8)
    online_stats.softmax_statistics(q, q, q, StatisticsCall(scaling=0.5, causal=True, window=3))
    (call,) = asked
    assert (call.kind, call.device, call.head_dim, call.window) == ("statistics", "cpu", 8, True)
    assert not call.triton and not call.triton_stats


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
    if path != "flex":  # flex runs SSA attention only
        assert choose_backend(cpu(backend=path, kind="statistics")) == path


@pytest.mark.parametrize(
    "facts",
    [
        {"backend": "one-loop", "native": "blocks"},
        {"backend": "one-loop", "mask": True},
        {"backend": "one-loop", "dropout": 0.1},
        {"backend": "one-loop", "device": "cuda"},
        {"backend": "native-blocks", "native": ""},
        {"backend": "native-blocks", "dtype": torch.float64},
        {"backend": "flex", "kind": "statistics"},  # flex runs SSA attention only
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


def test_ssa_attention_routes_a_learned_n(asked):
    """ssa_attention(backend="auto") hands choose_backend the call's facts: n_grad follows n's
    requires_grad under grad mode, and the device, dtype and head size are the query's."""
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    n = torch.tensor(1.5, requires_grad=True)
    fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    fused.ssa_attention(q, q, q, 0.8, 1.5, causal=True)
    with torch.no_grad():
        fused.ssa_attention(q, q, q, 0.8, n, causal=True)
    assert [c.n_grad for c in asked] == [True, False, False]
    assert [c.training for c in asked] == [True, True, False]
    facts = {(c.device, c.dtype, c.head_dim, c.kind) for c in asked}
    assert facts == {("cpu", torch.float32, 8, "attention")}
    assert all(c.triton == routing.triton_installed() and c.backend == "auto" for c in asked)


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
