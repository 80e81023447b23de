"""Scorer test-suite: every registered scorer against an independent float64 reference
(tests/helpers/naive.py), gradients, extreme values in low precision, masking, properties, SSA
specifics, specs and traits.

Everything is parametrized over ``ssacli.scorers.SCORERS``, so a newly registered scorer is covered
automatically (and fails ``test_every_scorer_has_a_reference`` until tests/helpers/naive.py knows it).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.func import functional_call

from ssacli.errors import SpecError
from ssacli.scorers import SCORERS, make_scorer, parse_spec, scorer_table
from tests.helpers import naive

F64 = torch.float64
HEADS = 3

# Non-default specs per scorer; each scorer is also always tested with its bare name (the defaults).
VARIANTS: dict[str, list[str]] = {
    "temperature": ["temperature:t=0.5", "temperature:t=2,share=layer"],
    "ssa": ["ssa:b=0.7,n=1.3", "ssa:init=faithful,m=16", "ssa:n=2,b=0.5,learn=n,share=layer"],
    "ssmax": ["ssmax:s=0.8"],
    "sink": ["sink:s=0.5"],
    "entmax": ["entmax:alpha=1.3", "entmax:alpha=1.8,n_iter=60"],
    "sigmoid": ["sigmoid:bias=-1.5"],
    "sa-softmax": ["sa-softmax:norm=false"],
    "relu-norm": ["relu-norm:power=2"],
}
CASES = [(name, spec) for name in SCORERS for spec in [name, *VARIANTS.get(name, [])]]
CASE_IDS = [spec for _, spec in CASES]
NAMES = list(SCORERS)

HYP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- helpers ----------------------------------------------------------------------------------------


def build(spec: str, heads: int = HEADS, double: bool = True, perturb: bool = True):
    """make_scorer, with every trainable per-head parameter perturbed differently per head."""
    scorer = make_scorer(spec, num_heads=heads)
    if perturb:
        with torch.no_grad():
            for public in type(scorer).trainable:
                p = getattr(scorer, f"{public}_raw")
                p.add_(torch.linspace(-0.3, 0.4, p.numel()))
    return scorer.double() if double else scorer


def raw_params(scorer) -> dict[str, np.ndarray]:
    return {
        public: getattr(scorer, f"{public}_raw").detach().double().numpy().copy()
        for public in type(scorer).trainable
    }


def qk_inputs(scorer, shape, gen, dtype=F64, d=4, away=0.0):
    """query/key kwargs for scorers that read q and k (empty for logit scorers)."""
    if not type(scorer).uses_qk:
        return {}
    b, h, q_len, k_len = shape
    out = {}
    for name, length in (("query", q_len), ("key", k_len)):
        v = torch.randn(b, h, length, d, generator=gen, dtype=F64)
        if away:  # keep every entry at least `away` from relu's kink at 0
            v = torch.sign(v) * (away + v.abs())
        out[name] = v.to(dtype)
    return out


def reference(scorer, x, mask, **kw) -> np.ndarray:
    xs = x.detach().to(F64).numpy()
    visible = np.ones(xs.shape, bool) if mask is None else np.broadcast_to(mask.numpy(), xs.shape)
    np_kw = {k: (v.detach().to(F64).numpy() if v.is_floating_point() else v.numpy()) for k, v in kw.items()}
    return naive.reference(scorer.name, xs, visible, raw_params(scorer), scorer.opts, **np_kw)


def causal(q_len: int, k_len: int) -> torch.Tensor:
    """Bottom-right aligned causal mask [q, k] (query i sits at key position k_len - q_len + i)."""
    i = torch.arange(q_len).unsqueeze(-1) + (k_len - q_len)
    return torch.arange(k_len).unsqueeze(0) <= i


def make_mask(kind: str, shape, gen) -> torch.Tensor | None:
    b, h, q_len, k_len = shape
    if kind == "none":
        return None
    if kind == "causal":
        return causal(q_len, k_len)  # broadcast [q, k]
    if kind == "padding":  # left padding per batch element, [b, 1, 1, k]
        keep = torch.ones(b, 1, 1, k_len, dtype=torch.bool)
        keep[-1, ..., : k_len // 2] = False
        return keep
    if kind == "causal+padding":  # left padding under a causal mask: the first rows see nothing
        keep = torch.ones(b, 1, 1, k_len, dtype=torch.bool)
        keep[-1, ..., : k_len - q_len + 2] = False
        return causal(q_len, k_len) & keep
    if kind == "random":  # [b, h, q, k] with some fully masked rows
        m = torch.rand(shape, generator=gen) < 0.6
        m[0, 0, 0] = False
        m[-1, -1, -1] = False
        return m
    raise ValueError(kind)


MASK_KINDS = ["none", "causal", "padding", "causal+padding", "random"]


def away_from_zero(shape, gen, lo=0.2, hi=2.0, dtype=F64):
    v = torch.randn(shape, generator=gen, dtype=F64)
    return (torch.sign(v) * (lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=F64))).to(dtype)


# ---- 0. every scorer has a reference; the contract's shapes -------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_scorer_has_a_reference(name):
    assert name in naive.REFERENCES, f"tests/helpers/naive.py has no reference formula for scorer {name!r}"
    for public in SCORERS[name].trainable:
        assert public in naive.PHYSICAL.get(name, {}), f"naive.PHYSICAL lacks {name}.{public}"


def test_variants_name_registered_scorers():
    assert set(VARIANTS) <= set(SCORERS)
    assert len(SCORERS) >= 14


@pytest.mark.parametrize("name", NAMES)
def test_shapes_dtype_and_mask_broadcasting(name):
    gen = torch.Generator().manual_seed(1)
    scorer = build(name)
    shape = (2, HEADS, 3, 5)
    x = torch.randn(shape, generator=gen, dtype=F64)
    kw = qk_inputs(scorer, shape, gen)
    w = scorer(x, None, **kw)
    assert w.shape == x.shape and w.dtype == x.dtype
    # mask=None is the all-visible mask
    torch.testing.assert_close(w, scorer(x, torch.ones(shape, dtype=torch.bool), **kw), rtol=0, atol=0)
    # a broadcastable mask gives the same as its expansion
    mask = causal(3, 5)
    torch.testing.assert_close(scorer(x, mask, **kw), scorer(x, mask.expand(shape).clone(), **kw))
    with pytest.raises(TypeError):
        scorer(x, mask.to(torch.float32), **kw)
    if not type(scorer).uses_qk:
        for sub in (x[0], x[:1, :1, :, :].reshape(1, 3, 5)):  # [h, q, k] and (one head) [1, q, k]
            s = build(name, heads=sub.shape[0])
            assert s(sub).shape == sub.shape
        s1 = build(name, heads=1)
        assert s1(x[0, 0]).shape == (3, 5)  # [q, k] with a single head
    if type(scorer).trainable and "share" in type(scorer).options:
        with pytest.raises(ValueError):
            build(name, heads=HEADS + 1)(x, **kw)  # 4 per-head parameters, 3 heads in the logits


def test_cosformer_needs_query_and_key():
    with pytest.raises(ValueError):
        make_scorer("cosformer")(torch.zeros(1, 1, 2, 2))


# ---- 1. agreement with the naive reference ------------------------------------------------------------


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize(("name", "spec"), CASES, ids=CASE_IDS)
def test_matches_naive_reference(name, spec, kind):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{spec}/{kind}".encode()))
    for shape in [(2, HEADS, 4, 6), (2, HEADS, 5, 3)]:  # q < k (KV cache) and q > k
        mask = make_mask(kind, shape, gen)
        x64 = torch.randn(shape, generator=gen, dtype=F64) * 2.0
        scorer = build(spec)
        kw = qk_inputs(scorer, shape, gen)
        ref = reference(scorer, x64, mask, **kw)
        got = scorer(x64, mask, **kw)
        assert got.dtype == F64
        np.testing.assert_allclose(got.detach().numpy(), ref, rtol=0, atol=1e-6)

        # fp32 inputs and an fp32 module (how a model runs it)
        scorer32 = build(spec, double=False)
        x32 = x64.float()
        kw32 = {k: v.float() for k, v in kw.items()}
        got32 = scorer32(x32, mask, **kw32)
        assert got32.dtype == torch.float32
        ref32 = reference(scorer32, x32, mask, **kw32)
        np.testing.assert_allclose(got32.detach().double().numpy(), ref32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positions", ["1d", "per-batch"])
def test_cosformer_explicit_positions_match_reference(positions):
    gen = torch.Generator().manual_seed(7)
    shape = (2, HEADS, 3, 6)
    scorer = build("cosformer")
    x = torch.zeros(shape, dtype=F64)
    kw = qk_inputs(scorer, shape, gen)
    if positions == "1d":
        kw["query_positions"] = torch.tensor([1, 3, 4])
        kw["key_positions"] = torch.tensor([5, 0, 2, 1, 4, 3])
    else:
        kw["query_positions"] = torch.tensor([[1, 3, 4], [0, 2, 5]])
        kw["key_positions"] = torch.stack([torch.randperm(6, generator=gen) for _ in range(2)])
    mask = make_mask("random", shape, gen)
    np.testing.assert_allclose(
        scorer(x, mask, **kw).numpy(), reference(scorer, x, mask, **kw), rtol=0, atol=1e-6
    )
    # the default positions are the bottom-right alignment of a KV cache
    del kw["query_positions"], kw["key_positions"]
    explicit = dict(kw, query_positions=torch.arange(3, 6), key_positions=torch.arange(6))
    torch.testing.assert_close(scorer(x, mask, **kw), scorer(x, mask, **explicit), rtol=0, atol=0)


# ---- 2. gradcheck on inputs and every parameter ---------------------------------------------------------


@pytest.mark.parametrize(("name", "spec"), CASES, ids=CASE_IDS)
def test_gradcheck_inputs_and_parameters(name, spec):
    gen = torch.Generator().manual_seed(11)
    scorer = build(spec)
    shape = (2, HEADS, 3, 5)
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[1, ..., :3] = False  # left padding: batch 1, query 0 sees nothing
    mask = causal(3, 5) & keep
    params = {n: p.detach().clone().requires_grad_(True) for n, p in scorer.named_parameters()}
    expected = {f"{t}_raw" for t in type(scorer).trainable}
    assert expected <= set(params), f"missing trainable parameters {expected - set(params)}"
    for t in type(scorer).trainable:  # the spec's learn= decides what requires grad
        assert getattr(scorer, f"{t}_raw").requires_grad == (t in scorer.learn)
    names = list(params)
    if type(scorer).uses_qk:
        x = torch.zeros(shape, dtype=F64)
        kw = qk_inputs(scorer, shape, gen, away=0.2)
        tensors = (kw["query"].requires_grad_(), kw["key"].requires_grad_())

        def fn(q, k, *ps):
            return functional_call(scorer, dict(zip(names, ps)), (x, mask), {"query": q, "key": k})

    else:
        x = away_from_zero(shape, gen, 0.2, 2.5).requires_grad_()
        tensors = (x,)

        def fn(x, *ps):
            return functional_call(scorer, dict(zip(names, ps)), (x, mask))

    inputs = (*tensors, *params.values())
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_ssa_gradient_at_an_exactly_zero_logit():
    """n·sgn(x)·log1p(b|x|) is C¹ at 0 (slope n·b from both sides), so the gradient there is defined."""
    scorer = build("ssa:b=0.7,n=1.3")
    x = torch.tensor([0.0, 0.9, -0.4, 1.7], dtype=F64).repeat(1, HEADS, 1, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: scorer(x), (x,), eps=1e-6, atol=1e-6, rtol=1e-4)


# ---- 3. extreme logits in fp32 / fp16 / bf16 --------------------------------------------------------------

LOW_TOL = {torch.float32: 2e-3, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def extreme_logits(shape, gen):
    b, h, q_len, k_len = shape
    mag = 10.0 ** (torch.rand(shape, generator=gen, dtype=F64) * 6 - 2)  # 1e-2 .. 1e4
    x = torch.where(torch.rand(shape, generator=gen) < 0.5, -mag, mag)
    x[..., 1, :] = torch.randn(b, h, k_len, generator=gen, dtype=F64)
    x[..., 1, 2] = 1e4  # one huge logit among ordinary ones
    x[..., 2, :] = -1e4
    x[..., 3, :] = 1e4
    x[..., 4, :] = torch.tensor([1e4, -1e4] * k_len, dtype=F64)[:k_len]
    x[..., 5, :] = torch.randn(b, h, k_len, generator=gen, dtype=F64)
    x[..., 5, 0] = -1e4  # one hugely negative logit
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_finite_at_extreme_logits(name, dtype):
    gen = torch.Generator().manual_seed(5)
    shape = (2, HEADS, 6, 7)
    scorer = build(name, double=False)  # the default spec, fp32 parameters as in a model
    x = extreme_logits(shape, gen).to(dtype)
    kw = {}
    if type(scorer).uses_qk:  # cosFormer ignores the logits: make its q and k extreme instead
        kw = {k: extreme_logits((2, HEADS, n, 4), gen).to(dtype) for k, n in (("query", 6), ("key", 7))}
    mask = make_mask("random", shape, gen)
    for t in (x, *kw.values()):
        t.requires_grad_(dtype == torch.float32)
    w = scorer(x, mask, **kw)
    assert w.dtype == dtype and w.shape == x.shape
    assert torch.isfinite(w).all(), f"{name} gives non-finite weights in {dtype}"
    assert (w[~mask.expand(shape)] == 0).all()
    ref = reference(scorer, x, mask, **kw)
    tol = LOW_TOL[dtype]
    np.testing.assert_allclose(w.detach().double().numpy(), ref, rtol=tol, atol=tol)
    if dtype == torch.float32:
        (w * torch.randn(shape, generator=gen)).sum().backward()
        for t in (x, *kw.values(), *scorer.parameters()):
            assert t.grad is None or torch.isfinite(t.grad).all()


# ---- 4. masking: exact zeros, fully masked rows, backward -------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=str)
@pytest.mark.parametrize(("name", "spec"), CASES, ids=CASE_IDS)
def test_masked_keys_exact_zero_and_finite_backward(name, spec, dtype):
    gen = torch.Generator().manual_seed(3)
    shape = (2, HEADS, 5, 4)  # q > k under a causal mask: the first row sees nothing
    scorer = build(spec, double=dtype == F64)
    mask = make_mask("random", shape, gen) & causal(5, 4)
    vis = mask.expand(shape)
    assert (~vis).all(-1).any(), "the test needs fully masked rows"
    x = (torch.randn(shape, generator=gen, dtype=F64) * 3).to(dtype).requires_grad_()
    kw = {k: v.requires_grad_() for k, v in qk_inputs(scorer, shape, gen, dtype=dtype).items()}
    w = scorer(x, mask, **kw)
    assert not torch.isnan(w).any()
    assert torch.equal(w[~vis], torch.zeros_like(w[~vis]))
    dead = (~vis).all(-1)
    assert torch.equal(w[dead], torch.zeros_like(w[dead]))
    (w * torch.randn(shape, generator=gen, dtype=dtype)).sum().backward()
    grads = [x.grad, *(v.grad for v in kw.values()), *(p.grad for p in scorer.parameters())]
    for g in grads:
        assert g is None or torch.isfinite(g).all()
    if not type(scorer).uses_qk:
        assert torch.equal(x.grad[~vis], torch.zeros_like(x.grad[~vis])), "masked logits got gradient"


@pytest.mark.parametrize("name", NAMES)
def test_masked_content_does_not_leak_into_backward(name):
    """NaN in masked logits (or, for q/k scorers, in padded queries and keys) must not reach any grad."""
    gen = torch.Generator().manual_seed(4)
    shape = (2, HEADS, 4, 5)
    scorer = build(name)
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[1, ..., :2] = False  # batch 1: two left-padded keys
    qkeep = torch.ones(2, 1, 4, 1, dtype=torch.bool)
    qkeep[0, :, 0] = False  # batch 0: a padded query
    mask = causal(4, 5) & keep & qkeep
    vis = mask.expand(shape)
    x = torch.randn(shape, generator=gen, dtype=F64)
    kw = qk_inputs(scorer, shape, gen)
    clean = scorer(x, mask, **kw)
    x = x.masked_fill(~vis, float("nan")).requires_grad_()
    if kw:
        kw["key"][1, :, :2] = float("nan")
        kw["query"][0, :, 0] = float("nan")
        kw = {k: v.requires_grad_() for k, v in kw.items()}
    w = scorer(x, mask, **kw)
    torch.testing.assert_close(w, clean, rtol=0, atol=1e-6)
    (w * torch.randn(shape, generator=gen, dtype=F64)).sum().backward()
    if kw:
        for k, v in kw.items():
            bad = (~torch.isfinite(v.grad)).sum().item()
            assert bad == 0, f"NaN in padded queries/keys leaks into {bad} entries of {k}.grad"
    else:
        assert torch.isfinite(x.grad).all()
    for p in scorer.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


# ---- 5. hypothesis properties ------------------------------------------------------------------------------


@st.composite
def problems(draw, positive_qk=False):
    b = draw(st.integers(1, 2))
    q_len = draw(st.integers(1, 4))
    k_len = draw(st.integers(1, 6))
    shape = (b, HEADS, q_len, k_len)
    x = draw(hnp.arrays(np.float64, shape, elements=st.floats(-10, 10, allow_nan=False)))
    mask = draw(hnp.arrays(np.bool_, shape))
    lo, hi = (0.05, 3.0) if positive_qk else (-3.0, 3.0)
    qk = {
        "query": draw(hnp.arrays(np.float64, (b, HEADS, q_len, 3), elements=st.floats(lo, hi))),
        "key": draw(hnp.arrays(np.float64, (b, HEADS, k_len, 3), elements=st.floats(lo, hi))),
    }
    return torch.from_numpy(x), torch.from_numpy(mask), {k: torch.from_numpy(v) for k, v in qk.items()}


def _kw(scorer, qk):
    return qk if type(scorer).uses_qk else {}


SUM_CASES = [(n, s) for n, s in CASES if SCORERS[n].traits.rows_sum_to_one.startswith("yes")]


@pytest.mark.parametrize(("name", "spec"), SUM_CASES, ids=[s for _, s in SUM_CASES])
@HYP
@given(data=problems(positive_qk=True))
def test_rows_sum_to_one(name, spec, data):
    x, mask, qk = data
    scorer = build(spec)
    w = scorer(x, mask, **_kw(scorer, qk))
    sums = w.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]), rtol=0, atol=1e-9)
    assert (sums[~has_key] == 0).all()
    assert (w >= 0).all()


FILLS = [float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 1e4, -1e4, 0.0]


@pytest.mark.parametrize(("name", "spec"), CASES, ids=CASE_IDS)
@HYP
@given(data=problems(), fill=st.data(), dtype=st.sampled_from([F64, torch.float32]))
def test_invariant_to_masked_content(name, spec, data, fill, dtype):
    x, mask, qk = data
    scorer = build(spec, double=dtype == F64)
    x, qk = x.to(dtype), {k: v.to(dtype) for k, v in qk.items()}
    junk_values = FILLS + [float(torch.finfo(dtype).min), float(torch.finfo(dtype).max)]
    junk = torch.tensor(
        fill.draw(st.lists(st.sampled_from(junk_values), min_size=x.numel(), max_size=x.numel())),
        dtype=dtype,
    ).reshape(x.shape)
    before = scorer(x, mask, **_kw(scorer, qk))
    x2 = torch.where(mask, x, junk)
    qk2 = {k: v.clone() for k, v in qk.items()}
    dead_q, dead_k = ~mask.any(-1), ~mask.any(-2)  # padded queries / keys nobody sees
    qk2["query"][dead_q] = junk.reshape(-1)[0]
    qk2["key"][dead_k] = junk.reshape(-1)[-1]
    after = scorer(x2, mask, **_kw(scorer, qk2))
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("name", "spec"), CASES, ids=CASE_IDS)
@HYP
@given(data=problems(), perm_seed=st.integers(0, 2**16))
def test_permutation_equivariance_over_keys(name, spec, data, perm_seed):
    x, mask, qk = data
    k_len = x.shape[-1]
    perm = torch.randperm(k_len, generator=torch.Generator().manual_seed(perm_seed))
    scorer = build(spec)
    kw = _kw(scorer, qk)
    w = scorer(x, mask, **kw)
    kw_p = {}
    if kw:
        kw_p = {
            "query": kw["query"],
            "key": kw["key"][..., perm, :],
            "key_positions": torch.arange(k_len)[perm],
        }
    w_p = scorer(x[..., perm], mask[..., perm], **kw_p)
    torch.testing.assert_close(w_p, w[..., perm], rtol=0, atol=1e-9)


# ---- 6. SSA specifics -----------------------------------------------------------------------------------


def _kl_softmax_ssa(spec, rows=4096, keys=64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, keys, generator=gen, dtype=F64)
    logp = x - np.log(np.exp(x.numpy()).sum(-1, keepdims=True))  # softmax in numpy, not the package
    with torch.no_grad():
        q = make_scorer(spec).double()(x)
    return float((logp.exp() * (logp - q.log())).sum(-1).mean())


def test_ssa_faithful_is_close_to_softmax():
    kl = _kl_softmax_ssa("ssa:init=faithful")
    print(f"\nmean KL(softmax || ssa:init=faithful) over 4096 x 64 N(0,1) logits: {kl:.3e}")
    assert 0 < kl < 1e-4
    # larger m is closer to softmax, as the spec's help says
    assert _kl_softmax_ssa("ssa:init=faithful,m=64") > kl > _kl_softmax_ssa("ssa:init=faithful,m=256")


@torch.no_grad()
def test_ssa_does_not_collapse_under_scaling():
    x = torch.tensor([1.0, 0.8, 0.5, -0.3, -1.2, 0.05], dtype=F64)
    ssa = make_scorer("ssa").double()  # paper init
    n = float(ssa.n.detach())
    limit = x.clamp_min(0) ** n / (x.clamp_min(0) ** n).sum()
    assert float(limit.max()) < 0.6
    for c in (10.0, 100.0, 1e3, 1e4, 1e6):
        p_soft = make_scorer("softmax")(c * x)
        p_ssa = ssa(c * x)
        if c >= 100:
            assert float(p_soft.max()) > 1 - 1e-6  # softmax collapses to one-hot
        assert float(p_ssa.max()) < 0.75  # SSA stays spread
    torch.testing.assert_close(ssa(1e6 * x), limit, rtol=0, atol=1e-4)
    # ...and converges to the analytical limit, not just stays away from one-hot
    err = [float((ssa(c * x) - limit).abs().max()) for c in (1e2, 1e4, 1e6)]
    assert err[0] > err[1] > err[2]


@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_ssa_parameters_stay_positive_after_a_huge_step(direction):
    ssa = make_scorer("ssa:b=0.7,n=1.3", num_heads=HEADS)
    opt = torch.optim.SGD(ssa.parameters(), lr=1e7)
    x = torch.randn(2, HEADS, 4, 6)
    (direction * (ssa.b.sum() + ssa.n.sum())).backward()
    opt.step()
    assert ssa.b_raw.abs().min() > 1e5  # the step really was huge
    assert (ssa.b > 0).all() and (ssa.n > 0).all()
    assert torch.isfinite(ssa.b).all() and torch.isfinite(ssa.n).all()
    w = ssa(x, causal(4, 6))
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, HEADS, 4))


# ---- 7. specs -------------------------------------------------------------------------------------------


def test_spec_values():
    s = make_scorer("ssa", num_heads=4)
    torch.testing.assert_close(s.b, torch.full((4,), 0.8), rtol=0, atol=1e-5)  # paper: b=0.8, n=1.5
    torch.testing.assert_close(s.n, torch.full((4,), 1.5), rtol=0, atol=1e-5)
    p = make_scorer("ssa:init=paper", num_heads=4)
    assert torch.equal(p.b, s.b) and torch.equal(p.n, s.n)

    f = make_scorer("ssa:init=faithful,m=256", num_heads=4)
    torch.testing.assert_close(f.b, torch.full((4,), 1 / 256), rtol=0, atol=1e-5)
    torch.testing.assert_close(f.n, torch.full((4,), 256.0), rtol=0, atol=1e-5)
    assert f.b_raw.shape == (4,) and f.n_raw.shape == (4,)

    ln = make_scorer("ssa:n=2,b=0.5,learn=n,share=layer", num_heads=4)
    assert ln.b_raw.shape == (1,) and ln.n_raw.shape == (1,)
    trainable = [n for n, p in ln.named_parameters() if p.requires_grad]
    assert trainable == ["n_raw"]
    assert sum(p.numel() for p in ln.parameters() if p.requires_grad) == 1
    torch.testing.assert_close(ln.n, torch.tensor([2.0]), rtol=0, atol=1e-5)
    torch.testing.assert_close(ln.b, torch.tensor([0.5]), rtol=0, atol=1e-5)

    e = make_scorer("entmax:alpha=1.3,learn=alpha", num_heads=2)
    torch.testing.assert_close(e.alpha, torch.full((2,), 1.3), rtol=0, atol=1e-5)
    assert e.alpha_raw.requires_grad

    t = make_scorer("temperature:t=0.5")
    torch.testing.assert_close(t.t, torch.tensor([0.5]), rtol=0, atol=1e-6)
    x = torch.randn(3, 5, dtype=F64)
    torch.testing.assert_close(t.double()(x), torch.softmax(2 * x, -1))


def test_parameter_values_are_in_natural_units():
    from ssacli.scorers.registry import describe_scorer

    cases = {
        "ssa:b=0.7,n=1.3": {"b": 0.7, "n": 1.3},
        "temperature:t=0.5": {"t": 0.5},
        "entmax:alpha=1.3": {"alpha": 1.3},
        "ssmax:s=0.8": {"s": 0.8},
        "sink:s=0.5": {"s": 0.5},
        "softmax1": {},
        "softmax": {},
    }
    for spec, expected in cases.items():
        values = make_scorer(spec, num_heads=2).parameter_values()
        assert set(values) == set(expected), spec
        for k, v in expected.items():
            torch.testing.assert_close(values[k], torch.full((2,), v), rtol=0, atol=1e-5)
    info = describe_scorer("ssa:init=faithful,m=256")
    assert info["name"] == "ssa" and info["learned"] == ["b", "n"]
    assert info["initial_values"]["b"] == pytest.approx(1 / 256, abs=1e-5)
    assert info["initial_values"]["n"] == pytest.approx(256, abs=1e-5)


def test_parse_spec():
    assert parse_spec("ssa:n=2,learn=n") == ("ssa", {"n": 2.0, "learn": "n"})
    assert parse_spec("ssa") == ("ssa", {})
    assert parse_spec("sa-softmax:norm=false") == ("sa-softmax", {"norm": False})


@pytest.mark.parametrize(
    "spec",
    ["ssa:foo=1", "temperature:x=2", "entmax:beta=1", "relu-norm:norm=true", "softmax:t=1", "softmax1:s=1"],
)
def test_unknown_key_lists_valid_keys(spec):
    name = spec.split(":")[0]
    with pytest.raises(SpecError) as err:
        make_scorer(spec)
    msg = str(err.value)
    for key in SCORERS[name].options:
        assert key in msg
    if not SCORERS[name].options:
        assert "(none)" in msg


@pytest.mark.parametrize("spec", ["nosuch", "ssa2:b=1", "flash:x=1"])
def test_unknown_name_lists_scorers(spec):
    with pytest.raises(SpecError) as err:
        make_scorer(spec)
    for name in SCORERS:
        assert name in str(err.value)


# Specs no scorer can be built from; tests/scorers/test_specs.py refuses them torch-free too.
BAD_SPECS = [
    "",
    "ssa:b",
    "ssa:b=",
    "ssa:=1",
    "ssa:b=abc",
    "ssa:b=nan",
    "ssa:b=inf",
    "ssa:b=-1",
    "ssa:n=0",
    "ssa:m=256",  # m only with init=faithful
    "ssa:init=faithful,m=0",
    "ssa:init=magic",
    "ssa:learn=q",
    "ssa:b=1,b=2",
    "ssa:share=batch",
    "temperature:t=0",
    "entmax:alpha=1",
    "entmax:alpha=2",
    "entmax:n_iter=0",
    "entmax:n_iter=1.5",
    "relu-norm:power=3",
    "sa-softmax:norm=maybe",
]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_bad_specs_raise_spec_error(spec):
    with pytest.raises(SpecError):
        make_scorer(spec)


@pytest.mark.parametrize(("name", "spec"), CASES, ids=CASE_IDS)
def test_spec_round_trip(name, spec):
    a = make_scorer(spec, num_heads=HEADS)
    b = make_scorer(a.spec, num_heads=HEADS)
    assert b.spec == a.spec and type(b) is type(a)
    assert parse_spec(a.spec) == parse_spec(spec)
    assert b.opts == a.opts
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
        assert a.get_parameter(k).requires_grad == b.get_parameter(k).requires_grad


@pytest.mark.parametrize(
    "spec", ["ssa:b=0.123456789,n=2.718281828", "temperature:t=0.333333333", "ssa:init=faithful,m=1234.567"]
)
def test_spec_round_trip_keeps_full_precision(spec):
    a = make_scorer(spec)
    b = make_scorer(a.spec)
    assert parse_spec(a.spec) == parse_spec(spec), f"{spec!r} -> {a.spec!r}"
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


# ---- 8. the traits table ----------------------------------------------------------------------------------


def test_scorer_table_rows():
    rows = scorer_table()
    assert [r["name"] for r in rows] == list(SCORERS)
    for r in rows:
        for key in ("name", "trainable", "rows_sum_to_one", "shift_invariant", "limit", "fusable"):
            assert key in r, (r.get("name"), key)
        cls = SCORERS[r["name"]]
        assert r["trainable"] == list(cls.trainable)
        assert r["shift_invariant"] == cls.traits.shift_invariant
        assert r["rows_sum_to_one"] == cls.traits.rows_sum_to_one
        s = make_scorer(r["name"], num_heads=2)
        for t in r["trainable"]:
            assert isinstance(getattr(s, f"{t}_raw"), torch.nn.Parameter)


def _default_inputs(name, seed, shape=(2, HEADS, 4, 6)):
    gen = torch.Generator().manual_seed(seed)
    scorer = build(name)
    x = torch.randn(shape, generator=gen, dtype=F64) * 2
    mask = make_mask("random", shape, gen) | torch.eye(shape[-2], shape[-1], dtype=torch.bool)
    return scorer, x, mask, qk_inputs(scorer, shape, gen)


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_shift_invariance_trait(name):
    trait = SCORERS[name].traits.shift_invariant
    if trait.startswith("n/a"):
        assert SCORERS[name].uses_qk, "'n/a' is only for scorers that do not read logits"
        return
    worst = 0.0
    for seed in range(3):
        scorer, x, mask, kw = _default_inputs(name, seed)
        w = scorer(x, mask, **kw)
        for c in (-2.5, 0.7, 4.0):
            shift = torch.full(x.shape[:-1] + (1,), c, dtype=F64)
            shift = shift + torch.randn(shift.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
            worst = max(worst, float((scorer(x + shift, mask, **kw) - w).abs().max()))
    if trait.startswith("yes"):
        assert worst < 1e-9, f"{name} is marked shift invariant but moves by {worst:.2e}"
    elif trait.startswith("no"):
        assert worst > 1e-3, f"{name} is marked not shift invariant but moves by only {worst:.2e}"
    else:
        pytest.fail(f"unknown shift_invariant trait {trait!r}")


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_row_mass_trait(name):
    trait = SCORERS[name].traits.rows_sum_to_one
    sums = []
    for seed in range(3):
        scorer, x, mask, kw = _default_inputs(name, seed)
        if kw:
            kw = {k: v.abs() + 0.05 for k, v in kw.items()}
        sums.append(scorer(x, mask, **kw).sum(-1)[mask.expand(x.shape).any(-1)])
    sums = torch.cat(sums)
    if trait.startswith("yes"):
        torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-9)
    elif trait == "< 1":
        assert (sums < 1).all()
    elif "<= 1" in trait:
        assert (sums <= 1 + 1e-12).all()
        assert (sums < 1 - 1e-3).any(), "claims only <= 1, but every row sums to one"
    elif trait.startswith("no"):
        assert ((sums - 1).abs() > 1e-3).any()
    else:
        pytest.fail(f"unknown rows_sum_to_one trait {trait!r}")


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_limit_trait(name):
    cls = SCORERS[name]
    limit = cls.traits.limit
    gen = torch.Generator().manual_seed(2)
    shape = (2, HEADS, 3, 5)
    scorer = build(name)
    # distinct logits, each row with a clearly positive maximum
    base = torch.stack([torch.randperm(5, generator=gen) for _ in range(18)]).to(F64).reshape(shape)
    x = (base - 1.5) * 0.4 + 0.05  # values -0.55 .. 1.05, spacing 0.4
    kw = qk_inputs(scorer, shape, gen, away=0.2)

    def at(c, s=scorer):
        return s(c * x, **kw)

    # "<default limit> (<option>=<value>: <variant limit>)": the variant is checked too
    default, _, variant = limit.partition(" (")
    if "=" in variant and ": " in variant:
        option, _, variant_limit = variant.rstrip(")").partition(": ")
        other = build(f"{name}:{option}")
        if variant_limit == "unbounded":
            big = [float(at(c, other).abs().max()) for c in (10.0, 1e2, 1e3)]
            assert big[0] < big[1] < big[2] and big[2] > 100, big
        else:
            pytest.fail(f"no check for variant limit {variant!r} of {name}")

    if default == "one-hot":
        w = at(1e3)
        onehot = torch.nn.functional.one_hot(x.argmax(-1), 5).to(F64)
        torch.testing.assert_close(w, onehot, rtol=0, atol=1e-6)
        assert float((at(1.0) - onehot).abs().max()) > 0.05  # not already one-hot at c = 1
    elif default == "0/1 step":
        torch.testing.assert_close(at(1e3), (x > 0).to(F64), rtol=0, atol=1e-6)
        assert float((at(1.0) - (x > 0).to(F64)).abs().max()) > 0.05
    elif default == "x₊ⁿ/Σx₊ⁿ":
        n = scorer.n.detach().reshape(-1, 1, 1)
        lim = x.clamp_min(0) ** n / (x.clamp_min(0) ** n).sum(-1, keepdim=True)
        torch.testing.assert_close(at(1e7), lim, rtol=0, atol=1e-4)
        assert float((at(1.0) - lim).abs().max()) > 0.05
    elif default == "scale-free":  # w(c·x) = c^p·w(x): the renormalized weights do not move
        w1, w2 = at(1.0), at(37.0)
        torch.testing.assert_close(w1 / w1.sum(-1, keepdim=True), w2 / w2.sum(-1, keepdim=True))
        assert not torch.allclose(w1, w2)
    elif default == "n/a":  # q, k scorers: logits are not read, and the scale of q, k drops out
        assert cls.uses_qk
        w1 = at(1.0)
        torch.testing.assert_close(at(1e3), w1, rtol=0, atol=0)
        w2 = scorer(x, query=kw["query"] * 30, key=kw["key"] * 0.5)
        torch.testing.assert_close(w1, w2)
    else:
        pytest.fail(f"no check for limit trait {limit!r} of {name}")
