"""The conversion recipe: the softmax original inside a converted model (teacher modes), attention
transfer, distillation through peft's LoRA, and `ssacli convert --scorer ssa --finetune` running it
on the bundled LM at a tiny budget."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

import ssacli
from ssacli.attention.teacher import AttentionTransfer, scoring_as_softmax, transferring
from ssacli.cli import app
from ssacli.errors import UsageError
from ssacli.models.loading import load_model
from ssacli.train.recipe import RecipeConfig, convert_with_recipe
from tests.helpers.cli import run_main
from tests.helpers.plain_transformers import WAYS, plain_loads, refuses_naming_ssacli

MODEL = "builtin:wikitext-softmax"


@pytest.fixture(scope="module")
def ids():
    return torch.randint(3, 1000, (2, 48), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def test_scoring_as_softmax_is_the_original_and_transferring_returns_softmax(ids):
    original = load_model(MODEL, dtype="float32").model
    reference = original(input_ids=ids, use_cache=False).logits
    converted, _ = ssacli.convert(MODEL, "ssa:b=0.3,n=4", dtype="float32")
    ssa = converted.model(input_ids=ids, use_cache=False).logits
    assert (ssa - reference).abs().max() > 1e-2  # SSA at n = 4 is not softmax ...
    with scoring_as_softmax():
        torch.testing.assert_close(converted.model(input_ids=ids, use_cache=False).logits, reference,
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    collector = AttentionTransfer()
    with transferring(collector):  # ... but under teacher forcing every layer hands softmax's output on
        forced = converted.model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(forced, reference, rtol=1e-4, atol=1e-5)
    layers = converted.model.config.num_hidden_layers
    assert len(collector.errors) == layers
    error = collector.loss()
    assert error > 0 and not collector.errors  # loss() resets
    faithful, _ = ssacli.convert(MODEL, "ssa:init=faithful,m=4096", dtype="float32")
    with transferring(AttentionTransfer()) as near:
        faithful.model(input_ids=ids, use_cache=False)
    assert near.loss() < 1e-3 * error  # a faithful scorer is (almost) softmax: (almost) no error


def run(text, out, **settings):
    """A small recipe run on the KL objective alone (lm_weight 0), whose distillation must lower it;
    with the LM loss (the default) the model also learns the text and may move further away."""
    values = dict(data=text, transfer_steps=12, distill_steps=12, eval_every=6, batch_size=4, seq_len=32,
                  lm_weight=0.0)  # fmt: skip
    return convert_with_recipe(MODEL, out, RecipeConfig(**{**values, **settings}), device="cpu")


@pytest.fixture(scope="module")
def learned(text, tmp_path_factory):
    return run(text, tmp_path_factory.mktemp("r") / "learned")


def test_transfer_learns_b_that_beats_the_tied_schedule_and_distill_lowers_the_kl(learned, text, tmp_path):
    _, record = learned
    _, tied = run(text, tmp_path / "tied", b="tied", stages=("transfer",))
    at_end = {r["stage"]: r for r in record["evaluations"] if r["stage"] == "transfer"}
    learned_end = [r for r in record["evaluations"] if r["stage"] == "transfer"][-1]
    tied_end = [r for r in tied["evaluations"] if r["stage"] == "transfer"][-1]
    assert at_end and learned_end["n"] == pytest.approx(tied_end["n"])  # the same n at the end ...
    assert learned_end["transfer_error"] < tied_end["transfer_error"]  # ... the learned b fits softmax better
    assert tied_end["b"] == pytest.approx([1 / n for n in tied_end["n"]], rel=1e-5)
    distill = [r for r in record["evaluations"] if r["stage"] == "distill"]
    assert distill[-1]["kl"] < learned_end["kl"]  # distillation lowers the KL to the original
    final = record["final"]
    assert final["at_target_n"] and final["n_max"] == pytest.approx(4.0, rel=1e-5)
    assert final["met_max_loss"] == (final["loss_change"] <= 0.05)
    assert final["loss_change"] == pytest.approx(math.log(final["ppl_ratio"]), rel=1e-6)


def test_the_written_folder_is_the_merged_model_at_the_target_n(learned, ids):
    trained, record = learned
    reloaded = load_model(str(trained.path), dtype="float32")
    assert not any("lora" in k for k in reloaded.model.state_dict())
    n = [float(s.n.detach().max()) for s in ssacli.scorers_of(reloaded.model).values()]
    assert n == pytest.approx([4.0] * len(n), rel=1e-5)
    assert json.loads((trained.path / "ssacli.json").read_text())["recipe"]["final"] == record["final"]
    with torch.no_grad():  # the saved model computes what the run measured: KL to the original again
        original = load_model(MODEL, dtype="float32").model
        p = original(input_ids=ids, use_cache=False).logits.double().log_softmax(-1)
        q = reloaded.model(input_ids=ids, use_cache=False).logits.double().log_softmax(-1)
    assert 0 < float((p.exp() * (p - q)).sum(-1).mean()) < 1.0
    assert (trained.path / "stages" / "transfer" / "ssacli.json").is_file()


def test_without_transfer_steps_the_recipe_is_distillation_at_the_target_n(text, tmp_path):
    # the default since the trade-off study: no transfer stage, n set to the target at once
    config = RecipeConfig(data=text, distill_steps=3, eval_every=3, batch_size=2, seq_len=32)
    trained, record = convert_with_recipe(MODEL, tmp_path / "d", config, device="cpu")
    assert record["config"]["stages"] == ["distill"]
    stages = {r["stage"] for r in record["evaluations"]}
    assert "transfer" not in stages and "transfer-skipped" in stages  # n set, evaluated, then distilled
    assert not (trained.path / "stages").exists()
    n = [float(s.n.detach().max()) for s in ssacli.scorers_of(trained.model).values()]
    assert n == pytest.approx([record["config"]["target_n"]] * len(n), rel=1e-5)


def test_the_recipes_folders_never_load_as_softmax_in_plain_transformers(learned, ids, tmp_path):
    """The recipe's output (n = 4, distilled) and its transfer snapshot hold a moved scorer: plain
    transformers without ssacli must refuse both (attn_implementation "ssacli"), not run them as
    softmax; ssacli loads them with their scorer, whose logits differ from the same weights under
    softmax."""
    trained, _ = learned
    folders = (trained.path, trained.path / "stages" / "transfer")
    refused = plain_loads(list(folders), tmp_path, register=False)  # a fresh interpreter
    for folder in folders:
        config = json.loads((folder / "config.json").read_text())
        assert (config["ssacli_model_type"], config["attn_implementation"]) == ("llama", "ssacli")
        for way in WAYS[1:]:
            assert refuses_naming_ssacli(way, refused[str(folder)][way]), (way, refused[str(folder)][way])
        loaded = load_model(str(folder), dtype="float32")
        with torch.no_grad():
            ssa = loaded.model(input_ids=ids, use_cache=False).logits
            ssacli.restore(loaded.model)  # what a plain softmax load of these weights would compute
            softmax = loaded.model(input_ids=ids, use_cache=False).logits
        assert (ssa - softmax).abs().max() > 1e-2


def test_the_report_shows_every_stage_and_the_budget(learned):
    from rich.console import Console

    from ssacli.quality.compare import compare_models
    from ssacli.report.before_after import report_html, trajectory_columns

    trained, record = learned
    for after, snapshot in ((trained.path, None), (trained.path / "stages" / "transfer", "transfer")):
        report = compare_models(MODEL, str(after), probes=["key-scale:1,8"], samples=2, builtin=False)
        conversion = report.conversion["after"]
        assert conversion["recipe"]["snapshot"] == snapshot
        header, rows = trajectory_columns(conversion["trajectory"])
        stages = [row[0] for row in rows]
        assert stages[0] == "start" and "transfer" in stages
        assert ("distill" in stages) == (snapshot is None)  # the transfer snapshot ends at transfer
        steps = [int(row[header.index("step")]) for row in rows]
        assert steps == sorted(steps) and "top-1" not in header  # one step axis; no empty column
        console = Console(record=True, width=80)
        from ssacli.report.before_after import render_report

        render_report(report.to_dict(), console)
        text = console.export_text()
        assert "recipe" in text and "…" not in text.split("fine-tuning trajectory")[1].split("verdict")[0]
        # the facts wrap at 80 columns, inside the panel's border
        flowing = " ".join(text.replace("│", " ").split())
        assert ("--max-loss 0.05: met" in flowing) == record["final"]["met_max_loss"] or snapshot is not None
        tokens = record["heldout"]["tokens"]
        assert f"on {tokens:,} tokens" in flowing  # how many held-out tokens the quality was measured on
        assert 'alt="fine-tuning trajectory"' in report_html(report.to_dict())


def test_cli_runs_the_recipe_by_default_for_ssa_on_text(text, tmp_path):
    out = tmp_path / "cli"
    args = ["convert", MODEL, "--scorer", "ssa", "--finetune", "--data", text, "--out", str(out),
            "--transfer-steps", "2", "--distill-steps", "2", "--batch-size", "2", "--seq-len", "16",
            "--device", "cpu", "--quiet"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "n max 4" in result.output and "KL" in result.output
    assert json.loads((out / "ssacli.json").read_text())["recipe"]["config"]["stages"] == [
        "transfer",
        "distill",
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--stages", "transfer,bogus"], "--stages takes"),
        (["--anneal-n", "4"], "--anneal-n applies to one fine-tune"),
        (["--target-n", "0"], "target-n"),
        (["--recipe-b", "sometimes"], "--recipe-b takes learned or tied"),
    ],
)
def test_bad_recipe_options_are_one_line_usage_errors(text, tmp_path, extra, message, monkeypatch, capsys):
    args = ["convert", MODEL, "--scorer", "ssa", "--finetune", "--data", text,
            "--out", str(tmp_path / "o"), *extra]  # fmt: skip
    code, _, err = run_main(args, monkeypatch, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_recipe_options_need_the_recipe(text, tmp_path, monkeypatch, capsys):
    args = ["convert", MODEL, "--scorer", "ssa", "--finetune", "--data", text, "--stages", "lm",
            "--target-n", "3", "--out", str(tmp_path / "o")]  # fmt: skip
    code, _, err = run_main(args, monkeypatch, capsys)
    assert code == 2 and "applies to the conversion recipe" in err


def test_a_bad_config_fails_before_loading():
    with pytest.raises(UsageError, match="--distill-steps"):
        RecipeConfig(data="x", distill_steps=0).validate()
