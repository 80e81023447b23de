"""The native kernels as torch.library custom ops (ssacli.kernels.native): each op's schema, fake
implementation, mutations and autograd pass torch.library.opcheck; ``torch.compile(fullgraph=True)``
keeps the one-loop SSA op in its graph, forward and backward, as it does the Triton kernels'
(tests/kernels/test_triton_ssa.py); tensors of the wrong dtype or layout are refused at the op."""

from __future__ import annotations

import math

import pytest
import torch

from ssacli.kernels import native, native_blocks
from ssacli.kernels.fused import ssa_attention
from ssacli.kernels.positions import PositionBins

F32, F64 = torch.float32, torch.float64


@pytest.fixture(autouse=True)
def _built():
    if not native.one_loop_available():
        pytest.skip("the native one-loop kernels are not available here (no C compiler or no MKL sgemm)")


def _qkv(q_len=19, k_len=23, heads=4, kv_heads=2, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, heads, q_len, dim, generator=gen),
        torch.randn(2, kv_heads, k_len, dim, generator=gen),
        torch.randn(2, kv_heads, k_len, dim, generator=gen),
    )


BINS = PositionBins(sink_k=2, bin_width=4)


def _row_state(b, h, r, k, keys: int | None = None):
    """The running state of r rows, with the position terms of a call of ``keys`` keys (None: none)."""
    state = {
        "m": torch.full((b, h, r), -math.inf, dtype=F64), "l": torch.zeros(b, h, r, dtype=F64),
        "spread": torch.zeros(b, h, r, dtype=F64), "shrink": torch.zeros(b, h, r),
        "top": torch.full((b, h, r, k), -math.inf, dtype=F64), "sq": torch.zeros(b, h, r, dtype=F64),
        "cnt": torch.zeros(b, h, r, dtype=F64),
    }  # fmt: skip
    if keys is not None:
        state |= {"kb": torch.zeros(b, h, r, BINS.key_bins(keys), dtype=F64), "bins": BINS,
                  "db": torch.zeros(b, h, r, BINS.distance_bins(keys), dtype=F64),
                  "dist": torch.zeros(b, h, r, dtype=F64)}  # fmt: skip
    return state


def _stats_state(q, k, positions: bool) -> dict:
    """The one-loop statistics' running state for q's rows, as ssacli.kernels.online_stats starts it."""
    b, h, r = q.shape[:3]
    state = _row_state(b, h, r, 3, k.shape[2] if positions else None)
    del state["shrink"]
    state |= {name: torch.full((b, h, r), -math.inf, dtype=F64) for name in ("first", "t_target")}
    state["x_target"] = torch.full((b, h, r), math.nan, dtype=F64)
    return state


def _position_args(state: dict) -> tuple:
    """kb, db, dist and the bins' sink_k, bin_width of a state, as the ops take them."""
    bins = (BINS.sink_k, BINS.bin_width) if "kb" in state else (0, 0)
    return (state.get("kb"), state.get("db"), state.get("dist"), *bins)


def test_the_one_loop_ops_pass_opcheck():
    q, k, v = _qkv()
    n = torch.full((4,), 1.5)
    forward = torch.ops.ssacli.native_ssa_forward.default
    for causal, window in ((True, 0), (False, 0), (True, 5)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, n)]
        torch.library.opcheck(forward, (*leaves, causal, window, 8, 16))
    out, lse = forward(q, k, v, n, True, 0, 8, 16)
    grad = torch.randn_like(out)
    delta = (grad * out).sum(-1)
    torch.library.opcheck(
        torch.ops.ssacli.native_ssa_backward.default, (q, k, v, grad, n, lse, delta, True, 0, 8, 16)
    )


@pytest.mark.parametrize("positions", [False, True])
def test_the_statistics_op_passes_opcheck(positions):
    q, k, v = _qkv()
    state = _stats_state(q, k, positions)
    names = ("m", "l", "spread", "top", "sq", "cnt", "first", "t_target", "x_target")
    target = torch.tensor([3, 20])
    args = (q, k, v, 0.3, True, 0, target, 8, 16, *(state[name] for name in names), *_position_args(state))
    torch.library.opcheck(torch.ops.ssacli.native_stats.default, args)


@pytest.mark.parametrize("positions", [False, True])
def test_the_block_ops_pass_opcheck(positions):
    gen = torch.Generator().manual_seed(1)
    t = torch.randn(2, 3, 5, 40, generator=gen)
    vis = torch.rand(1, 1, 5, 40, generator=gen).gt(0.3).expand(2, 3, 5, 40)
    state = _row_state(2, 3, 5, 3, 40 if positions else None)
    names = ("m", "l", "spread", "shrink", "top", "sq", "cnt")
    kb, db, dist, sink_k, bin_width = _position_args(state)
    for raw in (None, t * 2):
        args = (t.clone(), raw, vis, *(state[name].clone() for name in names), kb, db, dist)
        torch.library.opcheck(torch.ops.ssacli.native_row_stats.default, (*args, 0, 0, sink_k, bin_width))
    n = torch.full((3,), 1.5)
    y = torch.randn(2, 3, 5, 40, generator=gen)
    torch.library.opcheck(torch.ops.ssacli.native_ssa_block_forward.default, (y.clone(), n, 35, True, 0))
    dp = torch.randn_like(y)
    lse, delta = torch.randn(2, 3, 5, 1, generator=gen) + 5, torch.randn(2, 3, 5, 1, generator=gen)
    args = (y.clone(), dp.clone(), n, lse, delta, 35, True, 4)
    torch.library.opcheck(torch.ops.ssacli.native_ssa_block_backward.default, args)


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd is returning a function")
def test_torch_compile_fullgraph_keeps_the_one_loop_op():
    """A compiled training step through ssa_attention(backend="one-loop") is one graph whose forward
    and backward call ssacli's ops, and it computes what the eager call does."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    q, k, v = (t.requires_grad_() for t in _qkv())
    b = torch.full((4,), 0.8, requires_grad=True)
    n = torch.full((4,), 1.5, requires_grad=True)

    def step(q, k, v, b, n):
        return ssa_attention(q, k, v, b, n, causal=True, backend="one-loop", block_rows=8, block_keys=16)

    torch._dynamo.reset()
    recorder = AotEagerAndRecordGraphs()
    compiled = torch.compile(step, fullgraph=True, backend=recorder)
    out = compiled(q, k, v, b, n)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, b, n))
    expected = step(q, k, v, b, n)
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v, b, n))
    assert torch.equal(out, expected)
    assert all(torch.equal(g, e) for g, e in zip(grads, expected_grads, strict=True))
    forward = "\n".join(str(g.graph) for g in recorder.fw_graphs)
    backward = "\n".join(str(g.graph) for g in recorder.bw_graphs)
    assert "ssacli.native_ssa_forward" in forward and "ssacli.native_ssa_backward" in backward


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k, v, n: (q.double(), k, v, n), "q must be a CPU torch.float32 tensor, got torch.float64"),
        (lambda q, k, v, n: (q, k, v, n[:2]), r"n must be \(4,\), got \(2,\)"),
        (lambda q, k, v, n: (q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v, n), "k's last axis"),
    ],
    ids=["dtype", "shape", "layout"],
)
def test_the_op_refuses_what_its_kernel_cannot_take(change, message):
    """Checked by the op itself (called directly here, past every wrapper) and by its fake: a traced
    call is refused as an eager one is."""
    q, k, v = _qkv()
    args = (*change(q, k, v, torch.full((4,), 1.5)), True, 0, 8, 16)
    with pytest.raises((TypeError, ValueError), match=message):
        torch.ops.ssacli.native_ssa_forward(*args)
    with torch._subclasses.FakeTensorMode() as mode, pytest.raises((TypeError, ValueError), match=message):
        torch.ops.ssacli.native_ssa_forward(*(mode.from_tensor(a) if torch.is_tensor(a) else a for a in args))


def test_too_few_position_bins_are_refused_at_the_op():
    """The kernel adds into the bin each key and distance falls in: a state with too few bins for the
    call (here one key bin short) is refused before the kernel runs."""
    q, k, v = _qkv()
    b, h, r = q.shape[:3]
    state = _row_state(b, h, r, 3, k.shape[2])
    state["kb"] = state["kb"][..., :-1].contiguous()
    t = torch.randn(b, h, r, k.shape[2])
    with pytest.raises(ValueError, match="kb must be"):
        native_blocks.row_stats(t, t, None, state, key0=0, pos0=k.shape[2] - r)


def test_the_statistics_op_writes_the_position_terms_in_place():
    """The state a caller hands the statistics op is the state it reads back (mutated in place)."""
    q, k, v = _qkv()
    state = _stats_state(q, k, positions=True)
    kb = state["kb"]
    native.stats_flash(
        q, k, v, 0.3, state, causal=True, window=None, target=None, block_rows=8, block_keys=16
    )
    assert state["kb"] is kb and kb.sum() > 0 and torch.isfinite(state["l"]).all()
