"""The machine interface (issue 42, item 3): ``--json`` on every command that produces a result,
``-`` as stdout with everything else on stderr, shell completion, ``py.typed`` in the wheel, help
texts that rich markup cannot eat, and diagnose's progress bar without "None".

The references are independent of the code under test: a ``--json -`` document is compared with
the same command's file output, with the folder's own ssacli.json read here, and with the public
API's return value; a help text with what its source says.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest
import typer
from rich.console import Console
from rich.progress import Progress
from rich.text import Text
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.diagnosis.texts import TEXTS
from ssacli.errors import EXIT_USAGE
from tests.helpers.cli import run_main

ROOT = Path(__file__).resolve().parents[2]
MODEL = "builtin:every-softmax"
DIAGNOSE = ["diagnose", MODEL, "--probe", "key-scale:1,8", "--samples", "2"]


def without_time(document: dict) -> dict:
    return {k: v for k, v in document.items() if k != "elapsed_s"}


def test_json_dash_writes_the_document_alone_to_stdout_and_no_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main([*DIAGNOSE, "--json", "-"], monkeypatch, capsys)
    assert code == 0, err
    streamed = json.loads(out)  # all of stdout is one document: the report went elsewhere
    assert streamed["schema"] == "ssacli-diagnose" and streamed["model"] == MODEL
    assert "verdict" in err and "wrote" not in err
    assert list(tmp_path.iterdir()) == []  # no file named "-"
    code, out, err = run_main([*DIAGNOSE, "--json", "r.json", "--quiet"], monkeypatch, capsys)
    assert code == 0 and out == "wrote r.json\n", err
    assert without_time(json.loads(Path("r.json").read_text())) == without_time(streamed)
    # render's outputs take "-" the same way; the reference is the API's own table
    code, out, err = run_main(["render", "r.json", "--csv", "-"], monkeypatch, capsys)
    assert code == 0, err
    assert out == ssacli.DiagnoseResult.load("r.json").to_csv() and "verdict" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ([*DIAGNOSE, "--json", "-", "--html", "-"], "error: --json and --html both ask for stdout ('-')"),
        (["icl", "eval", MODEL, "--plot", "-"], "error: --plot needs a file name: its suffix"),
    ],
    ids=["two outputs to stdout", "a figure to stdout"],
)
def test_what_stdout_cannot_take_is_refused_in_one_line(args, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(args, monkeypatch, capsys)
    assert code == EXIT_USAGE and out == ""
    lines = [text for text in err.splitlines() if text.strip()]
    assert len(lines) == 1 and lines[0].startswith(line), err
    assert list(tmp_path.iterdir()) == []


def folder_record(folder: Path) -> dict:
    return json.loads((folder / "ssacli.json").read_text())


def test_convert_finetune_train_and_icl_train_write_their_record_as_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = "ssa:init=faithful,m=4"
    code, out, err = run_main(
        ["convert", MODEL, "--scorer", spec, "--out", "cv", "--json", "-"], monkeypatch, capsys
    )
    assert code == 0, err
    document = json.loads(out)
    assert document["schema"] == "ssacli-run" and document["command"] == "convert"
    assert document["out"] == str(tmp_path / "cv") and document["record"] == folder_record(tmp_path / "cv")
    assert document["record"]["scorer"] == spec
    # the fidelity is what the API measures on the same conversion (an ICL folder does not keep it)
    _, report = ssacli.convert(MODEL, spec, device="cpu")
    assert document["fidelity"] == json.loads(json.dumps(report))
    assert f"KL {report['kl_per_token']:.3g} nats per prediction" in err  # the lines went to stderr

    code, out, err = run_main(
        ["finetune", "cv", "--data", "icl:every", "--steps", "2", "--out", "ft", "--json", "ft.json"],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(Path("ft.json").read_text())
    assert document["command"] == "finetune" and document["record"] == folder_record(tmp_path / "ft")
    assert "wrote ft.json" in out

    (tmp_path / "corpus.txt").write_text("\n\n".join(TEXTS * 3))
    code, out, err = run_main(
        ["train", "--arch", "gpt2", "--size", "tiny", "--steps", "2", "--seq-len", "32", "--data",
         "corpus.txt", "--out", "lm", "--device", "cpu", "--json", "-"], monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    assert document["record"] == folder_record(tmp_path / "lm")
    assert document["record"]["training"]["step"] == 2 and "wrote lm (step 2" in err

    code, out, err = run_main(
        ["icl", "train", "--task", "linear", "--steps", "3", "--batch-size", "4", "--layers", "1",
         "--width", "8", "--points-start", "3", "--points-end", "5", "--out", "icl", "--json", "-"],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    assert document["command"] == "icl train" and document["record"] == folder_record(tmp_path / "icl")
    assert document["record"]["training"]["step"] == 3


def all_commands() -> list[tuple[str, click.Command]]:
    root = typer.main.get_command(app)
    found = []

    def walk(command: click.Command, name: str) -> None:
        found.append((name, command))
        for sub_name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{name} {sub_name}".strip())

    walk(root, "")
    return found


def test_no_help_text_holds_markup_that_rich_would_eat():
    """Typer renders help as rich markup: an unescaped "[big]" vanished from --device-map's help.
    Every option's help and every command's prose must read the same after markup as written."""
    eaten = []
    for name, command in all_commands():
        texts = [(p.name, p.help) for p in command.params if getattr(p, "help", None)]
        prose = [p for p in (command.help or "").split("\n\n") if not p.startswith(" ")]  # not examples
        for label, text in texts + [("help", p) for p in prose]:
            if Text.from_markup(text).plain != text.replace("\\[", "["):
                eaten.append(f"{name or 'ssacli'} {label}: {text!r}")
    assert not eaten, eaten
    result = CliRunner().invoke(app, ["diagnose", "--help"], env={"COLUMNS": "250"})
    assert 'Needs pip install "ssacli[big]".' in result.output


def test_the_diagnose_bar_shows_no_none_while_loading_and_a_time_left_once_running():
    """While the model loads the total is unknown: the bar read "0/None" and had no ETA. A clock
    of one second per forward pass makes the time left exact: 7 passes to go → 0:00:07."""
    from ssacli.cli.diagnose import diagnose_columns

    now = [0.0]
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    with Progress(*diagnose_columns(), console=console, auto_refresh=False, get_time=lambda: now[0]) as bar:
        task = bar.add_task("loading builtin:every-softmax", total=None)
        bar.refresh()
        loading = buffer.getvalue()
        for done in (1, 2, 3):
            now[0] = float(done)
            bar.update(task, description="key-scale 8", completed=done, total=10)
        bar.refresh()
        running = buffer.getvalue()[len(loading) :]
    assert "loading builtin:every-softmax" in loading and "None" not in loading
    assert "3/10" in running and "0:00:07" in running and "None" not in running


def test_shell_completion_is_offered_and_completes_commands_and_options():
    """What a shell does on TAB: the console script with the completion variable set."""
    script = str(Path(sys.executable).with_name("ssacli"))
    env = {**os.environ, "_SSACLI_COMPLETE": "complete_bash", "COMP_CWORD": "1", "COMP_WORDS": "ssacli diag"}
    done = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["diagnose"], done.stderr
    env |= {"COMP_CWORD": "2", "COMP_WORDS": "ssacli diagnose --device-m"}
    done = subprocess.run([script], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["--device-map"], done.stderr
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"})
    assert "--install-completion" in result.output and "--show-completion" in result.output


def test_the_wheel_carries_py_typed(tmp_path):
    """PEP 561: without ssacli/py.typed in the installed package, mypy and pyright treat the typed
    API as untyped. Built from a copy of the sources, so the checkout gets no build/ folder."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    shutil.copytree(ROOT / "ssacli", source / "ssacli", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source),
         "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300, cwd=source,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("ssacli-*.whl")
    assert "ssacli/py.typed" in zipfile.ZipFile(wheel).namelist()
