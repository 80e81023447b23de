"""diagnose's fused statistics (--stats fused) against the eager observed path and a naive formula.

Three levels:
* the kernel (ssacli.kernels.online_stats) against every metric computed by hand in float64 from the
  full weight matrix, on rows driven to collapse, with the max moving across many small key blocks;
* every attention call of real tiny models (families of the audit: GQA, sliding windows, softcap,
  position bias, learned sinks, encoders, cross-attention), padded batches, probes, scorers and
  dtypes: both paths see the very same q, k, v (the forward continues with the eager output), and
  every per-head metric and logit-scale sum must agree within 1e-6;
* whole diagnose runs, eager vs fused, float32.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ssacli.attention.forward as attention_forward
from ssacli import diagnose
from ssacli.attention.forward import observing, online_observed_attention
from ssacli.attention.interface import apply_scorer, attention_modules
from ssacli.diagnosis.metrics import METRICS
from ssacli.diagnosis.probe_kinds import PROBES
from ssacli.diagnosis.recorder import Recorder
from ssacli.errors import UsageError
from ssacli.kernels import native
from ssacli.kernels.online_stats import softmax_statistics
from ssacli.kernels.positions import PositionBins
from ssacli.kernels.stats_call import StatisticsCall
from ssacli.testing.tiny_models import build_tiny
from tests.helpers.float_reference import excess, plain_softmax_reference

ABS = 1e-6
# the sink and position metrics' bins, small enough that these short inputs span several
POSITIONS = PositionBins(sink_k=3, bin_width=4)


def _given_logits(t: torch.Tensor, value: torch.Tensor, **call):
    """softmax_statistics of a call whose logits are exactly t [b, h, q, k] (finite): query t against
    identity keys, q·kᵀ = t·I, every product but one an exact zero."""
    b, h, _, k = t.shape
    keys = torch.eye(k, dtype=t.dtype).expand(b, h, k, k)
    blocks = {name: call.pop(name) for name in ("block_rows", "block_keys", "backend") if name in call}
    return softmax_statistics(t, keys, value, StatisticsCall(scaling=1.0, **call), **blocks)


# ---- the kernel against a naive float64 formula --------------------------------------------------


def _naive(t: torch.Tensor, visible: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """Every row metric from the full weight matrix, float64: p = softmax(t) over visible keys."""
    t = torch.where(visible, t.double(), -math.inf)
    p = torch.softmax(t, dim=-1)
    logp = torch.where(p > 0, p.log(), 0.0)
    entropy = -(p * logp).sum(-1)
    return {
        "entropy": entropy,
        "max_weight": p.amax(-1),
        "topk_mass": p.topk(min(k, p.shape[-1]), dim=-1).values.sum(-1),
        "sink_mass": p[..., 0],
    }


@pytest.mark.parametrize("scale", [1.0, 32.0, 300.0])
def test_kernel_matches_the_naive_formula_on_collapsing_rows(scale):
    torch.manual_seed(0)
    b, h, q, k, d = 2, 3, 13, 29, 4
    t = torch.randn(b, h, q, k) * scale
    t[0, 0, :, 17] += 40 * scale  # a dominant key in a late block: the max moves after earlier blocks
    visible = torch.rand(b, 1, q, k) > 0.3
    visible[..., 0] = True
    value = torch.randn(b, h, k, d)
    out, stats = _given_logits(t, value, mask=visible, top_k=5, block_rows=4, block_keys=3)
    ref = _naive(t, visible, 5)
    l_, m = stats.total, stats.max
    entropy = torch.log(l_) + stats.spread / l_
    got = {
        "entropy": entropy,
        "max_weight": 1 / l_,
        "topk_mass": torch.exp(stats.top - m.unsqueeze(-1)).sum(-1) / l_,
        "sink_mass": torch.exp(stats.first - m) / l_,
    }
    for name in ref:
        assert torch.allclose(got[name], ref[name], rtol=0, atol=ABS), name
    # Collapsed rows (H ~ 1e-9) within float32's resolution of l ≈ 1, where the textbook
    # m + log l − u/l in float32 cancels to noise of the size of ulp(m) (m ≈ 40·scale there).
    assert (entropy - ref["entropy"]).abs().max() < 2e-7
    if scale >= 32:
        assert ref["entropy"][0, 0].min() < 1e-6  # the dominated rows did collapse
        t32 = torch.where(visible, t, -math.inf)
        m32 = t32.amax(-1, keepdim=True)
        e = torch.exp(t32 - m32)
        textbook = m32.squeeze(-1) + e.sum(-1).log() - (e * torch.where(visible, t, 0)).sum(-1) / e.sum(-1)
        assert (textbook.double() - ref["entropy"]).abs().max() > 1e-6  # what this form avoids
    weights = torch.softmax(torch.where(visible, t.double(), -math.inf), -1)
    assert torch.allclose(out.double(), weights @ value.double(), rtol=1e-5, atol=1e-6)


def test_kernel_rows_without_keys_are_empty_not_zero_entropy():
    b, h, q, k = 1, 1, 3, 5
    visible = torch.ones(b, 1, q, k, dtype=torch.bool)
    visible[..., 1, :] = False
    out, stats = _given_logits(torch.zeros(b, h, q, k), torch.ones(b, h, k, 2), mask=visible, block_rows=1)
    assert stats.max[0, 0, 1] == -math.inf and stats.total[0, 0, 1] == 0
    assert torch.equal(out[0, 0, 1], torch.zeros(2))


def _statistics_case(seed: int = 3):
    """A causal call with a window: blocks that every row sees whole (no mask formed) and blocks cut by
    the band, a ragged last top-k group, one infinite logit (a position bias of +inf), a target seen
    by some rows, a moving max and collapsing rows; run(**options) computes its statistics."""
    torch.manual_seed(seed)
    b, h, q, k, d = 2, 3, 40, 300, 8
    t = torch.randn(b, h, q, k) * 8
    t[1, :, :, 250] += 200.0  # a dominant key in the last block: the max moves, rows collapse
    bias = torch.zeros(b, h, q, k)
    bias[0, 1, 3, 255] = math.inf  # a non-finite logit (counted out of the logit scale)
    value = torch.randn(b, h, k, d)

    def run(**options):
        return _given_logits(
            t, value, causal=True, window=200, position_bias=bias, transform=lambda x, count: x * 0.5,
            target=torch.tensor([250, 5]), top_k=5, block_rows=16, block_keys=130, **options,
        )  # fmt: skip

    return run


STAT_FIELDS = ("max", "total", "spread", "top", "first", "target", "logit_sq", "logit_n", "target_logit")


def test_native_row_pass_equals_the_torch_path():
    """The native row pass (ssacli.kernels.native, the CPU float32 default) against the torch path's
    block math: the same statistics and output, the non-finite row flagged in both."""
    from ssacli.kernels import native

    run = _statistics_case()
    want_out, want = run(backend="torch-blocks")
    if not native.available():
        pytest.skip("the native kernel could not be built here (no C compiler)")
    out, got = run()
    assert torch.allclose(out, want_out, rtol=1e-5, atol=1e-6, equal_nan=True)
    for name in STAT_FIELDS:
        have, expect = getattr(got, name), getattr(want, name)
        finite = torch.isfinite(expect) & torch.isfinite(have)
        assert torch.equal(torch.isfinite(have), torch.isfinite(expect)), name  # same rows broke
        assert torch.allclose(have[finite], expect[finite], rtol=1e-6, atol=1e-6), name
    assert got.finite_logits is want.finite_logits is False
    assert got.finite_output is want.finite_output is False


def test_native_row_pass_on_ragged_blocks_masks_and_many_threads():
    """Block widths that are not a multiple of the kernel's vector width, a padding mask, a top-k wider
    than the kernel's chunk group, one thread and two: the same statistics as the torch path."""
    from ssacli.kernels import native

    if not native.available():
        pytest.skip("the native kernel could not be built here (no C compiler)")
    torch.manual_seed(5)
    b, h, q, k, d = 2, 2, 21, 203, 4
    t = torch.randn(b, h, q, k) * 6
    visible = torch.rand(b, 1, 1, k) > 0.25  # a padding-like mask, broadcast over heads and rows
    value = torch.randn(b, h, k, d)

    def run(top_k: int, backend: str = "auto"):
        return _given_logits(
            t, value, mask=visible, transform=lambda x, count: x.tanh() * 3, top_k=top_k, block_rows=7,
            block_keys=67, backend=backend,
        )  # fmt: skip

    threads = torch.get_num_threads()
    try:
        for n_threads, top_k in ((1, 5), (2, 20)):
            torch.set_num_threads(n_threads)
            want_out, want = run(top_k, "torch-blocks")
            out, got = run(top_k)
            assert torch.allclose(out, want_out, rtol=1e-5, atol=1e-6)
            for name in STAT_FIELDS:
                have, expect = getattr(got, name), getattr(want, name)
                if expect is not None:
                    assert torch.allclose(have, expect, rtol=1e-6, atol=1e-6, equal_nan=True), name
    finally:
        torch.set_num_threads(threads)


def test_native_build_failure_warns_once_and_keeps_the_torch_path(tmp_path):
    """A C compiler that fails ($CC=false, an empty cache): one RuntimeWarning naming the failure, no
    file left in the cache, and the statistics still come (from the torch path), equal to a run
    without the native pass."""
    import os
    import subprocess
    import sys

    script = (
        "import warnings, torch\n"
        "from ssacli.kernels import native\n"
        "from ssacli.kernels.online_stats import softmax_statistics\n"
        "from ssacli.kernels.stats_call import StatisticsCall\n"
        "q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 4)\n"
        "def run(backend='auto'):\n"
        "    return softmax_statistics(q, k, v, StatisticsCall(scaling=0.25), backend=backend)[1].total\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    a = run(); b = run()\n"
        "torch_path = run('torch-blocks')\n"
        "print(sum('native kernels failed' in str(w.message) for w in seen), native.available(),\n"
        "      bool(torch.equal(a, torch_path)))\n"
    )
    env = {**os.environ, "CC": "false", "SSACLI_CACHE": str(tmp_path)}
    env.pop("SSACLI_BACKEND", None)  # the attempt is the point, whatever the caller's setting
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False", "True"]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing half-built left behind


def test_native_build_where_the_cache_cannot_be_written_builds_privately(tmp_path):
    """$SSACLI_CACHE names a file (so no cache directory can be made there, whoever runs this): the
    kernel is built in a private temporary directory of the process, with no warning, and the file
    is left as it was."""
    import os
    import subprocess
    import sys

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("the user's file")
    script = (
        "import warnings; warnings.simplefilter('error')\n"
        "from ssacli.kernels import native\n"
        "print(native.available(), native.library().cdll._name)\n"
    )
    env = {**os.environ, "SSACLI_CACHE": str(blocker)}
    env.pop("SSACLI_BACKEND", None)  # the build is the point, whatever the caller's setting
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    available, built = done.stdout.split()
    assert available == "True" and "ssacli-kernels-" in built and not built.startswith(str(blocker))
    assert blocker.read_text() == "the user's file"


# ---- every attention call of real models: both paths on the same inputs ---------------------------


class _Pair:
    """The observer the model sees: hands each call to both recorders (fused and eager)."""

    def __init__(self, fused, eager):
        self.fused, self.eager = fused, eager
        self.block_size = eager.block_size


def _dual_forward(model, ids, mask, probe=None, level=None, target=None, block=5):
    """One forward in which every attention call runs the fused statistics and the eager observed
    path on the same q, k, v; the model continues with the eager output. Returns both recorders and
    the largest relative difference of the two outputs."""
    layers = [m for _, m in attention_modules(model)]
    layer_of = {id(m): i for i, m in enumerate(layers)}
    recorders = [
        Recorder(layer_of, tau=0.9, top_k=5, block_size=block, causal=True, stats=mode, positions=POSITIONS)
        for mode in ("fused", "eager")
    ]
    for rec in recorders:
        rec.valid, rec.target = mask.bool(), target
    if probe is not None:
        for rec in recorders:
            rec.probe = (PROBES[probe], level)
    observers = recorders
    eager_call = attention_forward.observed_attention
    worst = [0.0]

    def both(module, scorer, observer, query, key, value, attention_mask, scaling, sink, kwargs):
        args = (query, key, value, attention_mask, scaling, sink, kwargs)
        fused_out, _ = online_observed_attention(module, scorer, observer.fused, *args)
        out, weights = eager_call(module, scorer, observer.eager, *args)
        scale = out.abs().amax().float().clamp_min(1e-30)
        worst[0] = max(worst[0], float((fused_out.float() - out.float()).abs().amax() / scale))
        return out, weights

    attention_forward.observed_attention = both
    try:
        with torch.inference_mode(), observing(_Pair(*observers)):
            kwargs = {"input_ids": ids, "attention_mask": mask}
            if model.config.is_encoder_decoder:
                kwargs.update(decoder_input_ids=ids, decoder_attention_mask=mask)
            model(**kwargs)
    finally:
        attention_forward.observed_attention = eager_call
    return recorders, worst[0]


def _assert_same(fused: Recorder, eager: Recorder):
    assert fused.stats.keys() == eager.stats.keys() and eager.stats
    for layer in eager.stats:
        a, b = fused.stats[layer].means(), eager.stats[layer].means()
        for name in METRICS:
            x, y = a[name], b[name]
            assert np.array_equal(np.isnan(x), np.isnan(y)), (layer, name, x, y)
            # effective tokens count keys (up to the row length): the same 1e-6, relative
            # (and the unbounded position metrics: a distance in tokens, a ratio to uniform)
            unbounded = ("effective_tokens", "attention_distance", "sink_boost")
            big = float(np.nanmax(np.abs(y), initial=0)) if name in unbounded else 1.0
            tol = ABS * max(1.0, big)
            assert np.nanmax(np.abs(x - y), initial=0) <= tol, (layer, name, x, y)
        la, lb = fused.layers[layer].means(), eager.layers[layer].means()
        for name in ("logit_rms", "target_logit_rms", "target_logit_mean"):
            x, y = la[name], lb[name]
            same = (math.isnan(x) and math.isnan(y)) or abs(x - y) <= ABS * max(1.0, abs(y))
            assert same, (layer, name, x, y)
        assert fused.stats[layer].rows == eager.stats[layer].rows
        pa, pb = fused.stats[layer].profiles(), eager.stats[layer].profiles()
        for name in pb:  # the position profiles: shares within ABS, the boost relative
            x, y = pa[name], pb[name]
            assert np.array_equal(np.isnan(x), np.isnan(y)), (layer, name)
            scale = np.maximum(1.0, np.abs(np.nan_to_num(y))) if name == "received_boost" else 1.0
            assert np.nanmax(np.abs(x - y) / scale, initial=0) <= ABS, (layer, name, x, y)


def _padded(batch=3, length=19, vocab=128, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, 13:] = 0  # right padding
    return ids, mask, torch.tensor([5, 9, 7])


FAMILIES = [
    ("llama", "causal"),  # GQA (4 heads over 2 KV heads)
    ("mistral", "causal"),  # sliding window
    ("gemma2", "causal"),  # softcap, sliding window
    ("gpt_oss", "causal"),  # learned sinks
    ("qwen2", "causal"),
    ("gpt2", "causal"),
    ("bert", "masked"),  # bidirectional, padding mask
    ("t5", "seq2seq"),  # position bias, cross-attention
]


@pytest.mark.parametrize("family,kind", FAMILIES)
@pytest.mark.parametrize("probe,level", [(None, None), ("logit-scale", 32.0), ("dominant-key", 32.0)])
def test_every_call_matches_the_eager_path(family, kind, probe, level):
    model = build_tiny(family, kind)
    apply_scorer(model, "softmax")
    ids, mask, target = _padded()
    (fused, eager), out_gap = _dual_forward(model, ids, mask, probe, level, target)
    _assert_same(fused, eager)
    assert out_gap < 1e-5


@pytest.mark.parametrize(
    "spec", ["temperature:t=0.5", "ssa", "ssa:init=faithful,m=128", "ssmax:s=0.7", "sink:s=1", "softmax1"]
)
@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_every_softmax_family_scorer(spec, family):
    model = build_tiny(family, "causal")
    apply_scorer(model, spec)
    ids, mask, target = _padded()
    (fused, eager), out_gap = _dual_forward(model, ids, mask, "logit-scale", 32.0, target)
    _assert_same(fused, eager)
    assert out_gap < 1e-5


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "mistral"])
@pytest.mark.parametrize("probe,level", [("logit-scale", 32.0), ("dominant-key", 32.0), ("key-scale", 8.0)])
def test_bfloat16_calls(family, probe, level):
    """bf16 logits are formed exactly as the eager path forms them (bit for bit per block), so the
    statistics of the same bf16 q, k, v agree within 1e-6 like float32's."""
    model = build_tiny(family, "causal", dtype=torch.bfloat16)
    apply_scorer(model, "softmax")
    ids, mask, target = _padded()
    (fused, eager), out_gap = _dual_forward(model, ids, mask, probe, level, target)
    _assert_same(fused, eager)
    assert out_gap < 2e-2  # the eager output rounds bf16 weights before its matmul, the fused one not


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_many_key_blocks_and_causal_skipping(monkeypatch, family):
    """Key blocks far smaller than the sequence: online rescaling across blocks, skipped causal
    blocks and unmasked whole blocks (mistral: its window, 3 keys), on collapse-level probes."""
    import ssacli.attention.forward as attention_forward

    monkeypatch.setattr(attention_forward, "STATS_BLOCK_KEYS", 4)
    model = build_tiny(family, "causal")
    apply_scorer(model, "ssa")
    ids, mask, target = _padded(length=37)
    (fused, eager), _ = _dual_forward(model, ids, mask, "dominant-key", 32.0, target, block=6)
    _assert_same(fused, eager)
    ones = torch.ones_like(mask)  # no padding: the causal mask is not materialized, blocks are skipped
    (fused, eager), _ = _dual_forward(model, ids, ones, "logit-scale", 32.0, target, block=6)
    _assert_same(fused, eager)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("probe,level", [(None, None), ("key-scale", 8.0)])
def test_unmasked_softmax_calls_run_in_one_native_loop_and_match_the_eager_path(
    monkeypatch, family, probe, level
):
    """Softmax calls without a mask tensor and without a probe on the logits (no padding; the
    reference level, or a probe on the keys) take ssacli.kernels.native.stats_flash: logits, statistics
    and p·v per cached tile. Its statistics equal the eager path's within 1e-6 across key tiles
    (online rescaling), ragged row tiles and key-scale's collapsing rows."""
    import ssacli.attention.forward as attention_forward

    if not native.one_loop_available():
        pytest.skip("the native kernel or torch's sgemm is not available here")
    calls = []
    flash = native.stats_flash
    monkeypatch.setattr(native, "stats_flash", lambda *a, **k: calls.append(1) or flash(*a, **k))
    monkeypatch.setattr(attention_forward, "STATS_BLOCK_KEYS", 8)
    model = build_tiny(family, "causal")
    apply_scorer(model, "softmax")
    ids, _, target = _padded(length=37)
    ones = torch.ones_like(ids)
    (fused, eager), out_gap = _dual_forward(model, ids, ones, probe, level, target, block=6)
    assert len(calls) == model.config.num_hidden_layers, calls
    _assert_same(fused, eager)
    assert out_gap < 1e-5


@pytest.mark.parametrize(
    "heads,kv_heads,q_len,k_len,causal,window",
    [
        (4, 2, 45, 45, True, None),
        (3, 3, 45, 45, True, 9),
        (2, 1, 30, 30, False, None),
        (2, 2, 7, 40, True, 12),
    ],  # fmt: skip
    ids=["gqa-causal", "window", "non-causal", "kv-offset-window"],
)
def test_plain_softmax_statistics_equal_the_float64_reference(heads, kv_heads, q_len, k_len, causal, window):
    """The one-loop native statistics of a plain call, and softmax_statistics' torch path on the same
    call (torch.matmul, then the scaling, as ssacli.attention.forward forms the logits), against a float64
    computation from the same float32 inputs, within what float32 rounding can do in any summation
    order (tests/helpers/float_reference.py: the sgemm's tile products need not round as
    torch.matmul's on every CPU): ragged row and key tiles, grouped K/V heads, a causal band with a
    window and a KV-cache offset, a target, a key dominant enough to collapse rows, one thread and
    two."""
    if not native.one_loop_available():
        pytest.skip("the native kernel or torch's sgemm is not available here")
    gen = torch.Generator().manual_seed(11)
    b, d, scaling = 2, 16, 0.25
    q = torch.randn(b, heads, q_len, d, generator=gen) * 3
    k = torch.randn(b, kv_heads, k_len, d, generator=gen)
    dominant = k_len - q_len + 2  # query 2's own key: visible to the rows after it in every case
    k[1, :, dominant] *= 40.0  # it dominates sample 1: those rows collapse onto it
    v = torch.randn(b, kv_heads, k_len, d, generator=gen)
    pos = torch.arange(k_len - q_len, k_len)[:, None]
    keys = torch.arange(k_len)[None]
    shown = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal:
        shown &= keys <= pos
    if window is not None:
        shown &= pos - keys < window
    target = torch.tensor([min(5, k_len - 1), dominant])
    want, bound = plain_softmax_reference(q, k, v, scaling, shown, target, top_k=5)
    # the bounds are tight enough to catch a wrong kernel: ~1e-6 of the largest logit
    assert bound["max"].max() < 1e-5 * want["max"].abs().max()

    call = StatisticsCall(scaling=scaling, causal=causal, window=window, target=target, top_k=5)
    assert call.plain
    runs = {"torch": softmax_statistics(q, k, v, call, block_rows=7, block_keys=13, backend="torch-blocks")}
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            runs[f"one-loop/{n_threads}"] = softmax_statistics(q, k, v, call, block_rows=7, block_keys=13)
    finally:
        torch.set_num_threads(threads)
    for path, (out, got) in runs.items():
        assert excess(out, want["out"], bound["out"]) <= 0, (path, "out")
        for name in STAT_FIELDS:
            have = getattr(got, name)
            assert excess(have, want[name], bound[name]) <= 0, (path, name)
        assert got.finite_logits and got.finite_output
    assert (want["max"][1] - want["top"][1, ..., 1] > 30).any()  # the case really has collapsed rows


def test_plain_softmax_statistics_flag_overflowed_logits_as_the_torch_path_does():
    """A query row large enough that its logits overflow (±inf, and NaN where infinities cancel): the
    one-loop statistics mark the same rows broken and the same logits non-finite as the torch path,
    and every other row keeps its values."""
    if not native.one_loop_available():
        pytest.skip("the native kernel or torch's sgemm is not available here")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=gen) for _ in range(3))
    q[0, 1, 17] = 3e38  # row 17 of head 1: logits past float32's range
    call = StatisticsCall(scaling=0.5, causal=True)
    want_out, want = softmax_statistics(q, k, v, call, block_rows=7, block_keys=13, backend="torch-blocks")
    out, got = softmax_statistics(q, k, v, call, block_rows=7, block_keys=13)
    assert not want.finite_logits and not got.finite_logits
    assert got.finite_output == want.finite_output
    # (not logit_sq: a finite logit over 1.8e19 squares to inf in the torch path's float32, to a
    # finite float64 in the native passes, the row pass as the one loop)
    for name in ("max", "total", "spread", "logit_n"):
        have, expect = getattr(got, name), getattr(want, name)
        assert torch.equal(torch.isfinite(have), torch.isfinite(expect)), name  # the same rows broke
        finite = torch.isfinite(expect)
        assert torch.allclose(have[finite], expect[finite], rtol=1e-6, atol=1e-6), name
    assert not torch.isfinite(got.total[0, 1, 17]) and torch.isfinite(got.total[0, 0]).all()
    assert torch.allclose(out[0, 0], want_out[0, 0], rtol=1e-5, atol=1e-6)


# ---- whole diagnose runs ----------------------------------------------------------------------------


def _inputs():
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, 120, (n,), generator=gen).tolist() for n in (31, 24, 17)]


def test_diagnose_fused_equals_eager_float32():
    model = build_tiny("llama", "causal")
    probes = ["logit-scale:1,32", "dominant-key:0,32", "key-scale:1,8"]
    a = diagnose(model, probes, inputs=_inputs(), batch_size=3, stats="eager")
    b = diagnose(model, probes, inputs=_inputs(), batch_size=3, stats="fused")
    for pa, pb in zip(a.probes, b.probes, strict=True):
        for name in METRICS:
            x, y = np.asarray(pa.metrics[name]), np.asarray(pb.metrics[name])
            assert np.array_equal(np.isnan(x), np.isnan(y)), name
            scale = np.maximum(1.0, np.abs(x)) if name == "effective_tokens" else 1.0
            assert np.nanmax(np.abs(x - y) / scale, initial=0) <= ABS, (pa.name, name)
        assert np.array_equal(pa.rows, pb.rows)


def test_auto_falls_back_and_fused_refuses_other_scorers():
    """The result says which path measured each attention call (settings' stats_calls: one call
    per layer and batch here, 2 layers, one batch)."""
    model = build_tiny("llama", "causal")
    other = diagnose(model, ["logit-scale:1"], inputs=_inputs(), scorer="sigmoid")  # auto: eager weights
    assert (other.settings["stats"], other.settings["stats_calls"]) == ("auto", {"fused": 0, "eager": 2})
    softmax = diagnose(model, ["logit-scale:1"], inputs=_inputs())  # auto, softmax: the fused statistics
    assert softmax.settings["stats_calls"] == {"fused": 2, "eager": 0}
    forced = diagnose(model, ["logit-scale:1"], inputs=_inputs(), stats="eager")
    assert (forced.settings["stats"], forced.settings["stats_calls"]) == ("eager", {"fused": 0, "eager": 2})
    with pytest.raises(UsageError, match="sigmoid"):
        diagnose(model, ["logit-scale:1"], inputs=_inputs(), scorer="sigmoid", stats="fused")
    with pytest.raises(UsageError, match="--stats"):
        diagnose(model, ["logit-scale:1"], inputs=_inputs(), stats="online")


def test_row_top_equals_topk():
    from ssacli.kernels.online_stats import row_top

    torch.manual_seed(2)
    t = torch.randn(2, 3, 7, 1000).round(decimals=1)  # many ties
    t[0, 0, 0, :990] = -math.inf  # a row with few finite values
    t[1, 1, 1] = -math.inf  # a row with none
    t[1, 2, 2, 3:] = -math.inf  # only the first group holds finite values (its index comes back)
    for k in (1, 5):
        expected = t.topk(k, dim=-1).values
        got = row_top(t, k).sort(dim=-1, descending=True).values
        assert torch.equal(got, expected)
