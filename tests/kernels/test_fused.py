"""The fused kernels equal the eager scorers: ssacli.kernels.fused.ssa_attention (the native one loop,
the block loop with the native or the torch block math, and flex) against a naive full-matrix
reference written here and against the SSA scorer's own forward, in outputs and in gradients of q, k,
v, b and n; dropout is reproducible, unbiased and differentiable; softmax_attention follows ssacli's
masking conventions; inside models, attention_backend(model, "fused") equals attention_backend(model,
"eager"), "auto" picks the eager scorer exactly where the weights are needed; and the blocked kernel's
memory grows linearly, not quadratically, in the sequence length."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ssacli
from ssacli.attention.arguments import cache_argument, returned_cache
from ssacli.attention.backend import eager_reason
from ssacli.attention.forward import SCORER_ATTR, Observer, observing
from ssacli.errors import UsageError
from ssacli.kernels import native
from ssacli.kernels.fused import softmax_attention, ssa_attention
from tests.helpers.models import FAMILIES, VOCAB, build_model, clone

OUT_TOL = 1e-4  # acceptance: fp32 outputs
GRAD_TOL = 1e-3  # acceptance: fp32 gradients
F64_TOL = 1e-9  # float64: the blocked kernel only reorders sums


# ---- references -----------------------------------------------------------------------------------


def visibility(batch, heads, q_len, k_len, *, causal=False, window=None, mask=None) -> torch.Tensor:
    """[B, H, Q, K] bool, True where query i may see key j; query i sits at key position K − Q + i."""
    pos = torch.arange(q_len)[:, None] + (k_len - q_len)
    keys = torch.arange(k_len)[None, :]
    vis = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal:
        vis = vis & (keys <= pos)
    if window is not None:
        vis = vis & (pos - keys < window)
    if mask is not None:
        vis = vis & mask
    return vis.expand(batch, heads, q_len, k_len)


def repeat_kv(query, key, value):
    groups = query.shape[1] // key.shape[1]
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def per_head(value, heads, like) -> torch.Tensor:
    return torch.as_tensor(value, dtype=like.dtype).reshape(-1).expand(heads).reshape(1, heads, 1, 1)


def safe_softmax(t: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    """Softmax over visible entries; rows with none give 0 (and no NaN in forward or backward)."""
    any_visible = vis.any(dim=-1, keepdim=True)
    fill = torch.where(any_visible, -math.inf, 0.0).to(t.dtype)
    return torch.softmax(torch.where(vis, t, fill), dim=-1) * any_visible


def naive_ssa(query, key, value, b, n, *, scale, causal=False, window=None, mask=None):
    """softmax(n·sgn(x)·log1p(b|x|)) @ V from the full [B, H, Q, K] logits, K/V repeated."""
    batch, heads, q_len, _ = query.shape
    key, value = repeat_kv(query, key, value)
    x = scale * query @ key.transpose(-1, -2)
    b, n = per_head(b, heads, x), per_head(n, heads, x)
    t = n * torch.sign(x) * torch.log1p(b * x.abs())
    vis = visibility(batch, heads, q_len, key.shape[-2], causal=causal, window=window, mask=mask)
    return safe_softmax(t, vis) @ value


def naive_softmax(query, key, value, *, scale, causal=False, mask=None):
    batch, heads, q_len, _ = query.shape
    key, value = repeat_kv(query, key, value)
    vis = visibility(batch, heads, q_len, key.shape[-2], causal=causal, mask=mask)
    return safe_softmax(scale * query @ key.transpose(-1, -2), vis) @ value


def scorer_eager(scorer, query, key, value, *, scale, causal=False, window=None, mask=None):
    """The library's eager path: the scorer's forward on full logits, then weights @ V."""
    batch, heads, q_len, _ = query.shape
    key, value = repeat_kv(query, key, value)
    vis = visibility(batch, heads, q_len, key.shape[-2], causal=causal, window=window, mask=mask)
    return scorer(scale * query @ key.transpose(-1, -2), vis) @ value


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def assert_close(got, ref, tol, what):
    """|got − ref| ≤ tol × max(1, max|ref|): gradients summed over many entries (b, n) or of large
    logits are large, and fp32 error grows with magnitude, so the bound is relative above 1."""
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    scale = max(1.0, ref.abs().max().item())
    err = (got - ref).abs().max().item()
    assert err <= tol * scale, f"{what}: max |error| {err:.3g} > {tol:g} × {scale:.3g}"


# ---- the blocked kernel against the references ----------------------------------------------------


@dataclass(frozen=True)
class Case:
    batch: int = 2
    heads: int = 4
    kv_heads: int = 4
    q_len: int = 37
    k_len: int = 37
    dim: int = 8
    causal: bool = True
    window: int | None = None
    mask: str | None = None  # None; "padding": [B, 1, Q, K] key padding; "heads": [B, H, Q, K] holes
    blocks: tuple[int, int] | None = (8, 16)  # (block_rows, block_keys); None: the defaults
    per_head: bool = True  # b, n of shape [H]; else 0-dim tensors
    magnitude: float = 1.0  # q and k are multiplied by this
    n: float = 1.5

    def kwargs(self):
        blocks = {} if self.blocks is None else dict(block_rows=self.blocks[0], block_keys=self.blocks[1])
        return dict(causal=self.causal, window=self.window, **blocks)


CASES = {
    "odd-causal": Case(),
    "odd-causal-default-blocks": Case(blocks=None),
    "non-causal": Case(causal=False),
    "non-causal-default-blocks-scalar-bn": Case(causal=False, blocks=None, per_head=False),
    "gqa2-padding": Case(kv_heads=2, mask="padding"),
    "gqa1-per-head-mask": Case(kv_heads=1, mask="heads"),
    "gqa2-non-causal-padding-scalar-bn": Case(kv_heads=2, causal=False, mask="padding", per_head=False),
    "kv-cache": Case(kv_heads=2, q_len=5, k_len=23),
    "kv-cache-padding-tiny-blocks": Case(kv_heads=2, q_len=5, k_len=23, mask="padding", blocks=(2, 3)),
    "one-query": Case(q_len=1, k_len=23, mask="padding"),
    "window": Case(window=5),
    "window-gqa-padding": Case(kv_heads=2, window=6, mask="padding", blocks=(4, 8)),
    "window-kv-cache": Case(q_len=5, k_len=23, window=7, blocks=(2, 4)),
    "large-logits": Case(kv_heads=2, magnitude=10.0, n=16.0),
    "large-logits-non-causal": Case(causal=False, magnitude=10.0, n=16.0, per_head=False),
}


def make_inputs(case: Case, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q = randn(case.batch, case.heads, case.q_len, case.dim) * case.magnitude
    k = randn(case.batch, case.kv_heads, case.k_len, case.dim) * case.magnitude
    v = randn(case.batch, case.kv_heads, case.k_len, case.dim)
    if case.per_head:  # perturbed per head, away from any shared value
        b = 0.8 * torch.exp(0.3 * randn(case.heads))
        n = case.n * torch.exp(0.2 * randn(case.heads))
    else:
        b, n = torch.tensor(0.7, dtype=dtype), torch.tensor(case.n, dtype=dtype)
    mask = None
    if case.mask == "padding":  # last batch row left-padded by 4 keys; row 0's query 2 sees nothing
        mask = torch.ones(case.batch, 1, case.q_len, case.k_len, dtype=torch.bool)
        mask[-1, :, :, :4] = False
        mask[0, :, min(2, case.q_len - 1)] = False
    elif case.mask == "heads":  # different holes per query head, and one empty row
        mask = torch.rand(case.batch, case.heads, case.q_len, case.k_len, generator=gen) > 0.3
        mask[1, 2, 3] = False
    tensors = [t.requires_grad_() for t in (q, k, v, b, n)]
    return tensors, mask, randn(case.batch, case.heads, case.q_len, case.dim)


def grads(out, inputs, upstream):
    return torch.autograd.grad(out, inputs, upstream)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CASES))
def test_blocked_kernel_matches_the_references(name, dtype):
    case = CASES[name]
    (q, k, v, b, n), mask, upstream = make_inputs(case, dtype)
    scale = case.dim**-0.5
    out = ssa_attention(q, k, v, b, n, scale=scale, mask=mask, **case.kwargs())
    ref = naive_ssa(q, k, v, b, n, scale=scale, causal=case.causal, window=case.window, mask=mask)
    if mask is not None:  # the case really has a query row that sees nothing
        vis = visibility(case.batch, case.heads, case.q_len, case.k_len, causal=case.causal, mask=mask)
        assert (~vis.any(-1)).any()
    out_tol, grad_tol = (OUT_TOL, GRAD_TOL) if dtype == torch.float32 else (F64_TOL, F64_TOL)
    assert out.dtype == dtype
    assert_close(out, ref, out_tol, "output")
    inputs = (q, k, v, b, n)
    for label, got, want in zip("qkvbn", grads(out, inputs, upstream), grads(ref, inputs, upstream)):
        assert_close(got, want, grad_tol, f"grad {label}")


@pytest.mark.parametrize("name", ["gqa2-padding", "kv-cache", "gqa2-non-causal-padding-scalar-bn", "window"])
def test_naive_reference_agrees_with_the_eager_ssa_scorer(name):
    """The hand-written reference is the SSA scorer's forward (so the kernel is checked against the
    library's eager path too), including ∂/∂b_raw, ∂/∂n_raw through softplus."""
    case = CASES[name]
    (q, k, v, b, n), mask, upstream = make_inputs(case)
    scale = case.dim**-0.5
    scorer = ssacli.make_scorer("ssa" if case.per_head else "ssa:share=layer", num_heads=case.heads)
    with torch.no_grad():
        scorer.b_raw.copy_(inverse_softplus(b.detach()).reshape(-1))
        scorer.n_raw.copy_(inverse_softplus(n.detach()).reshape(-1))
    geometry = dict(scale=scale, causal=case.causal, window=case.window, mask=mask)
    ref = naive_ssa(q, k, v, b, n, **geometry)
    eager = scorer_eager(scorer, q, k, v, **geometry)
    fused = ssa_attention(q, k, v, scorer.b, scorer.n, **{**geometry, **case.kwargs()})
    assert_close(eager, ref, OUT_TOL, "eager scorer output")
    assert_close(fused, eager, OUT_TOL, "fused output vs eager scorer")
    want = grads(ref, (q, k, v, b, n), upstream)
    params = (scorer.b_raw, scorer.n_raw)
    for label, path in (("eager", eager), ("fused", fused)):
        got = grads(path, (q, k, v, *params), upstream)
        for name_, g, w in zip("qkv", got[:3], want[:3]):
            assert_close(g, w, GRAD_TOL, f"{label} grad {name_}")
        for name_, g, w, raw in zip("bn", got[3:], want[3:], params):
            w = (w * torch.sigmoid(raw.detach())).reshape(-1)  # chain rule: softplus' = sigmoid
            assert_close(g, w, GRAD_TOL, f"{label} grad {name_}_raw")


def test_large_logits_need_the_running_max():
    """The transformed logits exceed what exp can hold in fp32 (t > 88), so a kernel without the
    max-shift would overflow; the blocked one stays finite and exact."""
    case = CASES["large-logits"]
    (q, k, v, b, n), _, _ = make_inputs(case)
    x = case.dim**-0.5 * q @ repeat_kv(q, k, v)[0].transpose(-1, -2)
    t = per_head(n, case.heads, x) * torch.sign(x) * torch.log1p(per_head(b, case.heads, x) * x.abs())
    assert t.max().item() > 88.0 and not torch.isfinite(t.exp()).all()
    out = ssa_attention(q, k, v, b, n, causal=True, block_rows=8, block_keys=16)
    out.backward(torch.ones_like(out))
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(leaf.grad).all() for leaf in (q, k, v, b, n))


def test_python_float_parameters_and_the_default_scale():
    case = Case(kv_heads=2)
    (q, k, v, _, _), _, _ = make_inputs(case)
    out = ssa_attention(q, k, v, 0.8, 1.5, causal=True, block_rows=8, block_keys=16)
    assert_close(out, naive_ssa(q, k, v, 0.8, 1.5, scale=case.dim**-0.5, causal=True), OUT_TOL, "output")


def test_native_forward_blocks_match_the_torch_block_math():
    """The native SSA block math (backend="native-blocks") against the torch block math: outputs and
    gradients of causal, padded, windowed and grouped-query calls, with large logits."""
    if not native.available():
        pytest.skip("the native kernel could not be built here (no C compiler)")
    cases = (
        Case(), Case(kv_heads=2, mask="padding", blocks=(16, 16)), Case(causal=False, window=None),
        Case(window=5), Case(magnitude=30.0),  # |y| ~ 1e3: log1p's range reduction, not small z
    )  # fmt: skip
    for case in cases:
        (q, k, v, b, n), mask, upstream = make_inputs(case)
        geometry = dict(scale=case.dim**-0.5, causal=case.causal, mask=mask, window=case.window)
        if case.blocks is not None:
            geometry.update(block_rows=case.blocks[0], block_keys=case.blocks[1])
        runs = []
        for path in ("native-blocks", "torch-blocks"):
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, b, n)]
            out = ssa_attention(*leaves, backend=path, **geometry)
            (out * upstream).sum().backward()
            runs.append((out.detach(), [t.grad for t in leaves]))
        (got, got_grads), (want, want_grads) = runs
        assert_close(got, want, OUT_TOL, f"native forward output {case}")
        for g, w, label in zip(got_grads, want_grads, "qkvbn", strict=True):
            assert_close(g, w, GRAD_TOL, f"native forward grad {label} {case}")


def test_native_flash_forward_matches_the_block_loop(monkeypatch):
    """Without a mask tensor or dropout, the CPU float32 forward and backward run in one native loop
    each on torch's sgemm (the ops ssacli::native_ssa_forward / native_ssa_backward); with an
    all-visible mask tensor the same call takes the block loop. Outputs and every gradient agree,
    across causal, non-causal, GQA, a KV-cache offset, a window, one decoding query, ragged tiles and
    logits past exp's range."""
    if not native.one_loop_available():
        pytest.skip("the native kernel or torch's sgemm is not available here")
    calls, backward_calls = [], []
    flash, flash_backward = native._ssa_forward, native._ssa_backward
    monkeypatch.setattr(native, "_ssa_forward", lambda *a, **k: calls.append(1) or flash(*a, **k))
    monkeypatch.setattr(
        native, "_ssa_backward", lambda *a, **k: backward_calls.append(1) or flash_backward(*a, **k)
    )
    cases = (
        Case(), Case(causal=False, kv_heads=2), Case(kv_heads=1, q_len=5, k_len=23),
        Case(q_len=5, k_len=23, window=7, blocks=(2, 4)), Case(q_len=1, k_len=23, causal=False),
        Case(blocks=None, q_len=70, k_len=70), Case(kv_heads=2, magnitude=10.0, n=16.0),
    )  # fmt: skip
    for case in cases:
        (q, k, v, b, n), _, upstream = make_inputs(case)
        everything = torch.ones(case.batch, 1, case.q_len, case.k_len, dtype=torch.bool)
        runs = []
        for mask in (None, everything):
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, b, n)]
            before = len(calls)
            out = ssa_attention(*leaves, mask=mask, **case.kwargs())
            assert len(calls) - before == (mask is None), f"flash ran {len(calls) - before}× {case}"
            before = len(backward_calls)
            (out * upstream).sum().backward()
            assert len(backward_calls) - before == (mask is None), f"flash backward {case}"
            runs.append((out.detach(), [t.grad for t in leaves]))
        (got, got_grads), (want, want_grads) = runs
        assert_close(got, want, OUT_TOL, f"flash forward output {case}")
        for g, w, label in zip(got_grads, want_grads, "qkvbn", strict=True):
            assert_close(g, w, GRAD_TOL, f"flash forward grad {label} {case}")


def test_native_flash_backward_does_not_depend_on_the_thread_count():
    """Each query head is one task of the one-loop backward and writes only its own gradients, so one
    thread and two give the same gradients bit for bit (GQA: the heads of a K/V head summed after)."""
    if not native.one_loop_available():
        pytest.skip("the native kernel or torch's sgemm is not available here")
    case = Case(batch=2, heads=4, kv_heads=2, q_len=70, k_len=70, blocks=(16, 32))
    (q, k, v, b, n), _, upstream = make_inputs(case)
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, b, n)]
            out = ssa_attention(*leaves, backend="one-loop", **case.kwargs())
            runs.append(torch.autograd.grad(out, leaves, upstream))
    finally:
        torch.set_num_threads(threads)
    for g1, g2, label in zip(*runs, "qkvbn", strict=True):
        assert torch.equal(g1, g2), label


@pytest.mark.parametrize("path", ["auto", "one-loop", "native-blocks", "torch-blocks", "flex"])
@pytest.mark.parametrize("name", ["gqa2-padding", "kv-cache", "window", "large-logits"])
def test_each_forced_path_matches_the_reference(path, name):
    """backend= forces each CPU path of ssacli.kernels.routing.choose_backend; each gives the
    reference, forward and (but flex, forward only on the CPU) every gradient, or is refused where it
    cannot run (one-loop with a mask tensor; the native paths where nothing native is built)."""
    case = CASES[name]
    (q, k, v, b, n), mask, upstream = make_inputs(case)
    geometry = dict(scale=case.dim**-0.5, causal=case.causal, window=case.window, mask=mask)
    ref = naive_ssa(q, k, v, b, n, **geometry)
    unavailable = (path == "one-loop" and (mask is not None or not native.one_loop_available())) or (
        path == "native-blocks" and not native.available()
    )
    if unavailable:
        with pytest.raises(ValueError, match=path):
            ssa_attention(q, k, v, b, n, backend=path, **geometry)
        return
    if path == "flex":
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flex uncompiled, as it always is on the CPU
            out = ssa_attention(q, k, v, b, n, backend=path, **geometry)
        assert_close(out, ref, OUT_TOL, "flex output")
        return
    out = ssa_attention(q, k, v, b, n, backend=path, block_rows=8, block_keys=16, **geometry)
    assert_close(out, ref, OUT_TOL, f"{path} output")
    inputs = (q, k, v, b, n)
    for label, got, want in zip("qkvbn", grads(out, inputs, upstream), grads(ref, inputs, upstream)):
        assert_close(got, want, GRAD_TOL, f"{path} grad {label}")


def test_the_one_loop_backward_serves_fewer_heads_than_threads(monkeypatch):
    """No thread-count switch: a one-loop forward is followed by the one-loop backward even where
    batch × heads is below torch's thread count (no benchmark row showed the block loop faster there)."""
    if not native.one_loop_available():
        pytest.skip("the native kernel or torch's sgemm is not available here")
    called = []
    backward = native._ssa_backward
    monkeypatch.setattr(native, "_ssa_backward", lambda *a, **k: called.append(1) or backward(*a, **k))
    case = Case(batch=1, heads=1, kv_heads=1)
    (q, k, v, b, n), _, upstream = make_inputs(case)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, threads))
        out = ssa_attention(q, k, v, b, n, **case.kwargs())
        got = grads(out, (q, k, v, b, n), upstream)
    finally:
        torch.set_num_threads(threads)
    assert called
    ref = naive_ssa(q, k, v, b, n, scale=case.dim**-0.5, causal=True)
    for label, g, w in zip("qkvbn", got, grads(ref, (q, k, v, b, n), upstream)):
        assert_close(g, w, GRAD_TOL, f"grad {label}")


def test_bf16_autocast_keeps_the_block_math_in_fp32():
    """Fine-tuning runs under bf16 autocast; the kernel's matmuls must not drop to bf16 (that costs
    ~1e-2 here) in the forward or the backward."""
    case = Case(kv_heads=2)
    (q, k, v, b, n), _, upstream = make_inputs(case)
    kwargs = dict(causal=True, block_rows=8, block_keys=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ssa_attention(q, k, v, b, n, **kwargs)
        grads = torch.autograd.grad(out, (q, k, v, b, n), upstream)
    reference = naive_ssa(q, k, v, b, n, scale=case.dim**-0.5, causal=True)
    assert out.dtype == torch.float32
    assert_close(out, reference, OUT_TOL, "output")
    for got, want in zip(grads, torch.autograd.grad(reference, (q, k, v, b, n), upstream), strict=True):
        assert_close(got, want, GRAD_TOL, "gradient")


def test_a_mask_broadcast_over_queries_is_accepted():
    case = Case(kv_heads=2, causal=False)
    (q, k, v, b, n), _, _ = make_inputs(case)
    mask = torch.ones(case.batch, 1, 1, case.k_len, dtype=torch.bool)
    mask[1, ..., :4] = False
    kwargs = dict(scale=0.3, mask=mask)
    out = ssa_attention(q, k, v, b, n, block_rows=8, block_keys=16, **kwargs)
    assert_close(out, naive_ssa(q, k, v, b, n, **kwargs), OUT_TOL, "output")


# ---- dropout --------------------------------------------------------------------------------------


def test_dropout_is_reproducible_from_the_seed():
    case = Case(kv_heads=2, mask="padding")
    (q, k, v, b, n), mask, upstream = make_inputs(case)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        out = ssa_attention(q, k, v, b, n, mask=mask, dropout=0.3, **case.kwargs())
        runs.append((out, *grads(out, (q, k, v, b, n), upstream)))
    assert all(torch.equal(a, c) for a, c in zip(runs[0], runs[1]))
    assert all(torch.isfinite(t).all() for t in runs[0])
    assert not torch.equal(runs[0][0], runs[2][0])
    clean = ssa_attention(q, k, v, b, n, mask=mask, **case.kwargs())
    assert not torch.allclose(runs[0][0], clean, atol=1e-3)


def test_dropout_is_unbiased():
    """E[dropout(p)/(1−rate)] = p: the mean over 2000 batch copies (each with its own mask) of one
    problem is the no-dropout output within 5 standard errors, per element. Fixed seed: not flaky."""
    copies, rate = 2000, 0.3
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=gen) for _ in range(3))
    geometry = dict(causal=True, block_rows=4, block_keys=4)
    clean = ssa_attention(q, k, v, 0.8, 1.5, **geometry)
    torch.manual_seed(0)
    samples = ssa_attention(
        *(t.expand(copies, -1, -1, -1) for t in (q, k, v)), 0.8, 1.5, dropout=rate, **geometry
    )
    mean, stderr = samples.mean(0), samples.std(0) / copies**0.5
    assert (samples.std(0) > 0).all()  # every output element really varies with the mask
    assert ((mean - clean[0]).abs() <= 5 * stderr + 1e-6).all()


def _seeded(fn):
    def wrapped(*args):
        torch.manual_seed(0)  # gradcheck calls many times: the same dropout mask every time
        return fn(*args)

    return wrapped


def test_dropout_backward_passes_gradcheck():
    """float64 finite differences against the custom backward, dropout mask fixed by the seed."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 6, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    b = torch.tensor([0.7, 1.1], dtype=torch.float64, requires_grad=True)
    n = torch.tensor([1.3, 2.0], dtype=torch.float64, requires_grad=True)

    def fn(q, k, v, b, n):
        blocks = dict(block_rows=2, block_keys=4)
        return ssa_attention(q, k, v, b, n, causal=True, dropout=0.3, **blocks)

    torch.manual_seed(0)
    with torch.no_grad():
        assert not torch.equal(fn(q, k, v, b, n), ssa_attention(q, k, v, b, n, causal=True))
    assert torch.autograd.gradcheck(_seeded(fn), (q, k, v, b, n))


def test_backward_passes_gradcheck_with_masks_and_gqa():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    b = torch.tensor([0.7, 1.1, 0.5, 0.9], dtype=torch.float64, requires_grad=True)
    n = torch.tensor([1.3, 2.0, 0.8, 1.6], dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 4, 5, 7, generator=gen) > 0.3
    mask[0, 1, 4] = False  # a row that sees nothing

    def fn(q, k, v, b, n):
        return ssa_attention(q, k, v, b, n, causal=True, window=4, mask=mask, block_rows=2, block_keys=3)

    assert torch.autograd.gradcheck(fn, (q, k, v, b, n))


# ---- softmax_attention and the scorers' fused methods ---------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case(kv_heads=2, mask="padding"),
        Case(kv_heads=2, q_len=5, k_len=23, mask="padding"),
        Case(kv_heads=1, causal=False, mask="heads"),
        Case(q_len=5, k_len=23),
    ],
    ids=["causal-padding", "kv-cache-padding", "non-causal-per-head-mask", "kv-cache"],
)
def test_softmax_attention_matches_a_naive_softmax(case):
    (q, k, v, _, _), mask, upstream = make_inputs(case)
    geometry = dict(scale=0.3, causal=case.causal, mask=mask)
    out, ref = softmax_attention(q, k, v, **geometry), naive_softmax(q, k, v, **geometry)
    assert_close(out, ref, OUT_TOL, "output")
    for label, g, w in zip("qkv", grads(out, (q, k, v), upstream), grads(ref, (q, k, v), upstream)):
        assert_close(g, w, GRAD_TOL, f"grad {label}")


@pytest.mark.parametrize("spec", ["softmax", "temperature:t=0.7", "ssa", "ssa:share=layer"])
def test_scorer_fused_equals_its_forward(spec):
    """Scorer.fused's contract: forward followed by weights @ value, gradients of its parameters too."""
    case = Case(kv_heads=2, q_len=9, k_len=23, mask="padding")
    (q, k, v, _, _), mask, upstream = make_inputs(case)
    scorer = ssacli.make_scorer(spec, num_heads=case.heads)
    params = [p for p in scorer.parameters() if p.requires_grad]
    with torch.no_grad():
        for p in scorer.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(6)))
    fused = scorer.fused(q, k, v, scale=0.3, causal=True, mask=mask, dropout=0.0)
    eager = scorer_eager(scorer, q, k, v, scale=0.3, causal=True, mask=mask)
    assert_close(fused, eager, OUT_TOL, "output")
    inputs = (q, k, v, *params)
    for i, (g, w) in enumerate(zip(grads(fused, inputs, upstream), grads(eager, inputs, upstream))):
        assert_close(g, w, GRAD_TOL, f"grad of input {i}")


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(
    "case",
    [
        Case(kv_heads=2, mask="padding"),
        Case(kv_heads=1, q_len=5, k_len=23, mask="heads", per_head=False),
        Case(kv_heads=2, window=5, mask="padding"),
    ],
    ids=["causal-padding-gqa", "kv-cache-per-head-mask", "window"],
)
def test_flex_forward_matches_the_reference(case):
    (q, k, v, b, n), mask, _ = make_inputs(case)
    q, k, v, b, n = (t.detach() for t in (q, k, v, b, n))  # torch refuses CPU flex on grad-requiring k, v
    geometry = dict(scale=case.dim**-0.5, causal=case.causal, window=case.window, mask=mask)
    with torch.no_grad():
        out = ssa_attention(q, k, v, b, n, backend="flex", **geometry)
        ref = naive_ssa(q, k, v, b, n, **geometry)
    assert_close(out, ref, OUT_TOL, "flex output")


# ---- inside models --------------------------------------------------------------------------------

MODEL_FAMILIES = ["llama", "gpt2", "bert"]
NO_DROPOUT = {"gpt2": dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0), "t5": dict(dropout_rate=0.0)}


def ssa_model(family, spec="ssa"):
    """A tiny model of ``family`` with per-head SSA parameters moved away from their initial values."""
    model = ssacli.apply_scorer(build_model(family, **NO_DROPOUT.get(family, {})), spec)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for scorer in ssacli.scorers_of(model).values():
            for p in scorer.parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    return model


def model_output(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask)
    return out.logits if FAMILIES[model.config.model_type]["kind"] == "causal" else out.last_hidden_state


def test_model_fixtures_exercise_gqa():
    config = build_model("llama").config
    assert config.num_key_value_heads < config.num_attention_heads


@pytest.mark.parametrize("family", MODEL_FAMILIES)
def test_fused_model_forward_equals_eager(family, padded_batch):
    model = ssa_model(family)
    ids, mask = padded_batch
    valid = mask.bool()
    with torch.no_grad():
        with ssacli.attention_backend(model, "eager"):
            ref = model_output(model, ids, mask)
        with ssacli.attention_backend(model, "fused"):
            got = model_output(model, ids, mask)
        with ssacli.attention_backend(model, "eager"):  # no padding: a causal model passes no mask at all
            ref_full = model_output(model, ids[:1], None)
        with ssacli.attention_backend(model, "fused"):
            got_full = model_output(model, ids[:1], None)
    assert_close(got[valid], ref[valid], OUT_TOL, f"{family} outputs")
    assert_close(got_full, ref_full, OUT_TOL, f"{family} outputs without padding")


@pytest.mark.parametrize("family", MODEL_FAMILIES)
def test_fused_model_gradients_equal_eager(family, padded_batch):
    eager = ssa_model(family).train()
    fused = clone(eager)
    ids, mask = padded_batch
    valid = mask.bool()
    grads_of = {}
    for backend, model in (("eager", eager), ("fused", fused)):
        with ssacli.attention_backend(model, backend):
            out = model_output(model, ids, mask)
        proj = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(8))
        (out[valid] @ proj).sum().backward()
        grads_of[backend] = {k: p.grad for k, p in model.named_parameters() if p.requires_grad}
    assert any(SCORER_ATTR in k and k.endswith("b_raw") for k in grads_of["fused"])
    for name, ref in grads_of["eager"].items():
        got = grads_of["fused"][name]
        assert (got is None) == (ref is None), name
        if ref is not None:
            assert_close(got, ref, GRAD_TOL, f"{family} grad {name}")
    scorer_grads = [g for k, g in grads_of["fused"].items() if SCORER_ATTR in k]
    assert scorer_grads and all(g is not None and g.abs().sum() > 0 for g in scorer_grads)


def test_fused_kv_cache_decoding_equals_one_eager_pass():
    model = ssa_model("llama")
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        with ssacli.attention_backend(model, "eager"):
            full = model(ids).logits
        with ssacli.attention_backend(model, "fused"):
            out = model(ids[:, :3], use_cache=True)
            steps, cache = [out.logits], returned_cache(out)
            for t in range(3, 6):
                out = model(ids[:, t : t + 1], use_cache=True, **cache_argument(model, cache))
                steps.append(out.logits)
    assert_close(torch.cat(steps, dim=1), full, OUT_TOL, "cached logits")


# ---- routing --------------------------------------------------------------------------------------


def spy_scorers(model, monkeypatch):
    """Count calls of every scorer's forward and fused methods."""
    calls = {"forward": 0, "fused": 0}
    for scorer in ssacli.scorers_of(model).values():
        for method in calls:
            original = getattr(scorer, method)

            def spy(*args, _orig=original, _method=method, **kwargs):
                calls[_method] += 1
                return _orig(*args, **kwargs)

            monkeypatch.setattr(scorer, method, spy)
    return calls


def test_auto_returns_real_weights_when_asked(padded_batch):
    model = ssa_model("llama")
    ids, mask = padded_batch
    valid = mask.bool()
    with torch.no_grad():
        with ssacli.attention_backend(model, "eager"):
            ref = model(input_ids=ids, attention_mask=mask).logits
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == 2
    for weights in out.attentions:  # [b, h, q, k]
        rows = weights.sum(-1)[valid[:, None, :].expand(-1, weights.shape[1], -1)]
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
        assert torch.all(weights[1, :, :, :2] == 0)  # left padding of row 1 is never seen
    assert_close(out.logits[valid], ref[valid], OUT_TOL, "logits with output_attentions")


def test_fused_refuses_to_return_weights(padded_batch):
    model = ssa_model("llama")
    ids, mask = padded_batch
    with torch.no_grad(), ssacli.attention_backend(model, "fused"):
        with pytest.raises(UsageError, match="output_attentions"):
            model(input_ids=ids, attention_mask=mask, output_attentions=True)


def test_auto_skips_the_eager_scorer_unless_weights_are_needed(padded_batch, monkeypatch):
    model = ssa_model("llama")
    calls = spy_scorers(model, monkeypatch)
    ids, mask = padded_batch
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        assert calls == {"forward": 0, "fused": 2}
        with ssacli.attention_backend(model, "eager"):
            model(input_ids=ids, attention_mask=mask)
        assert calls == {"forward": 2, "fused": 2}
        model(input_ids=ids, attention_mask=mask, output_attentions=True)
        assert calls == {"forward": 4, "fused": 2}


class CountingObserver(Observer):
    block_size = 3

    def __init__(self):
        self.rows = 0

    def transform(self, logits, module):
        return logits

    def record(self, module, weights, visible, query_positions, sink=None, logits=None):
        self.rows += weights.shape[-2]


def test_observing_takes_the_eager_path_under_auto(padded_batch, monkeypatch):
    model = ssa_model("llama")
    ids, mask = padded_batch
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        calls = spy_scorers(model, monkeypatch)
        with observing(CountingObserver()) as observer:
            got = model(input_ids=ids, attention_mask=mask).logits
    assert calls["fused"] == 0 and calls["forward"] > 0 and observer.rows == 2 * 7
    valid = mask.bool()
    assert_close(got[valid], ref[valid], OUT_TOL, "observed logits")


def test_a_scorer_without_a_fused_kernel_runs_eager_and_fused_refuses(padded_batch, monkeypatch):
    model = ssacli.apply_scorer(build_model("llama"), "sparsemax")
    calls = spy_scorers(model, monkeypatch)
    ids, mask = padded_batch
    with torch.no_grad():
        with ssacli.attention_backend(model, "eager"):
            ref = model(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids, attention_mask=mask).logits
        assert calls["forward"] == 4
        with ssacli.attention_backend(model, "fused"), pytest.raises(UsageError, match="sparsemax"):
            model(input_ids=ids, attention_mask=mask)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("family", ["gemma2", "t5"])
def test_softcap_and_position_bias_run_eager(family, padded_batch):
    model = ssa_model(family)
    ids, mask = padded_batch
    dec = {"decoder_input_ids": ids[:, :4]} if family == "t5" else {}
    with torch.no_grad():
        with ssacli.attention_backend(model, "eager"):
            ref = model(input_ids=ids, attention_mask=mask, **dec).logits
        got = model(input_ids=ids, attention_mask=mask, **dec).logits
        with (
            ssacli.attention_backend(model, "fused"),
            pytest.raises(UsageError, match="softcap or a position bias"),
        ):
            model(input_ids=ids, attention_mask=mask, **dec)
    assert torch.equal(got, ref)


def test_a_float_mask_needs_the_eager_path():
    scorer = ssacli.make_scorer("ssa", num_heads=2)
    assert eager_reason(scorer, torch.zeros(1, 1, 2, 2), {}) is not None
    assert eager_reason(scorer, torch.ones(1, 1, 2, 2, dtype=torch.bool), {}) is None
    assert eager_reason(scorer, None, {"softcap": 2.0}) is not None
    assert eager_reason(ssacli.make_scorer("sparsemax"), None, {}) is not None


def test_unknown_backend_is_a_usage_error():
    with pytest.raises(UsageError, match="bogus"):
        with ssacli.attention_backend(build_model("llama"), "bogus"):
            pass


def test_a_model_backend_is_set_on_its_modules_and_comes_back(padded_batch, monkeypatch):
    """attention_backend(model, name) is a fact of that model's calls (no process-wide switch): another
    model keeps auto, nested blocks restore the outer backend, and a forced path reaches the kernel."""
    from ssacli.attention.backend import module_backend
    from ssacli.attention.interface import attention_modules

    model, other = ssa_model("llama"), ssa_model("llama")

    def backends(m):
        return {module_backend(module) for _, module in attention_modules(m)}

    with ssacli.attention_backend(model, "eager"):
        assert backends(model) == {"eager"} and backends(other) == {"auto"}
        with ssacli.attention_backend(model, "torch-blocks"):
            assert backends(model) == {"torch-blocks"}
        assert backends(model) == {"eager"}
    assert backends(model) == {"auto"}
    ids = padded_batch[0][:1]  # no padding: the native one loop's call under auto
    native_calls = []
    one_loop = native._ssa_forward
    monkeypatch.setattr(native, "_ssa_forward", lambda *a, **k: native_calls.append(1) or one_loop(*a, **k))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        ran_native = len(native_calls)
        with ssacli.attention_backend(model, "torch-blocks"):
            got = model(input_ids=ids).logits
    assert len(native_calls) == ran_native == (2 if native.one_loop_available() else 0)
    assert_close(got, ref, OUT_TOL, "torch-blocks logits")


# ---- memory ---------------------------------------------------------------------------------------


class LargestTensor(TorchDispatchMode):
    """The largest tensor (in elements) any op produces, forward and backward alike.

    Counting op outputs is exact and deterministic, where CPU memory profiles (torch.profiler's
    per-op cpu_memory_usage) are net of frees and attributed to whichever op is open, so a quadratic
    [Q, K] intermediate can hide inside an aggregate. Every [Q, K]-sized temporary is some op's output.
    """

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def largest_tensor(length: int, fused: bool) -> int:
    gen = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, length, 16, generator=gen, requires_grad=True) for _ in range(3))
    scorer = ssacli.make_scorer("ssa", num_heads=2)
    with LargestTensor() as mode:
        if fused:
            out = ssa_attention(q, k, v, scorer.b, scorer.n, causal=True)
        else:
            out = scorer_eager(scorer, q, k, v, scale=0.25, causal=True)
        out.sum().backward()
    return mode.numel


def test_blocked_memory_grows_linearly_in_length():
    small, large = largest_tensor(512, fused=True), largest_tensor(2048, fused=True)
    assert large < 6 * small, f"largest tensor grew {large / small:.1f}× for 4× the length"
    assert large * 16 <= 2 * 2048 * 2048  # far below one [H, T, T] weight matrix
    assert largest_tensor(512, fused=False) >= 2 * 512 * 512  # the measurement sees a [T, T] matrix


def test_flex_refuses_to_train_on_the_cpu():
    (q, k, v, b, n), _, _ = make_inputs(Case())
    with pytest.raises(ValueError, match="no backward on the CPU"):
        ssa_attention(q, k, v, b, n, causal=True, backend="flex")


def test_compiled_flex_calls_never_fall_back_to_uncompiled_within_its_variant_budget():
    """torch's default recompile limit (8) made compiled flex_attention fall back to the uncompiled
    one, which materializes every score, after 8 (shape, grad mode) variants: 2,000× slower on a GPU.
    flex's calls raise the limit for the call alone. Checked with dynamo's cheapest backend on a
    stand-in function (compiling flex itself takes seconds per shape)."""
    import torch._dynamo

    from ssacli.kernels.fused import FLEX_VARIANTS, compiled_call

    torch._dynamo.reset()
    frames = []

    def backend(graph, example_inputs):
        frames.append(graph)
        return graph.forward

    fn = torch.compile(lambda x: (x * 2).sum(-1), backend=backend, dynamic=False)
    limit = torch._dynamo.config.recompile_limit
    shapes = range(1, 2 * limit + 3)  # well past the default limit, within FLEX_VARIANTS
    assert len(shapes) < FLEX_VARIANTS
    for width in shapes:
        x = torch.ones(2, width)
        assert torch.equal(compiled_call(fn, x), torch.full((2,), 2.0 * width))
    assert len(frames) == len(shapes)  # every shape compiled; none ran uncompiled
    assert torch._dynamo.config.recompile_limit == limit  # the process's setting is untouched
    frames.clear()
    for width in shapes:  # the plain call, for contrast: past the limit dynamo stops compiling
        fn(torch.ones(3, width))
    assert len(frames) <= limit
    torch._dynamo.reset()
