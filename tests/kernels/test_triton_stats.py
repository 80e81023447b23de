"""diagnose's statistics in the Triton kernel (softmax_statistics(backend="triton"), the CUDA path) against
float64, without a GPU: the kernel runs under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors).

Every field of RowStatistics the kernel produces — max, total, spread, top-k, first, target t and x,
Σ x² and the count, the position terms (key-bin and distance-bin mass, distance sum), the visible
counts — and the output, against tests/helpers/float_reference.py's float64 formulas
(:func:`logit_statistics`, which imports nothing of ssacli) on named cases: odd lengths, GQA, causal
bands with windows and a KV-cache offset, boolean and float padding masks with an empty row, plain
softmax and SSA (b, n per head), rows driven to collapse, float32 and bfloat16 inputs.

bfloat16 inputs are drawn on a grid of eighths (4 significant bits), so every q·k is exact in float32
and float64 alike and the logits, rounded to bfloat16 after the product and after the scaling (as the
eager path forms them: ssacli.kernels.stats_call), are bit-identical in the kernel and the reference:
what is measured is the kernel's own float32 arithmetic after the logits. Errors are normalized,
max |got − want| / max(1, max |want|) over the finite entries (non-finite entries must match). Bounds:
2e-6 on every statistic (the worst measured is 2.6e-7), and 5e-6 absolute on the entropy
log l + spread / l derived from them (the worst, 1.3e-6 on a float32 SSA row with large logits, is the
float32 rounding of the logits themselves: the torch block math misses by the same 1.3e-6 there);
the output 1e-5 in float32, 1e-2 in bfloat16 (its weights are rounded to bf16 before p·v and the
output to bf16, as SDPA does). Shapes are tiny: the interpreter runs each program in Python.

Skipped where the optional ``triton`` package is missing (``pip install ssacli[gpu]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from tests.helpers.interpreted import import_interpreted  # noqa: E402

triton_stats = import_interpreted("ssacli.kernels.triton_stats")
if not triton_stats.INTERPRETED:  # imported earlier in this process for a GPU
    pytest.skip("ssacli.kernels.triton_stats was imported without TRITON_INTERPRET", allow_module_level=True)

from ssacli.kernels.online_stats import softmax_statistics  # noqa: E402
from ssacli.kernels.positions import PositionBins  # noqa: E402
from ssacli.kernels.stats_call import StatisticsCall  # noqa: E402
from tests.helpers import naive  # noqa: E402
from tests.helpers.float_reference import logit_statistics  # noqa: E402

FIELDS = ("max", "total", "spread", "top", "first", "target", "target_logit", "logit_sq", "logit_n",
          "key_mass", "distance_mass", "distance_sum")  # fmt: skip
BOUND = 2e-6
ENTROPY_BOUND = 5e-6
OUT_BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SCALING = 0.25
BINS = (3, 4)  # sink_k, bin_width: these short calls span several bins of each kind


@dataclass(frozen=True)
class Case:
    q_len: int
    k_len: int | None = None  # None: q_len; larger: the last q_len queries of a KV cache
    heads: int = 2
    kv_heads: int = 1
    batch: int = 1
    causal: bool = True
    window: int | None = None
    mask: str | None = None  # "bool" or "float": padding of sample 1's last keys and one empty row
    ssa: bool = False
    dtype: torch.dtype = torch.float32
    dominant: bool = False  # one key ×40 in sample 0: its rows collapse onto it


BF16 = torch.bfloat16
CASES = {
    "t33-causal-gqa-4/2": Case(33, heads=4, kv_heads=2),
    "t29-ssa-window-7": Case(29, window=7, ssa=True),
    "t21-bf16-ssa-gqa": Case(21, ssa=True, dtype=BF16, batch=2),
    "t19-bf16-bool-padding": Case(19, batch=2, mask="bool", dtype=BF16),
    "t5-of-40-decode-window-11-collapse": Case(5, 40, window=11, dominant=True),
    "t23-float-mask-ssa-collapse": Case(23, batch=2, causal=False, mask="float", ssa=True, dominant=True),
}


def _inputs(case: Case):
    gen = torch.Generator().manual_seed(7)
    k_len = case.k_len or case.q_len
    shapes = [(case.batch, case.heads, case.q_len, 16), (case.batch, case.kv_heads, k_len, 16),
              (case.batch, case.kv_heads, k_len, 16)]  # fmt: skip
    if case.dtype == torch.bfloat16:  # eighths: exact products, identical bf16 logits (module docstring)
        q, k, v = (torch.randint(-12, 13, s, generator=gen).double() / 8 for s in shapes)
    else:
        q, k, v = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes)
    if case.dominant:
        k[0, :, k_len - case.q_len + 1] *= 40.0  # the second query's own key
    return [t.to(case.dtype) for t in (q, k, v)]


def _visible(case: Case) -> torch.Tensor:
    """[b, 1, q, k] the keys each query sees (the reference's own reading of the case)."""
    k_len = case.k_len or case.q_len
    pos = torch.arange(k_len - case.q_len, k_len)[:, None]
    keys = torch.arange(k_len)[None]
    shown = torch.ones(case.batch, 1, case.q_len, k_len, dtype=torch.bool)
    if case.mask is not None:  # sample 1's last third of keys are padding; query 2 of sample 0 sees none
        shown[-1, ..., k_len - k_len // 3 :] = False
        shown[0, :, 2] = False
    if case.causal:
        shown &= keys <= pos
    if case.window is not None:
        shown &= pos - keys < case.window
    return shown


def _call(case: Case, heads: int, shown: torch.Tensor) -> StatisticsCall:
    mask = None
    if case.mask == "bool":
        mask = shown
    elif case.mask == "float":
        mask = torch.zeros(shown.shape).masked_fill(~shown, torch.finfo(torch.float32).min)
    ssa = None
    if case.ssa:
        ssa = (torch.linspace(0.6, 1.3, heads), torch.linspace(1.2, 3.0, heads))
    return StatisticsCall(
        scaling=SCALING, mask=mask, causal=case.causal and mask is None,
        window=case.window if mask is None else None, transform=(lambda x, c: x) if ssa else None,
        ssa=ssa, target=torch.tensor([2, 5][: case.batch]), top_k=5, positions=PositionBins(*BINS),
    )  # fmt: skip


def _reference(case: Case, q, k, v, shown, call: StatisticsCall):
    heads = q.shape[1]
    q64 = q.double()
    k64, v64 = (t.double().repeat_interleave(heads // t.shape[1], 1) for t in (k, v))
    x = q64 @ k64.transpose(-1, -2)
    if case.dtype != torch.float32:  # as the eager path forms them: a 16-bit product, then the scaling
        x = (x.to(case.dtype).double() * SCALING).to(case.dtype).double()
    else:
        x = x * SCALING
    t = x
    if call.ssa is not None:
        b, n = (p.double().view(1, -1, 1, 1) for p in call.ssa)
        t = n * torch.sign(x) * torch.log1p(b * x.abs())
    return logit_statistics(x, shown, v64, call.target, call.top_k, t=t, bins=BINS), x, t


def _error(have: torch.Tensor, want: torch.Tensor) -> float:
    have, want = torch.broadcast_tensors(have.double(), want.double())
    finite = torch.isfinite(want)
    same = (have == want) | (have.isnan() & want.isnan())
    if not bool((same | finite).all()) or not bool(torch.isfinite(have[finite]).all()):
        return math.inf  # a non-finite entry where the reference has another value
    if not finite.any():
        return 0.0
    gap = (have[finite] - want[finite]).abs().max().item()
    return gap / max(1.0, want[finite].abs().max().item())


def run_case(case: Case) -> dict[str, float]:
    """Every statistic's normalized error against float64, and the output's."""
    q, k, v = _inputs(case)
    shown = _visible(case)
    call = _call(case, q.shape[1], shown)
    out, got = softmax_statistics(q, k, v, call, backend="triton")
    want, x, t = _reference(case, q, k, v, shown, call)
    if call.ssa is not None:  # the reference's transform is SSA's: tests/helpers/naive.py's row formula
        b, n = (float(p[0]) for p in call.ssa)
        seen = shown[0, 0, -1]
        weights = naive.ROWS["ssa"](x[0, 0, -1][seen].numpy(), {"b": b, "n": n}, {})
        torch.testing.assert_close(torch.softmax(t[0, 0, -1][seen], 0), torch.tensor(weights).double())
    errors = {name: _error(getattr(got, name), want[name]) for name in FIELDS}
    errors["visible"] = _error(got.visible, shown.sum(-1).double())
    sink_k, width = BINS
    edges = [0, sink_k, *range(sink_k + width, shown.shape[-1], width), shown.shape[-1]]
    per_bin = [shown[..., a:z].sum(-1).double() for a, z in zip(edges[:-1], edges[1:], strict=True)]
    errors["key_visible"] = _error(got.key_visible, torch.stack(per_bin, -1))
    # the entropy H = log l + spread / l, absolute: collapsed rows keep its digits (H ~ 1e-9 there)
    seen = want["total"] > 0
    entropy = torch.log(got.total) + got.spread / got.total
    want_entropy = torch.log(want["total"]) + want["spread"] / want["total"]
    errors["entropy"] = (entropy - want_entropy)[seen].abs().max().item()
    want_out = want["out"]
    errors["out"] = (out.double() - want_out).abs().max().item() / want_out.abs().max().item()
    return errors


@pytest.mark.parametrize("name", list(CASES))
def test_every_statistic_matches_float64(name):
    case = CASES[name]
    errors = run_case(case)
    bounds = {"out": OUT_BOUND[case.dtype], "entropy": ENTROPY_BOUND}
    bad = {f: e for f, e in errors.items() if e > bounds.get(f, BOUND)}
    assert not bad, bad


def test_the_cases_cover_what_they_name():
    """Collapsed rows where asked, an empty row under the masks, GQA, rows past the window."""
    case = CASES["t5-of-40-decode-window-11-collapse"]
    q, k, v = _inputs(case)
    _, got = softmax_statistics(q, k, v, _call(case, 2, _visible(case)), backend="triton")
    assert (1 / got.total[0]).max() > 0.999  # max weight: a row collapsed onto the dominant key
    case = CASES["t19-bf16-bool-padding"]
    q, k, v = _inputs(case)
    out, got = softmax_statistics(q, k, v, _call(case, 2, _visible(case)), backend="triton")
    assert got.max[0, :, 2].eq(-math.inf).all() and got.total[0, :, 2].eq(0).all()
    assert out[0, :, 2].eq(0).all() and got.finite_logits and got.finite_output


def test_calls_the_kernel_lacks_a_term_of_are_refused():
    q = torch.zeros(1, 2, 3, 16)
    for extra in ({"softcap": 30.0}, {"probe": lambda x, cols: x}, {"transform": lambda x, c: x * 2}):
        with pytest.raises(ValueError, match="computes no statistics with"):
            softmax_statistics(q, q, q, StatisticsCall(scaling=1.0, **extra), backend="triton")
