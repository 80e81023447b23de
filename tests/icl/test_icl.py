"""ICL tasks, model, training, evaluation and the bundled checkpoints."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from ssacli.errors import InputError, InterruptedJobError, JobFailedError, UsageError
from ssacli.icl.evaluate import evaluate, parse_outlier
from ssacli.icl.sweep import ScorerEntry, SweepPlan, aggregate, run_sweep
from ssacli.icl.train import TrainConfig, train
from ssacli.models.icl import ICLModel, ICLSpec, load_icl
from ssacli.models.icl_task import every_labels, sample_batch, some_labels
from ssacli.models.loading import builtin_names, resolve_model_path
from ssacli.report.plots import plot_sweep


def t(*values):
    return torch.tensor([list(values)], dtype=torch.float32)


# ---- labels on hand-built sequences --------------------------------------------------------------


def test_every_labels_by_hand():
    assert every_labels(t(0.5, 2.0, -1.0, 3.0)).tolist() == [[1, 1, -1, -1]]
    assert every_labels(t(-0.1, 2.0, 3.0)).tolist() == [[-1, -1, -1]]
    assert every_labels(t(0.0, 1.0)).tolist() == [[-1, -1]]  # a tie at 0 is not > 0
    assert every_labels(t(1.0, 0.0, 1.0)).tolist() == [[1, -1, -1]]


def test_some_labels_by_hand():
    assert some_labels(t(-0.5, -2.0, 1.0, -3.0)).tolist() == [[-1, -1, 1, 1]]
    assert some_labels(t(0.0, 0.0)).tolist() == [[-1, -1]]  # 0 is not > 0
    assert some_labels(t(0.0, 1e-6)).tolist() == [[-1, 1]]


def test_linear_labels_follow_one_function_per_prompt():
    batch = sample_batch("linear", 8, 20, generator=torch.Generator().manual_seed(0))
    # y = a·x + b with one (a, b) per prompt: two points determine it, the rest must agree
    x, y = batch.xs, batch.ys
    a = (y[:, 1] - y[:, 0]) / (x[:, 1] - x[:, 0])
    b = y[:, 0] - a * x[:, 0]
    torch.testing.assert_close(y, a[:, None] * x + b[:, None], rtol=1e-4, atol=1e-4)


def test_tokens_interleave_x_and_y():
    batch = sample_batch("every", 2, 3, generator=torch.Generator().manual_seed(0))
    assert batch.tokens.shape == (2, 6)
    assert torch.equal(batch.tokens[:, 0::2], batch.xs) and torch.equal(batch.tokens[:, 1::2], batch.ys)


# ---- samplers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [1.0, 8.0])
def test_sampler_honours_sigma_and_length(sigma):
    batch = sample_batch("some", 4000, 13, sigma=sigma, generator=torch.Generator().manual_seed(1))
    assert batch.xs.shape == (4000, 13)
    assert abs(batch.xs.std().item() / sigma - 1) < 0.02
    assert abs(batch.xs.mean().item()) < 0.02 * sigma


def test_sampler_honours_coefficient_sigma():
    batch = sample_batch("linear", 4000, 2, coef_sigma=3.0, generator=torch.Generator().manual_seed(2))
    a = (batch.ys[:, 1] - batch.ys[:, 0]) / (batch.xs[:, 1] - batch.xs[:, 0])
    assert abs(a.std().item() / 3.0 - 1) < 0.05


def test_sampler_plants_the_outlier_and_labels_see_it():
    batch = sample_batch(
        "every", 64, 10, outlier=-1000.0, outlier_position=3, generator=torch.Generator().manual_seed(3)
    )
    assert torch.all(batch.xs[:, 2] == -1000.0)
    assert torch.all(batch.xs[:, [0, 1, 3]] != -1000.0)
    assert torch.all(batch.ys[:, 2:] == -1)  # a negative value at position 3 makes "every" false


def test_sampler_rejects_bad_outlier_positions():
    with pytest.raises(UsageError):
        sample_batch("every", 2, 5, outlier=1.0, outlier_position=6)
    with pytest.raises(UsageError):
        sample_batch("nope", 2, 5)


def test_parse_outlier():
    assert parse_outlier("1000@3") == (1000.0, 3)
    assert parse_outlier("-10") == (-10.0, 3)
    with pytest.raises(ValueError):
        parse_outlier("big@3")


# ---- model and training ------------------------------------------------------------------------


def test_model_predicts_at_x_positions_causally():
    model = ICLModel(ICLSpec(task="every", scorer="ssa", layers=2, heads=2, width=16)).eval()
    batch = sample_batch("every", 2, 6, generator=torch.Generator().manual_seed(0))
    tokens = batch.tokens.clone()
    with torch.no_grad():
        before = model(tokens)
        tokens[:, 7] = 123.0  # y_4: may only affect predictions at x_5, x_6
        after = model(tokens)
    assert before.shape == (2, 6)
    torch.testing.assert_close(before[:, :4], after[:, :4])
    assert not torch.allclose(before[:, 4:], after[:, 4:])


def test_short_training_lowers_the_loss_and_saves_a_loadable_checkpoint(tmp_path):
    # ~3 s on 2 idle cores (the ≤ 60 s budget of the issue); not asserted: timing is not a test.
    config = TrainConfig(
        task="every",
        scorer="ssa",
        steps=150,
        lr=3e-3,
        batch_size=32,
        layers=2,
        width=16,
        points_start=5,
        points_end=11,
        log_every=10,
        checkpoint_every=50,
    )
    model = train(config, tmp_path / "run", device="cpu")
    history = model.spec.training["history"]
    first = sum(h[1] for h in history[:3]) / 3
    last = sum(h[1] for h in history[-3:]) / 3
    assert last < 0.7 * first, history
    reloaded = load_icl(tmp_path / "run")
    batch = sample_batch("every", 4, 11, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(batch.tokens), model(batch.tokens))
    b_trained = reloaded.backbone.h[0].attn.ssacli_scorer.b
    assert not torch.allclose(b_trained, torch.full_like(b_trained, 0.8))  # SSA's b was trained


def test_training_is_deterministic_and_resume_is_exact(tmp_path):
    base = dict(
        task="linear",
        scorer="ssa",
        batch_size=8,
        layers=1,
        heads=2,
        width=8,
        points_start=3,
        points_end=7,
        points_every=5,
        log_every=1,
    )
    full = train(TrainConfig(steps=20, checkpoint_every=100, **base), tmp_path / "full", device="cpu")
    again = train(TrainConfig(steps=20, checkpoint_every=100, **base), tmp_path / "again", device="cpu")
    train(TrainConfig(steps=10, checkpoint_every=100, **base), tmp_path / "split", device="cpu")
    resumed = train(
        TrainConfig(steps=20, checkpoint_every=100, **base), tmp_path / "split", resume=True, device="cpu"
    )
    # stop_at: the 20-step run stopped after step 7 (its checkpoint written), then resumed
    stopped = train(TrainConfig(steps=20, checkpoint_every=100, **base), tmp_path / "stop", device="cpu",
                    stop_at=7)  # fmt: skip
    assert stopped.spec.training["step"] == 7
    continued = train(
        TrainConfig(steps=20, checkpoint_every=100, **base), tmp_path / "stop", resume=True, device="cpu"
    )
    for a, b in [(full, again), (full, resumed), (full, continued)]:
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(p, q), name
    assert [h[1] for h in resumed.spec.training["history"]] == [h[1] for h in full.spec.training["history"]]


TINY = dict(task="linear", scorer="ssa", batch_size=8, layers=1, heads=2, width=8, points_start=3,
            points_end=7, points_every=5, log_every=1, checkpoint_every=100)  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_checkpoints_the_step_and_resuming_finishes_like_the_uninterrupted_run(tmp_path, sig):
    full = train(TrainConfig(steps=12, **TINY), tmp_path / "full", device="cpu")

    def interrupt(step, loss, points):
        if step == 5:
            os.kill(os.getpid(), sig)

    def unhandled(signum, frame):  # what reaches the test's own handler was not caught by the run
        raise AssertionError(f"signal {signum} was not turned into a checkpoint")

    previous = signal.signal(sig, unhandled)
    try:
        with pytest.raises(InterruptedJobError, match="interrupted at step 5; .*--resume") as err:
            train(TrainConfig(steps=12, **TINY), tmp_path / "run", device="cpu", on_step=interrupt)
        assert signal.getsignal(sig) is unhandled  # the run's handlers are gone
    finally:
        signal.signal(sig, previous)
    assert err.value.exit_code == 130
    assert load_icl(tmp_path / "run").spec.training["step"] == 5  # only the interruption wrote one
    resumed = train(TrainConfig(steps=12, **TINY), tmp_path / "run", resume=True, device="cpu")
    for (name, p), q in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    assert resumed.spec.training["history"] == full.spec.training["history"]


def test_an_interrupted_run_says_how_its_caller_resumes(tmp_path):
    """A sweep resumes by running again (it has no --resume flag): its runs' message says so."""

    def interrupt(step, loss, points):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    advice = "the same sweep again (finished runs are skipped; this one resumes from its checkpoint)"
    with pytest.raises(InterruptedJobError, match=r"interrupted at step 2; .*the same sweep again") as err:
        train(
            TrainConfig(steps=6, **TINY),
            tmp_path / "run",
            device="cpu",
            on_step=interrupt,
            resume_advice=advice,
        )
    assert "--resume" not in str(err.value)


def test_a_nan_loss_stops_before_the_update_and_keeps_the_last_checkpoint(tmp_path):
    poisoned = {}

    def poison(module, inputs, output):  # from the 4th step on (on_step counts the steps done)
        poisoned["module"] = module
        return output * float("nan") if poisoned.setdefault("calls", 0) >= 3 else output

    def count(step, loss, points):
        poisoned["calls"] = step

    real = ICLModel.__init__

    def hooked(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.read_out.register_forward_hook(poison)

    config = TrainConfig(steps=10, **{**TINY, "checkpoint_every": 2})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ICLModel, "__init__", hooked)
        with pytest.raises(JobFailedError, match="loss became nan at step 4; lower --lr") as err:
            train(config, tmp_path / "run", device="cpu", on_step=count)
    assert err.value.exit_code == 5
    assert all(torch.isfinite(p).all() for p in poisoned["module"].parameters())  # no NaN update
    assert load_icl(tmp_path / "run").spec.training["step"] == 2


def test_existing_checkpoint_is_not_overwritten_by_accident(tmp_path):
    base = dict(task="every", batch_size=4, layers=1, heads=1, width=8, points_start=3, points_end=5)
    train(TrainConfig(steps=2, **base), tmp_path / "r", device="cpu")
    with pytest.raises(UsageError, match="--resume"):
        train(TrainConfig(steps=2, **base), tmp_path / "r", device="cpu")
    train(TrainConfig(steps=3, **base), tmp_path / "r", overwrite=True, device="cpu")
    assert load_icl(tmp_path / "r").spec.training["step"] == 3


def test_resume_refuses_a_different_run(tmp_path):
    base = dict(task="every", batch_size=4, layers=1, heads=1, width=8, points_start=3, points_end=5)
    train(TrainConfig(steps=2, **base), tmp_path / "r", device="cpu")
    with pytest.raises(UsageError):
        train(TrainConfig(steps=4, scorer="ssa", **base), tmp_path / "r", resume=True, device="cpu")


def test_load_rejects_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(InputError):
        load_icl(tmp_path)
    (tmp_path / "ssacli.json").write_text("{not json")
    with pytest.raises(InputError):
        load_icl(tmp_path)


# ---- evaluation ----------------------------------------------------------------------------------


class Oracle(torch.nn.Module):
    """Answers `every` perfectly from the tokens: an independent check of the error metric."""

    def __init__(self, flip_at: int | None = None):
        super().__init__()
        self.spec = ICLSpec(task="every")
        self.flip_at = flip_at
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        pred = every_labels(tokens[:, 0::2])
        if self.flip_at is not None:
            pred[:, self.flip_at - 1] *= -1
        return pred


def test_eval_metric_against_an_oracle():
    perfect = evaluate(Oracle(), sigmas=(1.0, 4.0), lengths=(9,), prompts=50)
    assert all(c.error == 0 for c in perfect)
    wrong_late = evaluate(Oracle(flip_at=5), lengths=(9,), prompts=50)[0]
    assert (
        wrong_late.error == 1.0 and wrong_late.per_position[4] == 1.0 and sum(wrong_late.per_position) == 1.0
    )
    wrong_early = evaluate(Oracle(flip_at=2), lengths=(9,), prompts=50)[0]
    assert wrong_early.error == 0.0  # positions 1 and 2 are not scored


# ---- bundled checkpoints -------------------------------------------------------------------------


def test_every_bundled_checkpoint_is_listed_with_its_recipe():
    names = builtin_names()
    assert {"every-softmax", "every-ssa"} <= set(names)
    for name in names:
        folder = resolve_model_path(f"builtin:{name}")
        meta = json.loads((folder / "ssacli.json").read_text())
        assert meta["training"]["config"]["steps"] == meta["training"]["step"]
        assert (folder / "RECIPE.md").is_file()
        assert not (folder / "trainer.safetensors").exists()


@pytest.mark.parametrize("name", ["every-softmax", "every-ssa"])
def test_bundled_every_models_are_accurate_in_distribution(name):
    model = load_icl(resolve_model_path(f"builtin:{name}"))
    trained_length = model.spec.training["config"]["points_end"]
    cell = evaluate(model, sigmas=(1.0,), lengths=(trained_length,), prompts=500, seed=123)[0]
    assert cell.error < 0.05, f"builtin:{name}: {cell.error:.3f} of prompts have an error"


def test_unknown_builtin_lists_the_available_ones():
    with pytest.raises(UsageError, match="builtin:every-softmax"):
        resolve_model_path("builtin:nope")


# ---- sweep ---------------------------------------------------------------------------------------


def test_tiny_sweep_writes_results_and_figures(tmp_path):
    plan = SweepPlan(
        tasks=["every"],
        scorers=[ScorerEntry("softmax", "softmax", seeds=2)],
        steps=3,
        batch_size=4,
        points_start=3,
        points_end=5,
        sigmas=[1, 4],
        lengths=[5, 7],
        outliers=[100],
        prompts=8,
    )
    summary = run_sweep(plan, tmp_path)
    assert len(summary["runs"]) == 2
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["aggregate"] == summary["aggregate"]
    cells = {(r["sigma"], r["length"], r["outlier"]) for r in summary["aggregate"]}
    assert cells == {(1, 5, None), (4, 5, None), (1, 7, None), (1, 5, 100)}
    assert all(r["seeds"] == 2 for r in summary["aggregate"])
    plot_sweep(summary, tmp_path / "figures")  # the report layer draws what `icl sweep` writes
    for view in ("sigma", "length", "outlier"):
        assert (tmp_path / "figures" / f"every-{view}.png").stat().st_size > 1000
    # a second call finds the finished runs and does not train again
    again = run_sweep(plan, tmp_path)
    assert [r["final_loss"] for r in again["runs"]] == [r["final_loss"] for r in summary["runs"]]


def test_aggregate_mean_and_std_by_hand():
    runs = [
        {
            "task": "every",
            "label": "x",
            "seed": seed,
            "cells": [{"sigma": 1, "length": 5, "outlier": None, "error": e, "normalized_error": None}],
        }
        for seed, e in enumerate((0.1, 0.3))
    ]
    (row,) = aggregate(runs)
    assert row["mean"] == pytest.approx(0.2) and row["std"] == pytest.approx(0.1414213, rel=1e-5)


def test_outlier_capture_on_uniform_attention_by_hand():
    """With zero query/key projections every causal row is uniform: the token at index k gets
    1/(q+1) from query q, so the capture is the mean of 1/(q+1) over the later queries."""
    from ssacli.icl.evaluate import outlier_capture

    model = ICLModel(ICLSpec(task="every", layers=2, heads=2, width=8))
    width = model.spec.width
    with torch.no_grad():
        for block in model.backbone.h:
            block.attn.c_attn.weight[:, : 2 * width] = 0  # query and key columns
            block.attn.c_attn.bias[: 2 * width] = 0
    points, position = 6, 3
    key = 2 * (position - 1)
    expected = sum(1 / (q + 1) for q in range(key + 1, 2 * points)) / (2 * points - key - 1)
    rows = outlier_capture(model, 1000.0, position=position, points=points, prompts=4)
    assert len(rows) == 2
    for row in rows:
        assert row["mean_over_heads"] == pytest.approx(expected, rel=1e-5)
        assert row["max_head"] == pytest.approx(expected, rel=1e-5)
