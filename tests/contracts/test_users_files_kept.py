"""The user's files are the user's (issue 50, part B): every output option of every command refuses,
before any model loads, to replace a file ssacli did not write (exit 2, one line naming the file and
``--overwrite``) and leaves it byte for byte; ``--overwrite`` replaces it; a file ssacli wrote earlier
(or an empty one) is replaced as before.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ssacli.models.loading
from ssacli.errors import EXIT_USAGE
from tests.helpers.cli import run_main

ICL = "builtin:every-softmax"
QUICK = ["--probe", "key-scale:1,8", "--samples", "1"]
MINE = {
    "json": '{"my": "experiment notes"}\n',
    "html": "<html><body>my notes</body></html>\n",
    "csv": "a,b\n1,2\n",
    "xml": "<notes>mine</notes>\n",
    "png": "not an image, but mine\n",
}


def _no_model_loads(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the outputs were checked")

    monkeypatch.setattr(ssacli.models.loading, "load_with", refuse)


# (command line with {F} for the user's file, the option, the file's suffix)
CASES = [
    (["diagnose", ICL, *QUICK, "--json", "{F}"], "--json", "json"),
    (["diagnose", ICL, *QUICK, "--html", "{F}"], "--html", "html"),
    (["attribute", "builtin:wikitext-softmax", "--json", "{F}"], "--json", "json"),
    (["attribute", "builtin:wikitext-softmax", "--html", "{F}"], "--html", "html"),
    (["report", ICL, "builtin:every-ssa", *QUICK, "--html", "{F}"], "--html", "html"),
    (["report", ICL, "builtin:every-ssa", *QUICK, "--json", "{F}"], "--json", "json"),
    (["check", ICL, "-r", "collapse_rate@key-scale:8 max <= 1", "--json", "{F}"], "--json", "json"),
    (["check", ICL, "-r", "collapse_rate@key-scale:8 max <= 1", "--junit", "{F}"], "--junit", "xml"),
    (["convert", ICL, "--scorer", "softmax", "--out", "{D}", "--json", "{F}"], "--json", "json"),
    (
        ["finetune", ICL, "--data", "icl:every", "--steps", "1", "--out", "{D}", "--json", "{F}"],
        "--json",
        "json",
    ),  # fmt: skip
    (
        [
            "train",
            "--arch",
            "gpt2",
            "--size",
            "tiny",
            "--data",
            "icl:every",
            "--steps",
            "1",
            "--out",
            "{D}",
            "--json",
            "{F}",
        ],
        "--json",
        "json",
    ),  # fmt: skip
    (["icl", "train", "--task", "every", "--steps", "1", "--out", "{D}", "--json", "{F}"], "--json", "json"),
    (["icl", "eval", ICL, "--json", "{F}"], "--json", "json"),
    (["icl", "eval", ICL, "--plot", "{F}"], "--plot", "png"),
]


@pytest.mark.parametrize("args, option, suffix", CASES, ids=[f"{c[0][0]}-{c[0][1]}-{c[1]}" for c in CASES])
def test_a_file_ssacli_did_not_write_is_refused_before_any_work(args, option, suffix, tmp_path, monkeypatch,
                                                                capsys):  # fmt: skip
    mine = tmp_path / f"mine.{suffix}"
    mine.write_text(MINE[suffix])
    line = [a.replace("{F}", str(mine)).replace("{D}", str(tmp_path / "out")) for a in args]
    _no_model_loads(monkeypatch)
    code, _, stderr = run_main(line, monkeypatch, capsys)
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert code == EXIT_USAGE and len(lines) == 1 and "Traceback" not in stderr, (code, stderr)
    message = " ".join(lines[0].split())
    assert f"{option} '{mine}' exists" in message and "--overwrite" in message, message
    assert mine.read_text() == MINE[suffix]
    assert not (tmp_path / "out").exists()


def test_render_outputs_follow_the_same_rule_and_take_overwrite(tmp_path, monkeypatch, capsys):
    result = tmp_path / "r.json"
    assert run_main(["diagnose", ICL, *QUICK, "--json", str(result), "-q"], monkeypatch, capsys)[0] == 0
    table = tmp_path / "heads.csv"
    table.write_text(MINE["csv"])
    code, _, stderr = run_main(["render", str(result), "--csv", str(table)], monkeypatch, capsys)
    assert code == EXIT_USAGE and "--overwrite" in stderr and table.read_text() == MINE["csv"]
    args = ["render", str(result), "--csv", str(table), "--overwrite"]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    assert table.read_text().startswith("model,probe,level,layer,head,metric,value")


def test_overwrite_replaces_the_users_file_and_ssacli_replaces_its_own_unasked(tmp_path, monkeypatch, capsys):
    mine, page = tmp_path / "mine.json", tmp_path / "notes.html"
    mine.write_text(MINE["json"])
    page.write_text(MINE["html"])
    args = ["diagnose", ICL, *QUICK, "--json", str(mine), "--html", str(page), "--overwrite", "-q"]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    assert json.loads(mine.read_text())["schema"] == "ssacli-diagnose"
    assert page.read_text().startswith("<!DOCTYPE html>")
    # Now they are ssacli's: the next run replaces them without --overwrite, as before.
    stamp = mine.read_text()
    code, _, stderr = run_main(args[:-2] + ["-q"], monkeypatch, capsys)
    assert code == 0, stderr
    assert json.loads(mine.read_text())["schema"] == "ssacli-diagnose" and mine.stat().st_size > 0
    assert json.loads(stamp)["model"] == json.loads(mine.read_text())["model"]


def test_icl_eval_replaces_its_own_json_and_figure(tmp_path, monkeypatch, capsys):
    """icl eval's JSON names its schema and its figure carries ssacli's mark, so a rerun replaces both."""
    out, plot = tmp_path / "eval.json", tmp_path / "eval.png"
    args = ["icl", "eval", ICL, "--sigma", "1", "--length", "11", "--prompts", "4", "--json", str(out),
            "--plot", str(plot)]  # fmt: skip
    for _ in range(2):
        code, _, stderr = run_main(args, monkeypatch, capsys)
        assert code == 0, stderr
    assert json.loads(out.read_text())["schema"] == "ssacli-icl-eval"


def test_the_refusal_comes_before_torch_is_imported(tmp_path):
    """Checked first, like an unwritable output: the console script refuses without the model stack."""
    mine = tmp_path / "mine.json"
    mine.write_text(MINE["json"])
    script = (
        "import sys\n"
        "from ssacli.cli import main\n"
        f"sys.argv = ['ssacli', 'diagnose', '{ICL}', '--json', {str(mine)!r}]\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('STACK', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "STACK []" in done.stdout and "--overwrite" in done.stderr, (done.stdout, done.stderr)
    assert mine.read_text() == MINE["json"]
