"""Settings declared once (issue 53): every command's options are built from the fields of settings
values (ssacli/cli/declared.py), each option with its field's default and help unless the command
says otherwise; the CLI's own mirrors of settings the stages keep are checked against them; and no
command function is over 40 lines."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.cli.declared import Given, command, options
from ssacli.setting import CLI, HELP, option_fields, setting, settings_from

LONGEST = 40  # lines of a command function, decorator and docstring included


def commands() -> dict[str, object]:
    """Every registered command's callback, by its command line (``icl train``, …)."""
    found = {}

    def walk(typer_app, prefix: str) -> None:
        for registered in typer_app.registered_commands:
            found[prefix + registered.name] = registered.callback
        for group in typer_app.registered_groups:
            walk(group.typer_instance, f"{prefix}{group.name} ")

    walk(app, "")
    return found


def click_command(line: str):
    command = typer.main.get_command(app)
    for word in line.split():
        command = command.commands[word]
    return command


def test_no_command_function_is_over_40_lines():
    lengths = {name: len(inspect.getsourcelines(callback)[0]) for name, callback in commands().items()}
    longest = max(lengths, key=lengths.get)
    assert lengths[longest] <= LONGEST, f"{longest}: {lengths[longest]} lines"
    assert len(lengths) == 12  # every command measured, the icl group's among them


@pytest.mark.parametrize("line", sorted(set(commands()) - {"scorers"}))
def test_every_option_is_one_settings_field_with_its_default_and_help(line):
    callback = commands()[line]
    own = set(inspect.signature(callback.__wrapped__).parameters) - {"given"}
    params = {p.name: p for p in click_command(line).params if p.name != "help"}
    from_fields = {}
    for source in callback.options:
        declared = {f.name: f for f in option_fields(source.cls)}
        for name in source.names:
            assert name not in from_fields, f"{name}: two options"
            from_fields[name] = (declared[name], source.changes.get(name, {}))
    assert set(params) == own | set(from_fields)  # no option without a field, no field without one
    for name, (field, change) in from_fields.items():
        param = params[name]
        spelled = {**field.metadata[CLI], **change}
        default = spelled.get("default", field.default)
        shown = list(default) if isinstance(default, tuple) and param.multiple else default
        assert param.default == (None if default is dataclasses.MISSING else shown), name
        assert param.required == (default is dataclasses.MISSING), name
        assert param.help == change.get("help", field.metadata[HELP]), name
        assert param.hidden == spelled.get("hidden", False), name


def test_every_option_field_of_the_apis_settings_is_an_option_somewhere():
    offered = {
        (s.cls, n)
        for callback in commands().values()
        for s in getattr(callback, "options", ())
        for n in s.names
    }
    for cls in (ssacli.DiagnoseSettings, ssacli.LoadOptions, ssacli.ConvertSettings, ssacli.ReportSettings,
                ssacli.LMEvalPlan, ssacli.AttributionSettings, ssacli.ScratchSettings):  # fmt: skip
        for field in option_fields(cls):
            assert (cls, field.name) in offered, f"{cls.__name__}.{field.name}"


def test_the_clis_mirrors_name_the_fields_of_the_settings_they_fill():
    from ssacli.cli.icl import ICLTrainOptions
    from ssacli.cli.options import FinetuneOptions
    from ssacli.cli.recipe import RecipeOptions
    from ssacli.cli.train import TrainRun

    def names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert names(FinetuneOptions) <= names(ssacli.FinetuneConfig)
    assert names(RecipeOptions) - {"stages", "control"} <= names(ssacli.RecipeConfig)
    assert set(TrainRun(data="d", out=Path("o")).loop()) <= names(ssacli.FinetuneConfig)
    icl = ICLTrainOptions(task="every", out=Path("o")).config()
    assert ssacli.ICLTrainConfig(**icl) == ssacli.ICLTrainConfig(task="every")  # every default the config's


def test_a_keyword_wrapper_sends_each_keyword_to_its_value_and_refuses_others():
    settings, load = settings_from(
        "f", {"samples": 3, "device": "cpu"}, ssacli.DiagnoseSettings, ssacli.LoadOptions
    )
    assert (settings.samples, load.device) == (3, "cpu")
    assert settings == ssacli.DiagnoseSettings(samples=3) and load == ssacli.LoadOptions(device="cpu")
    with pytest.raises(TypeError, match=r"^f\(\) got an unexpected keyword argument 'sample'$"):
        settings_from("f", {"sample": 3}, ssacli.DiagnoseSettings, ssacli.LoadOptions)


def test_a_declared_command_runs_with_its_fields_values(monkeypatch):
    """A toy command: its options are its fields', in order, with the command's changes; an option
    left at its default text gives the field's own default; given.of builds the value."""

    @dataclasses.dataclass(frozen=True)
    class Toy:
        count: int = setting(2, "How many.", min=1)
        names: tuple[str, ...] = setting(("a", "b"), "Names, comma-separated.", type=str, default_text="a,b")
        loud: bool = setting(False, "Shout.", flags=("--loud", "-l"))
        hidden: int = 7  # API-only: no option

    seen = []

    @command(options(Toy, "loud", "count"), options(Toy, "names", names={"help": "Other help."}))
    def toy(word: str, *, given: Given) -> None:
        seen.append((word, given.of(Toy), given.of(Toy, names=tuple(given.names.split(",")))))

    with pytest.raises(TypeError, match="more than one option named"):
        command(Toy, Toy)(toy.__wrapped__)
    toy_app = typer.Typer()
    toy_app.command()(toy)
    toy_app.command("other")(lambda: None)
    click = typer.main.get_command(toy_app).commands["toy"]
    assert [p.name for p in click.params] == ["word", "loud", "count", "names"]
    assert [p.help for p in click.params[1:]] == ["Shout.", "How many.", "Other help."]
    runner = CliRunner()
    assert runner.invoke(toy_app, ["toy", "w", "-l", "--count", "3"]).exit_code == 0
    assert runner.invoke(toy_app, ["toy", "w", "--names", "x,y"]).exit_code == 0
    assert runner.invoke(toy_app, ["toy", "w", "--count", "0"]).exit_code == 2  # min=1, as Typer checks
    assert seen[0] == ("w", Toy(count=3, loud=True), Toy(count=3, loud=True, names=("a", "b")))
    assert seen[1][1] == Toy(names="x,y") and seen[1][2] == Toy(names=("x", "y"))
