"""Scorer parameters as their own optimizer group: own learning rate, no weight decay, in every
training loop; n can travel where the gradient asks within the default budget; the record says
what was learned and whether it converged."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import ssacli
from ssacli.defaults import SCORER_LR
from ssacli.models.checkpoint import training_record
from ssacli.models.loading import load_model
from ssacli.models.optim import make_optimizer, scorer_values, set_lr
from ssacli.scorers import make_scorer
from ssacli.train.finetune import FinetuneConfig, finetune

WORDS = "the a cat dog sees likes river old small bright quiet child teacher finds".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    generator = torch.Generator().manual_seed(0)
    words = [WORDS[i] for i in torch.randint(len(WORDS), (6000,), generator=generator).tolist()]
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(" ".join(words[i : i + 12]) for i in range(0, len(words), 12)))
    return str(path)


def scorer_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if ".ssacli_scorer." in k}


def test_one_adamw_step_moves_scorer_raws_by_scorer_lr_without_decay(tmp_path, corpus):
    # Adam's first step moves every parameter by lr·g/(|g| + eps) = ±lr (|g| >> eps): a scorer
    # parameter by exactly --scorer-lr, with no weight-decay term even though --weight-decay is large;
    # a weight matrix by --lr plus its decay.
    loaded, _ = ssacli.convert("builtin:wikitext-softmax", "ssa:init=paper,learn=b+n", text=None)
    before = scorer_tensors(loaded.model)
    matrix = "model.layers.0.self_attn.q_proj.weight"
    w0 = loaded.model.state_dict()[matrix].clone()
    config = FinetuneConfig(
        data=corpus, steps=1, lr=1e-3, scorer_lr=0.05, weight_decay=0.5, warmup=0, schedule="constant",
        batch_size=2, seq_len=16, checkpoint_every=1,
    )  # fmt: skip
    trained = finetune(loaded, config, tmp_path / "out")
    after = scorer_tensors(trained.model)
    assert before and before.keys() == after.keys()
    for key in before:
        moved = (after[key] - before[key]).abs()
        # |g|/(|g| + eps) <= 1, and > 0.98 for these gradients; a decay of 0.5 on n's raw (1.27)
        # would add 0.05 * 0.5 * 1.27 = 0.032, and the model's lr would move it by 1e-3.
        assert bool(((moved > 0.049) & (moved <= 0.05 + 1e-7)).all()), (key, moved)
    w1 = trained.model.state_dict()[matrix]
    decayed = w0 * (1 - 1e-3 * 0.5)  # AdamW: decay first, then the ±lr Adam step
    step = (w1 - decayed).abs()
    # Every entry's Adam step is at most lr once its decay is taken out (without the decay term the
    # largest would exceed lr by lr·0.5·|w|), and most are lr itself.
    assert float(step.max()) <= 1e-3 * (1 + 1e-4) and float(step.median()) == pytest.approx(1e-3, rel=1e-2)
    assert float((w1 - w0).abs().max()) > 1e-3 * (1 + 1e-2)  # ... and the decay did act
    record = training_record(tmp_path / "out")
    assert record["config"]["scorer_lr"] == 0.05


def test_scorer_lr_defaults_to_the_one_default_everywhere():
    assert FinetuneConfig(data="x").scorer_lr == SCORER_LR
    assert ssacli.ICLTrainConfig(task="every").scorer_lr == SCORER_LR


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_a_bad_scorer_lr_is_a_usage_error(value):
    with pytest.raises(ssacli.errors.UsageError, match="--scorer-lr"):
        FinetuneConfig(data="x", scorer_lr=value).validate()
    with pytest.raises(ssacli.errors.UsageError, match="--scorer-lr"):
        ssacli.ICLTrainConfig(task="every", scorer_lr=value).validate()


def fit_n(n_start: float, n_target: float, scorer_lr: float, lr: float = 1e-4) -> float:
    """Train one SSA head's n (b = 0.8 fixed) so its weights match those of n_target on fixed
    logits, with the default fine-tuning budget and schedule (steps, warmup, cosine) and the
    optimizer every loop builds; return where n ends."""
    config = FinetuneConfig(data="x", scorer_lr=scorer_lr, lr=lr)
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(64, 32, generator=generator)
    visible = torch.ones_like(logits, dtype=torch.bool)
    teacher = make_scorer(f"ssa:b=0.8,n={n_target},learn=none")
    student = make_scorer(f"ssa:b=0.8,n={n_start},learn=n")
    with torch.no_grad():
        target = teacher.score(logits, visible, None)
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = make_optimizer(student, params, lr=config.lr, scorer_lr=config.scorer_lr)
    for step in range(config.steps):
        set_lr(optimizer, config.lr_at(step) / config.lr)
        weights = student.score(logits, visible, None)
        loss = F.kl_div(weights.clamp_min(1e-30).log(), target, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(student.n.detach())


def test_n_travels_from_1_5_to_beyond_3_and_back_within_the_default_budget():
    up = fit_n(1.5, 4.0, SCORER_LR)
    assert up >= 3.0
    back = fit_n(up, 1.5, SCORER_LR)
    assert back <= 1.75
    # The reason for the group: at the model's learning rate, n barely moves in the same budget.
    assert fit_n(1.5, 4.0, 1e-4) < 1.6


def test_the_record_holds_learned_values_per_layer_and_their_convergence(tmp_path, corpus):
    loaded, _ = ssacli.convert("builtin:wikitext-softmax", "ssa:preset=authors")
    config = FinetuneConfig(
        data=corpus, steps=20, batch_size=2, seq_len=16, checkpoint_every=20, train="scorer"
    )
    finetune(loaded, config, tmp_path / "out")
    record = training_record(tmp_path / "out")["scorer"]
    layers = loaded.model.config.num_hidden_layers
    assert record["learned"] == ["n"]
    assert len(record["values"]["n"]) == layers and len(record["converged"]["n"]) == layers
    reloaded = load_model(str(tmp_path / "out"))
    assert record["values"]["n"] == scorer_values(reloaded.attention_root)["n"]
    window = training_record(tmp_path / "out")["scorer_at_window"]["n"]
    for now, then, converged in zip(record["values"]["n"], window, record["converged"]["n"]):
        assert converged == (abs(now - then) / then < 0.01)


def test_icl_train_puts_the_scorer_in_its_own_group(tmp_path):
    config = ssacli.ICLTrainConfig(
        task="every", scorer="ssa:preset=authors", steps=1, batch_size=4, scorer_lr=0.05, lr=1e-4,
        checkpoint_every=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = ssacli.train_icl(config, tmp_path / "icl")
    n = torch.stack([torch.nn.functional.softplus(v) for k, v in scorer_tensors(model).items()
                     if k.endswith("n_raw")])  # fmt: skip
    start = 1.5
    # One Adam step of ±0.05 on raw n: n moves by 0.05·sigmoid(raw) to first order.
    moved = (n - start).abs()
    slope = torch.sigmoid(torch.log(torch.expm1(torch.tensor(start))))
    torch.testing.assert_close(moved, torch.full_like(moved, float(0.05 * slope)), rtol=0.05, atol=0)
    assert model.spec.training["scorer"]["learned"] == ["n"]


def test_finetune_monitor_every_records_saturation_that_diagnose_reproduces(tmp_path, corpus):
    from ssacli.train.monitor import SaturationMonitor

    config = FinetuneConfig(
        data=corpus, steps=4, batch_size=2, seq_len=16, checkpoint_every=4, monitor_every=2
    )
    trained = finetune("builtin:wikitext-softmax", config, tmp_path / "out")
    monitor = training_record(tmp_path / "out")["monitor"]
    assert [m["step"] for m in monitor] == [0, 2, 4]
    # the last measurement is the saved model's: measuring the folder again gives the same numbers
    again = SaturationMonitor(2).measure(
        load_model(str(trained.path), dtype="float32").model, trained.tokenizer
    )
    key = next(k for k in again if k.startswith("ssacli/layer") and "max_weight" in k)
    assert monitor[-1][key] == pytest.approx(again[key], rel=1e-6, abs=1e-6)


def test_report_draws_the_saturation_measured_during_fine_tuning(tmp_path, corpus):
    from rich.console import Console

    from ssacli.quality.compare import compare_models
    from ssacli.report.before_after import render_report, report_html
    from ssacli.report.monitor import monitor_columns

    config = FinetuneConfig(
        data=corpus, steps=2, batch_size=2, seq_len=16, checkpoint_every=2, monitor_every=1
    )
    finetune("builtin:wikitext-softmax", config, tmp_path / "out")
    history = training_record(tmp_path / "out")["monitor"]
    report = compare_models("builtin:wikitext-softmax", str(tmp_path / "out"), probes=["key-scale:1"],
                            samples=1, builtin=False)  # fmt: skip
    assert report.conversion["after"]["monitor"] == history
    header, rows = monitor_columns(history)
    assert [r[0] for r in rows] == ["0", "1", "2"]
    column = header.index("maxw\nkey-scale:8")  # the monitor's default levels: key-scale 1 and 8
    for row, entry in zip(rows, history):
        assert row[column] == f"{entry['ssacli/model/max_weight@key-scale:8']:.3f}"  # the logged value
    console = Console(record=True, width=80)
    render_report(report.to_dict(), console)
    assert "saturation during fine-tuning" in console.export_text()
    assert 'alt="saturation during fine-tuning"' in report_html(report.to_dict())
