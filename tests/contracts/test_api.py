"""The CLI does nothing the Python API cannot: every command's work is one public call, and the call
with the command's settings writes what the command writes (on tiny budgets, same thread count, so
bit for bit). Where the API fills settings in (recorded runs, ssacli.toml), the values are checked
against what was recorded or written by hand."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.icl.sweep import run_name
from ssacli.models.checkpoint import ICL_FORMAT, read_meta, training_record

TIMES = ("seconds", "tokens_per_s", "elapsed_s", "wall_seconds", "train_seconds", "eval_seconds")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """CPU reductions depend on the thread count: both sides of a comparison run with one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cli(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def timeless(value):
    """``value`` without wall-clock measurements, the only part two identical runs may differ in."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = "the a cat dog sees finds small red tree house".split()
    lines = [" ".join(rng.choice(words) for _ in range(12)).capitalize() + "." for _ in range(300)]
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("\n\n".join(lines))
    return path


# ---- train, finetune, convert --finetune ---------------------------------------------------------------

LOOP = dict(steps=3, lr=3e-3, batch_size=2, weight_decay=0.1, checkpoint_every=2)


@pytest.fixture(scope="module")
def scratch(corpus, tmp_path_factory) -> dict[str, Path]:
    """`ssacli train` and train_from_scratch with the same settings."""
    root = tmp_path_factory.mktemp("scratch")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in LOOP.items()]
    cli("train", "--data", corpus, "--out", root / "cli", "--arch", "gpt2", "--scorer", "ssa",
        "--seq-len", "32", "--device", "cpu", "--quiet", *flags)  # fmt: skip
    built = []
    ssacli.train_from_scratch(
        corpus, root / "api", arch="gpt2", scorer="ssa", seq_len=32, device="cpu", on_built=built.append,
        **LOOP,
    )  # fmt: skip
    assert len(built) == 1 and built[0].max_positions == 32
    return {"cli": root / "cli", "api": root / "api"}


def test_train_from_scratch_writes_what_ssacli_train_writes(scratch):
    cli_meta, api_meta = read_meta(scratch["cli"]), read_meta(scratch["api"])
    assert timeless(api_meta) == timeless(cli_meta)
    assert same_weights(scratch["cli"], scratch["api"])
    training = api_meta["training"]
    assert training["step"] == 3 and [h[0] for h in training["heldout"]] == [0, 2, 3]
    assert training["config"]["lr"] == 3e-3 and training["config"]["seq_len"] == 32
    assert api_meta["scratch"]["arch"] == "gpt2" and api_meta["scorer"] == "ssa"


def test_finetune_in_place_extends_the_recorded_run_as_ssacli_finetune_does(scratch, corpus, tmp_path):
    for side in ("cli", "api"):
        shutil.copytree(scratch["api"], tmp_path / side)
    cli("finetune", tmp_path / "cli", "--resume", "--steps", "5", "--quiet")  # the run in DIR itself
    config = ssacli.finetune_config(str(tmp_path / "api"), resume=True, steps=5)
    recorded = training_record(scratch["api"])["config"]
    assert asdict(config) == {**recorded, "steps": 5}  # everything else from the recorded run
    assert config.data == str(corpus) and config.lr == 3e-3
    trained = ssacli.finetune(str(tmp_path / "api"), config, resume=True)  # out=None: in DIR
    assert trained.path == tmp_path / "api"
    assert timeless(read_meta(tmp_path / "api")) == timeless(read_meta(tmp_path / "cli"))
    assert same_weights(tmp_path / "cli", tmp_path / "api")
    assert training_record(tmp_path / "api")["step"] == 5


def test_finetune_refuses_what_it_cannot_train_in_place():
    with pytest.raises(ssacli.SsacliError, match="not a folder to train in place"):
        ssacli.finetune_config("builtin:every-softmax", steps=5)
    with pytest.raises(ssacli.SsacliError, match="--data is required"):
        ssacli.finetune_config(steps=5)  # nothing recorded to take it from
    with pytest.raises(TypeError, match="stepz"):
        ssacli.finetune_config(data="icl:every", stepz=5)


def test_convert_and_finetune_writes_what_convert_finetune_writes(tmp_path):
    settings = dict(data="icl:every", steps=2, batch_size=2, checkpoint_every=1)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    output = cli("convert", "builtin:every-softmax", "--scorer", "ssa", "--out", tmp_path / "cli",
                 "--finetune", "--device", "cpu", "--quiet", *flags)  # fmt: skip
    seen = []
    config = ssacli.finetune_config(**settings)
    trained, report = ssacli.convert_and_finetune(
        "builtin:every-softmax", "ssa", tmp_path / "api", config, device="cpu", on_converted=seen.append
    )
    assert seen == [report] and report["from"] == "softmax" and report["to"] == "ssa"
    assert f"fidelity softmax → ssa: KL {report['kl_per_token']:.3g}" in output
    assert trained.path == tmp_path / "api" and training_record(trained.path)["step"] == 2
    assert timeless(read_meta(tmp_path / "api")) == timeless(read_meta(tmp_path / "cli"))
    assert same_weights(tmp_path / "cli", tmp_path / "api")


# ---- check ----------------------------------------------------------------------------------------------

REQUIRES = ["entropy@embed-scale:32 >= 0.5", "collapse_rate@outlier:100 max <= 0.2"]


def test_check_settings_merge_the_config_as_ssacli_check_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gate = '[check]\nmodel = "builtin:every-softmax"\nsamples = 2\nseed = 3\n'
    Path("gate.toml").write_text(gate + f"requires = {json.dumps(REQUIRES)}\n")
    result = CliRunner().invoke(app, ["check", "--config", "gate.toml", "--json", "c.json", "--quiet"])
    assert result.exit_code in (0, 1), result.output
    settings = ssacli.check_settings(config="gate.toml")
    assert (settings.model, settings.options) == ("builtin:every-softmax", {"samples": 2, "seed": 3})
    assert [r.text for r in settings.requires] == REQUIRES
    report = settings.run()
    assert timeless(report.to_dict()) == timeless(json.loads(Path("c.json").read_text()))
    assert result.exit_code == (0 if report.passed else 1)
    flags = ssacli.check_settings("other", config="gate.toml", samples=1, requires=REQUIRES[:1])
    assert (flags.model, flags.options, len(flags.requires)) == ("other", {"samples": 1, "seed": 3}, 1)


def test_write_check_config_writes_what_check_init_writes(tmp_path):
    cli("check", "--init", "--config", tmp_path / "cli.toml")
    kind = ssacli.write_check_config(path=tmp_path / "api.toml")
    assert kind == "icl"
    assert (tmp_path / "api.toml").read_text() == (tmp_path / "cli.toml").read_text()
    with pytest.raises(ssacli.SsacliError, match="already exists"):
        ssacli.write_check_config(path=tmp_path / "api.toml")


# ---- icl train, eval, sweep ---------------------------------------------------------------------------

TINY_ICL = dict(
    task="linear", scorer="ssa", steps=5, batch_size=4, layers=1, width=8, points_start=3, points_end=5
)


def test_icl_train_and_eval_match_their_commands(tmp_path):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY_ICL.items()]
    cli("icl", "train", "--out", tmp_path / "cli", "--device", "cpu", *flags)
    model = ssacli.train_icl(ssacli.ICLTrainConfig(**TINY_ICL), tmp_path / "api", device="cpu")
    assert timeless(model.spec.training) == timeless(read_meta(tmp_path / "cli", ICL_FORMAT)["training"])
    assert same_weights(tmp_path / "cli", tmp_path / "api")

    cli("icl", "eval", tmp_path / "cli", "--sigma", "1,4", "--length", "5,9", "--outlier", "100@2",
        "--prompts", "16", "--json", tmp_path / "r.json", "--device", "cpu")  # fmt: skip
    result = ssacli.evaluate_icl(
        str(tmp_path / "cli"), sigmas=(1, 4), lengths=(5, 9), outliers=((100, 2),), prompts=16, device="cpu"
    )
    data = json.loads(json.dumps(result.to_dict()))
    assert data == json.loads((tmp_path / "r.json").read_text())
    cells = {(c["sigma"], c["length"], c["outlier"]) for c in data["cells"]}
    assert cells == {(1, 5, None), (1, 9, None), (4, 5, None), (4, 9, None), (1, 5, 100), (1, 9, 100)}


def test_icl_sweep_plan_from_specs_is_the_plan_the_command_runs(tmp_path):
    specs = ["softmax", "ssa:init=paper"]
    args = ["--task", "every", "--scorer", specs[0], "--scorer", specs[1], "--seeds", "1"]
    cli("icl", "sweep", "--out", tmp_path, *args, "--steps", "2", "--prompts", "4", "--device", "cpu")
    plan = ssacli.ICLSweepPlan.from_specs(["every"], specs, seeds=1, steps=2, prompts=4)
    assert [s.label for s in plan.scorers] == ["softmax", "ssa-initpaper"]
    assert json.loads((tmp_path / "results.json").read_text())["plan"] == json.loads(json.dumps(asdict(plan)))
    folders = {p.name for p in (tmp_path / "runs").iterdir()}
    assert folders == {run_name(t, s.label, seed, a) for t, a, s, seed in plan.runs()}
