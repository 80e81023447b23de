"""diagnose tells the truth: probes that cannot move attention say so, overflow is never a number,
scorers that cannot respond read n/a, collapse is counted from the baseline, and the literature's
sink rate, massive activations and kurtosis match values computed here by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ssacli import diagnose
from ssacli.check.requirements import parse_requirement, run_check
from ssacli.diagnosis.metrics import sink_indicator
from ssacli.diagnosis.recorder import LayerStats, Moments
from ssacli.diagnosis.result import SCHEMA_VERSION, DiagnoseResult
from tests.helpers.cli import unwritable
from tests.helpers.models import VOCAB, build_model


def _ids(samples=4, length=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (samples, length), generator=gen).tolist()


# ---- overflow ---------------------------------------------------------------------------------------


def test_overflow_at_a_huge_level_is_reported_as_overflow_and_fails_check():
    model = build_model("llama")
    ids = _ids()
    # The model itself gives finite-looking garbage: RMSNorm's sum of squares overflows to inf, so
    # every normalized state is 0 and the logits are finite (what the old report printed as numbers).
    with torch.no_grad():
        embeds = model.get_input_embeddings()(torch.tensor(ids)) * 1e30
        out = model(inputs_embeds=embeds)
    assert torch.isfinite(out.logits).all()
    result = diagnose(model, ["embed-scale:1,1e30"], inputs=ids)
    probe = result.probe("embed-scale")
    assert probe.overflow[0] is None
    assert probe.overflow[1]["layer"] == 0 and "norm" in probe.overflow[1]["where"]
    for name, values in probe.metrics.items():
        assert np.isnan(values[1]).all(), name  # no finite-looking numbers from an overflowed forward
    assert np.isfinite(probe.metrics["entropy"][0]).all()
    assert probe.extras["loss"][1] is None and math.isfinite(probe.extras["loss"][0])
    assert probe.collapse_status() == "overflow at 1e+30"
    data = json.loads(result.to_json())
    assert data["probes"][0]["overflow"][1]["layer"] == 0
    assert any(f["kind"] == "overflow" for f in data["findings"])
    report = run_check(model, ["entropy@embed-scale:1e30 >= 0.0"], inputs=ids)
    assert not report.passed and "overflow" in report.outcomes[0].message
    ok = run_check(model, ["entropy@embed-scale:1 >= 0.0"], inputs=ids)
    assert ok.passed


# ---- insensitive by construction ------------------------------------------------------------------


def test_cosformer_under_logit_probes_is_na_and_its_numbers_indeed_do_not_move():
    model = build_model("gpt2")
    probes = ["logit-scale:1,1000", "dominant-key:0,1000", "key-scale:1,1000"]
    result = diagnose(model, probes, scorer="cosformer", inputs=_ids())
    for name in ("logit-scale", "dominant-key"):
        probe = result.probe(name)
        assert probe.insensitive and "cosformer" in probe.insensitive
        assert probe.collapse_status() == "n/a" and probe.collapse_point() is None
        # the reason is true: the weights are identical at both levels
        np.testing.assert_allclose(probe.metrics["max_weight"][0], probe.metrics["max_weight"][1], atol=1e-6)
    keys = result.probe("key-scale")  # cosformer reads k, so a scaled key does move it
    assert keys.insensitive is None
    capture = keys.model_mean("outlier_capture")
    assert capture[1] > capture[0] + 0.05
    data = json.loads(result.to_json())
    assert data["probes"][0]["insensitive"] and data["summary"]["collapse_status"]["logit-scale"] == "n/a"
    assert any(f["kind"] == "insensitive" for f in data["findings"])


def test_ssa_responds_to_logit_scale_and_is_measured():
    """SSA is not scale invariant: (1+b·α|x|)^(±n) moves mass from negative to positive logits as α
    grows (towards weights ∝ x^n over the positive ones), so logit-scale is measured, never n/a."""
    import torch

    from ssacli.scorers import make_scorer

    scorer = make_scorer("ssa:b=0.4,n=4")
    logits = torch.tensor([[[[1.0, 0.5, -0.5, -1.0]]]])
    weights = [scorer(alpha * logits, None)[0, 0, 0] for alpha in (1.0, 8.0)]
    assert weights[1][0] > weights[0][0] + 0.05 and weights[1][3] < weights[0][3]  # it responds
    result = diagnose("builtin:every-ssa", ["logit-scale:1,8"], samples=2)
    probe = result.probe("logit-scale")
    assert probe.insensitive is None and probe.collapse_status() != "n/a"


# ---- where probes act ----------------------------------------------------------------------------


def test_key_scale_reaches_a_prenorm_model_where_embed_scale_does_not():
    model = build_model("llama", num_hidden_layers=1)  # one pre-norm (RMSNorm) layer
    ids = _ids()
    result = diagnose(model, ["embed-scale:1,32", "key-scale:1,32,1000"], inputs=ids)
    embed = result.probe("embed-scale")
    # RMSNorm divides σ back out: layer 0's attention is unchanged, and the report says so.
    for name in ("entropy", "max_weight", "sink_mass"):
        np.testing.assert_allclose(embed.metrics[name][1], embed.metrics[name][0], atol=1e-4)
    assert embed.reach_model()[1] == pytest.approx(1.0, abs=5e-3)  # RMSNorm eps only
    assert embed.reached() is False
    assert embed.collapse_status() == "absorbed by model.layers.0.input_layernorm"
    keys = result.probe("key-scale")
    # logits are linear in k: the target key's logits are exactly σ times larger
    assert keys.reach_model()[1] == pytest.approx(32.0, rel=1e-4)
    assert keys.reached() is True
    capture = keys.metrics["outlier_capture"][:, 0]  # [level, head] of the one layer
    assert np.abs(capture[2] - capture[0]).max() > 0.2  # the scaled key wins or loses the rows
    kinds = {f["kind"]: f for f in result.findings()}
    assert kinds["absorbed"]["probe"] == "embed-scale"


# ---- baseline-relative collapse --------------------------------------------------------------------


def _sink_head_model():
    """GPT-2, one layer, two heads; head 0 is made a sink: its query is a constant bias and its key
    reads embedding dimension 0, which only token 1 (put at position 0) carries, hugely."""
    model = build_model("gpt2", n_layer=1, n_head=2, n_embd=16)
    with torch.no_grad():
        emb = model.transformer.wte.weight
        emb[1] = 0.0
        emb[1, 0] = 30.0
        emb[:, 0] = torch.where(torch.arange(emb.shape[0]) == 1, emb[:, 0], torch.zeros(()))
        attn = model.transformer.h[0].attn.c_attn  # Conv1D: [in, 3·out] = q | k | v
        d = 16
        attn.weight[:, 0:8] = 0.0
        attn.bias[0:8] = 0.0
        attn.bias[0] = 10.0  # head 0's query: constant
        attn.weight[:, d : d + 8] = 0.0
        attn.bias[d : d + 8] = 0.0
        attn.weight[0, d] = 10.0  # head 0's key: dimension 0 of the normalized input
    return model


def test_baseline_relative_collapse_point_with_a_sink_head():
    model = _sink_head_model()
    ids = [[1, *seq] for seq in _ids(samples=4, length=15)]
    result = diagnose(model, ["logit-scale:1,2,4,8,16,32,64"], inputs=ids)
    probe = result.probe("logit-scale")
    # Reference: the model's own eager attention puts nearly everything on key 0 in head 0.
    with torch.no_grad():
        attn = model(torch.tensor(ids), output_attentions=True).attentions[0]
    head0_first = attn[:, 0, 1:, 0].mean().item()
    assert head0_first > 0.9
    assert probe.metrics["sink_rate"][0, 0, 0] == 1.0  # Gu: mean weight on the first token > 0.3
    assert probe.baseline_collapsed_heads() == [(0, 0)]
    # Counted naively the model "collapses" at the first level (head 0 alone is half the heads) ...
    assert probe.model_mean("collapse_rate")[0] >= 0.5
    # ... counted from the baseline the collapse point is where head 1 collapses, never level 1.
    head1 = probe.metrics["collapse_rate"][:, 0, 1]
    expected = next((lv for lv, r in zip(probe.levels[1:], head1[1:]) if r >= 0.5), None)
    assert probe.collapse_point() == expected and expected != 1.0
    assert probe.head_collapse_points()[0][0] is None
    data = json.loads(result.to_json())
    assert data["probes"][0]["summary"]["baseline_collapsed_heads"] == [[0, 0]]
    kinds = {f["kind"]: f for f in result.findings()}
    assert kinds["collapsed_at_baseline"]["heads"] == [[0, 0]]
    assert kinds["sink_heads"]["value"] == 1


# ---- literature metrics, by hand --------------------------------------------------------------------


def test_sink_rate_is_the_share_of_heads_over_eps():
    mass = np.array([[0.1, 0.31, 0.3, np.nan]])
    np.testing.assert_array_equal(sink_indicator(mass), [[0.0, 1.0, 0.0, np.nan]])


def test_top3_and_median_equal_torch_topk_and_median():
    """The partition that finds a layer's top-3 |h| and lower median gives torch's values exactly: ties,
    an even count, three values, and NaN (torch ranks it first: the torch path is taken)."""
    from ssacli.diagnosis.recorder import top3_and_median

    gen = torch.Generator().manual_seed(0)
    cases = [
        torch.randn(10_000, generator=gen, dtype=torch.float64).abs(),
        torch.tensor([2.0, 2.0, 1.0, 5.0, 5.0, 0.5], dtype=torch.float64),
        torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64),
        torch.tensor([1.0, float("nan"), 4.0, 0.0], dtype=torch.float64),
    ]
    for x in cases:
        top, median = top3_and_median(x)
        want = x.topk(3).values
        assert torch.equal(top, want) or (torch.isnan(want).any() and torch.equal(top.isnan(), want.isnan()))
        assert median == float(x.median()) or (math.isnan(median) and x.isnan().any())


def test_kurtosis_and_massive_activations_by_hand():
    gen = np.random.default_rng(0)
    values = gen.standard_t(3, size=5000)
    values[17] = 900.0
    stats = LayerStats()
    for chunk in np.array_split(values, 3):
        stats.add_hidden(torch.tensor(chunk, dtype=torch.float32))
    out = stats.means()
    x = values.astype(np.float32).astype(np.float64)
    mu = x.mean()
    expected = ((x - mu) ** 4).mean() / ((x - mu) ** 2).mean() ** 2
    assert out["kurtosis"] == pytest.approx(expected, rel=1e-6)
    top = np.sort(np.abs(x))[::-1][:3]
    assert [out["massive_top1"], out["massive_top2"], out["massive_top3"]] == pytest.approx(top.tolist())
    # the lower median of each batch (torch.median's definition), averaged over batches
    medians = [np.sort(np.abs(c.astype(np.float32)))[(len(c) - 1) // 2] for c in np.array_split(values, 3)]
    assert out["hidden_median"] == pytest.approx(np.mean(medians), rel=1e-5)
    assert out["massive_ratio"] == pytest.approx(top[0] / np.mean(medians), rel=1e-5)
    gaussian = gen.standard_normal(200_000)
    assert Moments.of(torch.from_numpy(gaussian)).kurtosis() == pytest.approx(3.0, abs=0.05)


def test_layer_hidden_metrics_match_the_models_hidden_states():
    model = build_model("llama", num_hidden_layers=3)
    ids = _ids(samples=2, length=12)
    result = diagnose(model, ["embed-scale:1"], inputs=ids)
    probe = result.probe("embed-scale")
    with torch.no_grad():
        hidden = model(torch.tensor(ids), output_hidden_states=True).hidden_states
    for layer in range(2):  # hidden_states[i + 1] is block i's output (the last one is normed)
        x = hidden[layer + 1].double().flatten()
        mu = x.mean()
        kurt = float(((x - mu) ** 4).mean() / ((x - mu) ** 2).mean() ** 2)
        assert probe.layer_metrics["kurtosis"][0, layer] == pytest.approx(kurt, rel=1e-5)
        assert probe.layer_metrics["massive_top1"][0, layer] == pytest.approx(float(x.abs().max()), rel=1e-6)


def test_a_schema_1_result_still_loads_and_gets_new_summaries():
    result = diagnose("builtin:every-softmax", ["outlier:1,100"], samples=2)
    data = json.loads(result.to_json())
    data["schema_version"] = 1
    for key in ("findings", "layer_metrics"):
        data.pop(key)
    for p in data["probes"]:
        for key in ("layer_metrics", "overflow", "insensitive"):
            p.pop(key)
        p["metrics"].pop("sink_rate")
    old = DiagnoseResult.from_dict(data)
    probe = old.probe("outlier")
    np.testing.assert_array_equal(probe.metrics["sink_rate"], result.probe("outlier").metrics["sink_rate"])
    assert probe.reach() is None and probe.reached() is None
    assert old.findings()
    assert json.loads(old.to_json())["schema_version"] == SCHEMA_VERSION == 3  # written as the current
    assert old.unaudited is None and old.verdicts()  # fields a version-1/2 file lacks read as absent


def test_requirement_failure_names_the_worst_head():
    result = diagnose("builtin:every-softmax", ["dominant-key:0,16"], samples=2)
    req = parse_requirement("max_weight@dominant-key:16 max <= 0.1")
    outcome = req.evaluate(result)
    grid = result.probe("dominant-key").metrics["max_weight"][1]
    layer, head = np.unravel_index(int(np.nanargmax(grid)), grid.shape)
    assert not outcome.passed and f"worst: layer {layer} head {head}" in outcome.message


@pytest.mark.parametrize("op", ["<=", ">="])
def test_the_worst_head_is_the_one_past_the_bound_whatever_the_metric(op):
    """An upper bound on entropy (high = spread out, the metric's good side) fails on the most
    uniform head, a lower bound on the most saturated one: "worst" follows the bound, and names the
    head the eager result's own grid says is furthest past it."""
    result = diagnose("builtin:every-softmax", ["dominant-key:0,16"], samples=2)
    grid = result.probe("dominant-key").metrics["entropy"][1]
    finite = grid[np.isfinite(grid)]
    bound = float(finite.min()) - 1 if op == "<=" else float(finite.max()) + 1  # every head fails
    outcome = parse_requirement(f"entropy@dominant-key:16 max {op} {bound}").evaluate(result)
    pick = np.nanargmax(grid) if op == "<=" else np.nanargmin(grid)
    layer, head = np.unravel_index(int(pick), grid.shape)
    worst = f"worst: layer {layer} head {head} = {grid[layer, head]:.4g}"
    assert not outcome.passed and worst in outcome.message, outcome.message


# ---- outputs first, exit codes, check --init ---------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["diagnose", "--json", "{ro}/out.json"],
        ["diagnose", "--html", "{ro}/out.html"],
        ["check", "-r", "entropy@outlier:1 >= 0", "--junit", "{ro}/junit.xml"],
        ["check", "-r", "entropy@outlier:1 >= 0", "--json", "{ro}/check.json"],
        ["icl", "eval", "builtin:every-softmax", "--plot", "{ro}/plot.png"],
    ],
)
def test_an_unwritable_output_is_exit_4_before_any_work(tmp_path, args):
    import subprocess
    import sys
    import time

    ro = unwritable(tmp_path)
    argv = [a.format(ro=ro) for a in args]
    started = time.perf_counter()
    command = [sys.executable, "-m", "ssacli", *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    elapsed = time.perf_counter() - started
    assert done.returncode == 4, done.stderr
    assert "not a writable folder" in done.stderr
    assert elapsed < 6.0  # interpreter start + imports; no model is loaded (a run takes far longer)


def test_check_init_gates_only_probes_that_reach_this_models_attention(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ssacli.cli import app

    model = build_model("llama", num_hidden_layers=1)
    model.save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    done = runner.invoke(app, ["check", "--init", "m", "--random", "--config", "gate.toml"])
    assert done.exit_code == 0, done.output
    text = (tmp_path / "gate.toml").read_text()
    # RMSNorm divides embed-scale back out in a one-layer pre-norm model: no gate on it
    assert "# embed-scale:8 did not reach attention" in text
    assert '"collapse_rate@embed-scale' not in text
    assert '"collapse_rate@key-scale:8 <=' in text and '"collapse_rate@logit-scale:4 <=' in text
    done = runner.invoke(app, ["check", "--config", "gate.toml"])
    assert done.exit_code == 0, done.output  # the measured gate passes on the model it was measured on
