"""Every default in one place (issue 23): a CLI option's default is read from ssacli/defaults.py or
from the API it calls, never written out; a help text that names a default formats it from there;
and the CLI's defaults are the API's, so a command and its one public call agree when nothing is
given. The first check is scripts/architecture_metrics.py's own measure, run on the package."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
from pathlib import Path

import pytest
import typer.main

import ssacli
from ssacli import defaults
from ssacli.cli import app
from ssacli.cli.options import ICL_OUTLIERS_TEXT, ICL_SIGMAS_TEXT, floats

ROOT = Path(__file__).resolve().parents[2]


def architecture_metrics():
    spec = importlib.util.spec_from_file_location(
        "architecture_metrics", ROOT / "scripts/architecture_metrics.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the CLI, and the modules whose settings fields its options are built from (issue 53)
OPTION_MODULES = sorted(
    {*(ROOT / "ssacli" / "cli").glob("*.py")}
    | {p for p in (ROOT / "ssacli").rglob("*.py") if "setting(" in p.read_text() and p.name != "setting.py"}
)


@pytest.mark.parametrize("path", OPTION_MODULES, ids=lambda p: p.relative_to(ROOT / "ssacli").as_posix())
def test_no_cli_option_writes_out_a_default_or_restates_one_in_its_help(path):
    metrics, tree = architecture_metrics(), ast.parse(path.read_text())
    assert metrics._literal_defaults(tree) == [], "options whose default is a literal (lines)"
    assert metrics._restated_defaults(tree) == [], "help texts that restate a default (lines)"


def test_the_measure_sees_what_it_counts():
    metrics = architecture_metrics()
    code = (
        "def command(steps: int = typer.Option(4000, help='Steps (default 4000).'),\n"
        "            device: Device = 'auto', lr: float = typer.Option(None, help=f'LR ({X:g}).')): ...\n"
        "HELP = ('Warmup (default 5% of --steps'\n        ', at most 100).')\n"
    )
    tree = ast.parse(code)
    assert sorted(metrics._literal_defaults(tree)) == [1, 2]
    assert sorted(metrics._restated_defaults(tree)) == [1, 3]
    fields = (
        "class S:\n    steps: int = setting(4000, 'Steps (default 4000).')\n"
        "    seed: int = setting(SEED, 'Seed.')\n"
    )
    assert metrics._literal_defaults(ast.parse(fields)) == [2]
    assert metrics._restated_defaults(ast.parse(fields)) == [2]


def command(*names: str):
    group = typer.main.get_command(app)
    for name in names:
        group = group.commands[name]
    return {p.name: p.default for p in group.params}


def signature(function) -> dict:
    return {n: p.default for n, p in inspect.signature(function).parameters.items()}


def field_defaults(*classes) -> dict:
    """The defaults of settings values' fields: a keyword wrapper's, where it takes them as **settings."""
    return {f.name: f.default for cls in reversed(classes) for f in dataclasses.fields(cls)}


def test_the_cli_defaults_are_the_apis():
    from ssacli.icl.sweep import ScorerEntry, SweepPlan
    from ssacli.icl.train import TrainConfig
    from ssacli.train.finetune import FinetuneConfig

    cases = [
        (command("diagnose"), field_defaults(ssacli.DiagnoseSettings, ssacli.LoadOptions),
         ("samples", "batch_size", "seed", "tau", "top_k", "block_size", "stats", "device", "dtype")),
        (command("report"), field_defaults(ssacli.ReportSettings, ssacli.LoadOptions),
         ("seed", "samples", "seq_len", "max_tokens", "batch_size", "icl_length", "prompts", "device",
          "dtype")),
        (command("icl", "train"), vars(TrainConfig),
         ("scorer", "steps", "batch_size", "lr", "scorer_lr", "seed", "preset", "arch", "points_start",
          "points_end", "checkpoint_every", "attention")),
        (command("icl", "sweep"), vars(SweepPlan), ("steps", "lr", "prompts")),
        (command("train"), vars(FinetuneConfig),
         ("steps", "scorer_lr", "grad_accum", "checkpoint_every", "attention")),
        (command("train"), field_defaults(ssacli.ScratchSettings, FinetuneConfig), ("scorer", "seed")),
        (command("train"), signature(ssacli.train_from_scratch), ("device",)),
        (command("convert"), field_defaults(ssacli.ConvertSettings, ssacli.LoadOptions), ("device", "dtype")),
        (command("icl", "eval"), signature(ssacli.evaluate_icl), ("prompts", "seed", "coef_sigma", "device")),
    ]  # fmt: skip
    for cli, api, names in cases:
        for name in names:
            assert cli[name] == api[name], name
    assert command("icl", "sweep")["seeds"] == ScorerEntry.seeds
    report = command("report")
    assert report["pairs_limit"] == ssacli.ReportSettings().pairs_limit
    assert floats(report["sigmas"], "sigma") == ssacli.ReportSettings().sigmas == defaults.ICL_SIGMAS
    assert report["outliers"] == ICL_OUTLIERS_TEXT and command("icl", "eval")["sigma"] == ICL_SIGMAS_TEXT


def test_a_help_text_names_the_default_the_api_takes():
    from ssacli.train.finetune import FinetuneConfig

    group = typer.main.get_command(app)
    helps = {p.name: p.help for p in group.commands["finetune"].params}
    config = FinetuneConfig(data="icl:every")
    assert f"(default {config.lr:g})" in helps["lr"] and f"(default {config.steps})" in helps["steps"]
    assert f"(default {config.batch_size})" in helps["batch_size"]
    assert f"(default {config.seq_len})" in helps["seq_len"]
    share = 100 * FinetuneConfig(data="x", steps=1000).warmup_steps() / 1000  # the warmup rule's share
    most = FinetuneConfig(data="x", steps=10**6).warmup_steps()  # and its cap
    assert f"(default {share:g}% of --steps, at most {most})" in helps["warmup"]
    checks = {p.name: p.help for p in group.commands["check"].params}
    assert (
        f"(default {defaults.TAU:g})" in checks["tau"]
        and f"(default {defaults.SAMPLES})" in checks["samples"]
    )
