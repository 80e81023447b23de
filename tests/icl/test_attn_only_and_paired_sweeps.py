"""ICL study v2: the attention-only backbone, outlier scoring after the outlier, uncapped linear
measures, paired sweeps and the v2 plan."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ssacli.cli import app
from ssacli.errors import UsageError
from ssacli.icl.evaluate import evaluate, spearman_rows
from ssacli.icl.sweep import ScorerEntry, SweepPlan, run_name, run_sweep
from ssacli.icl.train import TrainConfig, train
from ssacli.models.icl import ICLModel, ICLSpec, load_icl
from ssacli.models.icl_task import every_labels
from ssacli.report.plots import plot_sweep
from ssacli.stats import paired_summary

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(batch_size=4, layers=1, heads=2, width=8, points_start=3, points_end=5)


# ---- the attention-only backbone ------------------------------------------------------------------


def reference_attn_only(model: ICLModel, tokens: torch.Tensor) -> torch.Tensor:
    """h = read_in(x) + position; per block h += c_proj(softmax attention of c_attn(h)), causal;
    no LayerNorm, no MLP; read_out at the x positions. Written from GPT-2's definition."""
    width, heads = model.spec.width, model.spec.heads
    d = width // heads
    backbone = model.backbone
    n = tokens.shape[1]
    h = model.read_in(tokens.unsqueeze(-1)) + backbone.wpe.weight[:n]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for block in backbone.h:
        qkv = h @ block.attn.c_attn.weight + block.attn.c_attn.bias  # GPT-2's Conv1D: x @ W + b
        q, k, v = (t.view(*h.shape[:2], heads, d).transpose(1, 2) for t in qkv.split(width, dim=-1))
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        weights = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(*h.shape)
        h = h + mixed @ block.attn.c_proj.weight + block.attn.c_proj.bias
    return model.read_out(h).squeeze(-1)[:, ::2]


def test_attn_only_is_residual_attention_and_nothing_else():
    torch.manual_seed(0)
    model = ICLModel(ICLSpec(task="linear", arch="attn-only", layers=2, heads=2, width=8)).eval()
    names = [n for n, _ in model.named_parameters()]
    assert not any(".mlp." in n or ".ln_" in n or "ln_f" in n for n in names), names
    tokens = torch.randn(3, 10)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference_attn_only(model, tokens), rtol=1e-5, atol=1e-5)


def test_attn_only_routes_attention_through_the_scorer():
    """Same seed, same weights: only the scorer differs, so a different output proves the swap
    (inputs of scale 30: GPT-2's small initial weights leave unit inputs' logits near 0, where
    SSA and softmax nearly agree)."""
    outputs = {}
    for scorer in ("softmax", "ssa:preset=authors"):
        torch.manual_seed(0)
        model = ICLModel(ICLSpec(task="every", arch="attn-only", scorer=scorer, layers=1, heads=2, width=8))
        assert all(hasattr(block.attn, "ssacli_scorer") for block in model.backbone.h)
        with torch.no_grad():
            tokens = 30 * torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
            outputs[scorer] = model(tokens)
    assert (outputs["softmax"] - outputs["ssa:preset=authors"]).abs().max() > 1e-3


def test_input_magnitude_reaches_attention_only_without_layernorm():
    """gpt2 normalizes every token before attention; attn-only does not: scaling the prompt by 100
    changes attn-only's attention weights, and leaves the first gpt2 layer's nearly unchanged
    (the position embedding is the only part LayerNorm does not rescale away; zeroed here)."""
    maps = {}
    for arch in ("gpt2", "attn-only"):
        torch.manual_seed(0)
        model = ICLModel(ICLSpec(task="every", arch=arch, layers=1, heads=2, width=8)).eval()
        with torch.no_grad():
            model.backbone.wpe.weight.zero_()
            model.read_in.bias.zero_()
            tokens = torch.randn(2, 8, generator=torch.Generator().manual_seed(2)).abs() + 0.5
            maps[arch] = [model.attention_maps(t)[0] for t in (tokens, 100 * tokens)]
    torch.testing.assert_close(maps["gpt2"][0], maps["gpt2"][1], rtol=1e-3, atol=1e-3)
    assert (maps["attn-only"][0] - maps["attn-only"][1]).abs().max() > 0.05


def test_attn_only_trains_saves_and_reloads_with_its_arch(tmp_path):
    config = TrainConfig(task="every", steps=4, arch="attn-only", scorer="ssa:preset=authors", **TINY)
    model = train(config, tmp_path / "r", device="cpu")
    meta = json.loads((tmp_path / "r" / "ssacli.json").read_text())
    assert meta["arch"] == "attn-only" and meta["training"]["config"]["arch"] == "attn-only"
    reloaded = load_icl(tmp_path / "r")
    assert reloaded.spec.arch == "attn-only"
    tokens = torch.randn(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens), model(tokens))
    with pytest.raises(UsageError, match="--arch"):
        train(TrainConfig(task="every", steps=6, scorer="ssa:preset=authors", **TINY), tmp_path / "r",
              resume=True, device="cpu")  # fmt: skip
    with pytest.raises(UsageError, match="arch"):
        ICLModel(ICLSpec(task="every", arch="nope"))


def test_a_checkpoint_without_the_arch_field_loads_as_gpt2(tmp_path):
    train(TrainConfig(task="every", steps=2, **TINY), tmp_path / "r", device="cpu")
    meta_file = tmp_path / "r" / "ssacli.json"
    meta = json.loads(meta_file.read_text())
    del meta["arch"]
    meta_file.write_text(json.dumps(meta))
    model = load_icl(tmp_path / "r")
    assert model.spec.arch == "gpt2" and hasattr(model.backbone.h[0], "mlp")


def test_cli_trains_an_attn_only_model(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["icl", "train", "--task", "some", "--arch", "attn-only", "--scorer", "ssa:preset=authors",
         "--steps", "3", "--batch-size", "4", "--layers", "1", "--width", "8", "--points-start", "3",
         "--points-end", "5", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert load_icl(out).spec.arch == "attn-only"
    bad = CliRunner().invoke(app, ["icl", "train", "--task", "some", "--arch", "mlp-only", "--out", str(out)])
    assert bad.exit_code != 0


# ---- outlier scoring and the uncapped linear measures ----------------------------------------------


class EveryOracle(torch.nn.Module):
    """Answers `every` from the tokens, wrong at the positions in ``flip`` (1-based)."""

    def __init__(self, flip=()):
        super().__init__()
        self.spec = ICLSpec(task="every")
        self.flip = flip
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        pred = every_labels(tokens[:, 0::2])
        for position in self.flip:
            pred[:, position - 1] *= -1
        return pred


def test_outlier_is_scored_apart_from_the_positions_after_it():
    wrong_at_outlier = evaluate(EveryOracle(flip=(3,)), lengths=(9,), outliers=((100.0, 3),), prompts=20)[0]
    assert wrong_at_outlier.error == 1.0  # the paper's metric counts the outlier's own position
    assert wrong_at_outlier.at_outlier == 1.0 and wrong_at_outlier.after_outlier == 0.0
    wrong_later = evaluate(EveryOracle(flip=(6,)), lengths=(9,), outliers=((100.0, 3),), prompts=20)[0]
    assert wrong_later.at_outlier == 0.0 and wrong_later.after_outlier == 1.0
    # at position 5, positions 3 and 4 come before the outlier: in `error`, not in after_outlier
    before = evaluate(EveryOracle(flip=(4,)), lengths=(9,), outliers=((100.0, 5),), prompts=20)[0]
    assert before.error == 1.0 and before.after_outlier == 0.0 and before.at_outlier == 0.0
    plain = evaluate(EveryOracle(), lengths=(9,), prompts=20)[0]
    assert plain.after_outlier is None and plain.at_outlier is None


class LinearOracle(torch.nn.Module):
    """Knows the function from the first two points (a = Δy/Δx) and predicts squash(a·x + b)."""

    def __init__(self, squash=None):
        super().__init__()
        self.spec = ICLSpec(task="linear")
        self.squash = squash or (lambda v: v)
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        xs, ys = tokens[:, 0::2].double(), tokens[:, 1::2].double()
        a = (ys[:, 1] - ys[:, 0]) / (xs[:, 1] - xs[:, 0])
        b = ys[:, 0] - a * xs[:, 0]
        return self.squash(a[:, None] * xs + b[:, None]).float()


def test_uncapped_measures_see_through_a_capped_read_out():
    exact = evaluate(LinearOracle(), sigmas=(1.0,), lengths=(12,), prompts=64)[0]
    assert exact.normalized_error < 1e-6 and exact.rank_corr == pytest.approx(1.0) and exact.sign_error == 0
    # a read-out capped at ±1 (v / (1 + |v|) of the truth v) at σ = 50: MSE/Var(y) is ~1, as for a model that
    # knows nothing, but the predictions are still perfectly ordered and signed
    capped = evaluate(LinearOracle(lambda v: v / (1 + v.abs())), sigmas=(50.0,), lengths=(12,), prompts=64)[0]
    assert capped.normalized_error > 0.9
    assert capped.rank_corr > 0.99 and capped.sign_error < 0.01
    assert capped.max_abs_prediction <= 1.0 < 10 < capped.max_abs_target
    # coefficient scaling is recorded per cell and reaches the targets
    wide = evaluate(LinearOracle(), sigmas=(1.0,), lengths=(12,), coef_sigma=8.0, prompts=64)[0]
    assert wide.coef_sigma == 8.0 and wide.max_abs_target > 3 * exact.max_abs_target


def test_spearman_rows_by_hand():
    a = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
    b = torch.tensor([[10.0, 20.0, 30.0], [3.0, 2.0, 1.0], [1.0, 3.0, 2.0], [1.0, 2.0, 3.0]])
    # row 3: d = (0, 1, 1), 1 - 6·2 / (3·(9 - 1)) = 0.5; row 4: a constant row correlates 0
    assert spearman_rows(a, b).tolist() == pytest.approx([1.0, -1.0, 0.5, 0.0])


# ---- paired sweeps ------------------------------------------------------------------------------------


def test_tiny_paired_sweep_over_two_backbones(tmp_path):
    plan = SweepPlan(
        tasks=["linear"],
        scorers=[
            ScorerEntry("softmax", "softmax", seeds=2),
            ScorerEntry("ssa", "ssa:preset=authors", seeds=2),
        ],
        archs=["gpt2", "attn-only"],
        steps=2,
        batch_size=4,
        points_start=3,
        points_end=5,
        sigmas=[1, 4],
        lengths=[5],
        outliers=[100],
        coef_sigmas=[1, 4],
        prompts=8,
    )
    summary = run_sweep(plan, tmp_path)
    assert len(summary["runs"]) == 8
    assert (tmp_path / "runs" / run_name("linear", "ssa", 1, "attn-only")).is_dir()
    assert (tmp_path / "runs" / "linear-ssa-s1").is_dir()  # gpt2 runs keep the v1 folder names
    runs = {(r["arch"], r["label"], r["seed"]): r for r in summary["runs"]}
    # the paired row of a cell is the per-seed difference of the two runs' values
    rows = [
        r for r in summary["paired"]
        if (r["arch"], r["metric"], r["sigma"], r["outlier"]) == ("attn-only", "rank_corr", 4, None)
    ]  # fmt: skip
    assert len(rows) == 1 and rows[0]["higher_is_better"] and rows[0]["reference"] == "softmax"

    def value(arch, label, seed):
        (cell,) = [
            c for c in runs[(arch, label, seed)]["cells"]
            if c["sigma"] == 4 and c["outlier"] is None and c["coef_sigma"] == 1
        ]  # fmt: skip
        return cell["rank_corr"]

    expected = paired_summary(
        {s: value("attn-only", "softmax", s) for s in (0, 1)},
        {s: value("attn-only", "ssa", s) for s in (0, 1)},
    )
    assert rows[0]["differences"] == pytest.approx(expected["differences"])
    assert rows[0]["ci_low"] == pytest.approx(expected["ci_low"])
    metrics = {(r["metric"], r["coef_sigma"], r["outlier"]) for r in summary["paired"]}
    assert {("after_outlier", 1.0, 100), ("at_outlier", 1.0, 100), ("error", 4, None)} <= metrics
    plot_sweep(summary, tmp_path / "figures")
    for stem in ("linear-attn-only-sigma", "linear-gpt2-coef-rank", "linear-gpt2-outlier-paired"):
        assert (tmp_path / "figures" / f"{stem}.png").stat().st_size > 1000


def test_the_v2_plan_is_paired_and_complete():
    plan = SweepPlan.from_json(ROOT / "docs" / "results" / "icl-v2-plan.json")
    assert set(plan.tasks) == {"every", "some", "linear"}
    assert set(plan.archs) == {"gpt2", "attn-only"}
    assert len(plan.scorers) == 4 and len({s.seeds for s in plan.scorers}) == 1
    assert plan.scorers[0].seeds >= 8
    specs = {s.spec for s in plan.scorers}
    assert "softmax" in specs and "ssa:preset=authors" in specs
    assert plan.reference_label == "softmax"
    assert plan.coef_sigmas and max(plan.coef_sigmas) > 1
