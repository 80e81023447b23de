"""Bad input is refused (issue 50, part B): in one line, with the documented exit code, before any model
loads where the command line alone decides: an empty level list, flags that cancel each other
(``--text`` with ``--random``; ``check --init`` with an option only a check run reads), a
fine-tuning folder that does not exist, an unknown ``icl:TASK``; a length probe level beyond what the
model can take is refused as soon as the model's positions are known, before any probe runs.
"""

from __future__ import annotations

import pytest

import ssacli
import ssacli.models.loading
from ssacli.errors import EXIT_INPUT, EXIT_USAGE, UsageError
from tests.helpers.cli import run_main

LM = "builtin:wikitext-softmax"  # 128 positions
ICL = "builtin:every-softmax"


def _no_model_loads(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the command line was checked")

    monkeypatch.setattr(ssacli.models.loading, "load_with", refuse)


def _refused(args, code, monkeypatch, capsys) -> str:
    got, _, stderr = run_main([str(a) for a in args], monkeypatch, capsys)
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert got == code and len(lines) == 1 and "Traceback" not in stderr, (got, stderr)
    return " ".join(lines[0].split())


@pytest.mark.parametrize("probe", ["outlier:", "key-scale: "])
@pytest.mark.parametrize("command", [["diagnose", ICL], ["report", ICL, "builtin:every-ssa"]])
def test_an_empty_level_list_is_refused_not_read_as_the_defaults(command, probe, monkeypatch, capsys):
    _no_model_loads(monkeypatch)
    line = _refused([*command, "--probe", probe], EXIT_USAGE, monkeypatch, capsys)
    name = probe.partition(":")[0]
    assert f"probe '{name}:' has no levels" in line and f"'{name}' alone for the defaults" in line, line
    with pytest.raises(UsageError, match="no levels"):
        ssacli.parse_probe(probe)


def test_text_and_random_ids_cancel_each_other_and_are_refused(tmp_path, monkeypatch, capsys):
    text = tmp_path / "t.txt"
    text.write_text("Some text to probe with. " * 20)
    _no_model_loads(monkeypatch)
    args = ["diagnose", LM, "--text", text, "--random", "--probe", "key-scale:1,8"]
    line = _refused(args, EXIT_USAGE, monkeypatch, capsys)
    assert "--text and --random each choose the probe inputs" in line, line
    with pytest.raises(UsageError, match="each choose the probe inputs"):
        ssacli.diagnose(LM, ["key-scale:1,8"], text=text.read_text(), random_ids=True)


def test_a_length_level_beyond_the_models_positions_is_refused_before_any_probe(monkeypatch, capsys):
    """The bundled LM takes 128 positions: ×99999 of a 64-token base would be capped at 128 and its
    verdict would name ×99999; it is refused, naming the most that fits. Levels that fit run as asked."""
    args = ["diagnose", LM, "--probe", "length:1,99999", "--samples", "1", "--length", "64"]
    line = _refused(args, EXIT_USAGE, monkeypatch, capsys)
    assert "level ×99999" in line and "at most 128" in line and "up to ×2" in line, line
    result = ssacli.diagnose(LM, ["length:1,2"], samples=1, length=64)
    assert result.probes[0].levels == [1.0, 2.0]
    assert result.probes[0].extras["tokens"][-1] == pytest.approx(128)


def test_finetune_of_a_folder_that_does_not_exist_is_an_input_error(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "no-such-dir"
    line = _refused(["finetune", missing, "--data", "icl:every"], EXIT_INPUT, monkeypatch, capsys)
    assert f"'{missing}' does not exist" in line, line
    line = _refused(["finetune", "no-such-dir", "--data", "icl:every"], EXIT_INPUT, monkeypatch, capsys)
    assert "'no-such-dir' does not exist" in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["convert", ICL, "--scorer", "ssa:init=faithful", "--finetune", "--data", "icl:bogus"],
        ["convert", ICL, "--scorer", "ssa", "--finetune", "--data", "icl:bogus"],
        ["finetune", ICL, "--data", "icl:bogus"],
    ],
    ids=["convert-finetune", "convert-recipe", "finetune"],
)
def test_an_unknown_icl_task_is_refused_before_the_model_loads(args, tmp_path, monkeypatch, capsys):
    _no_model_loads(monkeypatch)
    out = tmp_path / "out"
    line = _refused([*args, "--out", out], EXIT_USAGE, monkeypatch, capsys)
    assert "unknown task 'bogus'" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, option",
    [(["--json", "c.json"], "--json"), (["-r", "collapse_rate@key-scale:8 max <= 1"], "--require"),
     (["--baseline", "b.json"], "--baseline"), (["--samples", "2"], "--samples")],
)  # fmt: skip
def test_check_init_refuses_options_only_a_check_run_reads(extra, option, tmp_path, monkeypatch, capsys):
    """--init measures MODEL with its own settings and writes ssacli.toml: a report file, requirements
    or probe settings given with it would be dropped without a word."""
    monkeypatch.chdir(tmp_path)
    _no_model_loads(monkeypatch)
    line = _refused(["check", "--init", ICL, *extra], EXIT_USAGE, monkeypatch, capsys)
    assert f"{option} applies to running a check" in line and "without --init" in line, line
    assert list(tmp_path.iterdir()) == []  # no ssacli.toml, no c.json
