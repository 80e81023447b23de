"""Nothing the user owns is lost or silently made worse (issue 20, item 2, and its loose ends).

Real CLI runs on the bundled models: --overwrite refuses a folder holding a stranger's file and
leaves it byte for byte; finetune writes a new folder unless asked to write over its input; a
fine-tune whose held-out loss worsens says so, records it and keeps its best checkpoint; a folder
whose scorer moved from its faithful start does not load as softmax in plain transformers; the
temporary folder a killed writer leaves is removed by the next run, and nothing that merely looks
like one. Data is generated here; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.errors import EXIT_USAGE
from ssacli.models.checkpoint import training_record
from ssacli.train.data import make_objective
from tests.helpers.cli import run_main
from tests.helpers.plain_transformers import WAYS, plain_loads, refuses_naming_ssacli

runner = CliRunner()
ICL = ["--data", "icl:every", "--batch-size", "4", "-q"]


def cli(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def refusal(monkeypatch, capsys, *args) -> str:
    """Run the ssacli console script in-process; it must refuse with exit 2 and one line."""
    code, out, err = run_main([str(a) for a in args], monkeypatch, capsys)
    assert code == EXIT_USAGE, (code, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return " ".join(err.split())


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) by its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The bundled ICL model converted to ssa:init=faithful (a faithful start)."""
    out = tmp_path_factory.mktemp("conv") / "every-ssa"
    result = cli("convert", "builtin:every-softmax", "--scorer", "ssa:init=faithful", "--out", out)
    assert result.exit_code == 0, result.output
    return out


# ---- --overwrite --------------------------------------------------------------------------------------


def test_overwrite_refuses_a_folder_holding_a_strangers_file_and_touches_nothing(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_bytes(b"\\chapter{Results}\n\x00\xff years of work\n")
    for name in ("a.txt", "b.txt", "c.txt"):
        (out / name).write_text(name)
    before = digest(out)
    args = ("convert", "builtin:every-softmax", "--scorer", "ssa:init=faithful", "--out", out, "--overwrite")
    message = refusal(monkeypatch, capsys, *args)
    assert "a.txt, b.txt, c.txt, … (4 entries)" in message and "nothing was touched" in message
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temp folder left beside it


def test_overwrite_names_every_file_of_a_small_folder(tmp_path, monkeypatch, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.md").write_text("keep me")
    args = ("finetune", "builtin:every-softmax", "--out", out, "--overwrite", *ICL, "--steps", "1")
    assert "(todo.md)" in refusal(monkeypatch, capsys, *args)
    assert (out / "todo.md").read_text() == "keep me"


def test_overwrite_replaces_a_folder_ssacli_wrote_and_uses_an_empty_one(tmp_path, converted):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli(
        "convert", "builtin:every-softmax", "--scorer", "ssa:init=faithful", "--out", empty, "--overwrite"
    )
    assert result.exit_code == 0, result.output
    assert digest(empty) == digest(converted)  # the same conversion
    result = cli("convert", "builtin:every-softmax", "--scorer", "softmax", "--out", empty, "--overwrite")
    assert result.exit_code == 0, result.output
    assert json.loads((empty / "ssacli.json").read_text())["scorer"] == "softmax"  # replaced


# ---- finetune never writes over its input unless asked --------------------------------------------------


def test_finetune_writes_a_new_folder_beside_its_input_by_default(tmp_path, converted, monkeypatch, capsys):
    model = tmp_path / "every-ssa"
    model.mkdir()
    for file in converted.iterdir():
        (model / file.name).write_bytes(file.read_bytes())
    before = digest(model)
    result = cli("finetune", model, *ICL, "--steps", "2")
    assert result.exit_code == 0, result.output
    assert last_line(result.output).startswith(f"wrote {tmp_path / 'every-ssa-ft'} (step 2")
    assert digest(model) == before  # the input is as it was
    assert training_record(tmp_path / "every-ssa-ft")["step"] == 2
    # Again: the default folder now holds a run, which is neither replaced nor continued unasked.
    assert "--resume" in refusal(monkeypatch, capsys, "finetune", model, *ICL, "--steps", "2")
    # --resume without --out continues the run recorded in DIR; this DIR holds none.
    assert "--in-place" in refusal(monkeypatch, capsys, "finetune", model, *ICL, "--steps", "2", "--resume")
    assert digest(model) == before
    # Asked: --in-place, or --out naming the input, write over it.
    result = cli("finetune", model, *ICL, "--steps", "2", "--in-place")
    assert result.exit_code == 0, result.output
    assert training_record(model)["step"] == 2 and digest(model) != before
    result = cli("finetune", model, "--steps", "3", "--out", model)  # continues the run there
    assert result.exit_code == 0, result.output
    assert training_record(model)["step"] == 3
    result = cli("finetune", tmp_path / "every-ssa-ft", "--resume", "--steps", "4")  # extend, in DIR
    assert result.exit_code == 0, result.output
    assert training_record(tmp_path / "every-ssa-ft")["step"] == 4


def test_in_place_refuses_a_folder_ssacli_did_not_write(tmp_path, monkeypatch, capsys):
    model = tmp_path / "plain"
    ssacli.load_model("builtin:wikitext-softmax").model.save_pretrained(model)
    (model / "README.md").write_text("my notes")
    capsys.readouterr()  # transformers' own progress bar while saving
    before = digest(model)
    args = ("finetune", model, "--data", "icl:every", "--in-place", "--steps", "1", "-q")
    assert "README.md" in refusal(monkeypatch, capsys, *args)
    assert digest(model) == before


# ---- a run that ends worse says so and keeps its best checkpoint ----------------------------------------


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = "the a cat dog sees finds small red tree house river old".split()
    lines = [" ".join(rng.choice(words) for _ in range(14)).capitalize() + "." for _ in range(400)]
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("\n\n".join(lines))
    return path


@pytest.fixture(scope="module")
def worsened(tmp_path_factory, text) -> tuple[Path, Path, object]:
    """builtin:wikitext-softmax converted, then fine-tuned at a learning rate far too high."""
    root = tmp_path_factory.mktemp("lm")
    model = root / "lm-ssa"
    result = cli("convert", "builtin:wikitext-softmax", "--scorer", "ssa:init=faithful", "--out", model)
    assert result.exit_code == 0, result.output
    result = cli("finetune", model, "--data", text, "--steps", "4", "--lr", "0.5", "--checkpoint-every", "2",
                 "--batch-size", "2", "--seq-len", "32", "--anneal-n", "2", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    return model, root / "lm-ssa-ft", result


def test_a_run_whose_heldout_loss_worsens_says_so_records_it_and_keeps_the_best(worsened, text):
    model, out, result = worsened
    record = training_record(out)
    heldout = record["heldout"]
    assert [h[0] for h in heldout] == [0, 2, 4]
    assert record["heldout_start"] == heldout[0][1] and record["heldout_end"] == heldout[-1][1]
    assert record["worsened"] is True and heldout[-1][1] > heldout[0][1]
    best_step, lowest = min(heldout, key=lambda h: (h[1], h[0]))
    assert record["best"] == {"step": best_step, "heldout_loss": lowest, "folder": "best"}
    line = last_line(result.output)
    assert line.startswith(f"wrote {out} (step 4") and "WORSE" in line
    assert f"the best checkpoint (step {best_step}, held-out loss {lowest:.4g}) is in {out / 'best'}" in line
    # best/ is a loadable model whose held-out loss is the best evaluated one...
    best = ssacli.load_model(str(out / "best"), device="cpu")
    objective = make_objective(best, str(text), "auto", 32)
    measured = objective.heldout_loss(best.model, torch.device("cpu"))
    assert measured == pytest.approx(lowest, rel=1e-5)
    assert not (out / "best" / "trainer.safetensors").exists()
    if best_step == 0:  # ...and, when the start was best, it is the input model, weight for weight
        start = ssacli.load_model(str(model), device="cpu").model.state_dict()
        assert all(torch.equal(v, start[k]) for k, v in best.model.state_dict().items())


def test_report_says_when_after_worsened(worsened, text):
    model, out, _ = worsened
    args = ["report", model, out, "--text-id", text, "--probe", "logit-scale:1,4", "--samples", "1"]
    args.append("--no-builtin")
    # wide enough that the folder's path (long under pytest-xdist) is not wrapped inside the panel
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "worsened" in result.output.lower() and str(out / "best") in result.output


# ---- a moved scorer never loads silently as softmax -------------------------------------------------------


def test_a_folder_whose_scorer_moved_is_refused_by_plain_transformers_and_loads_in_ssacli(
    worsened, text, tmp_path
):
    from transformers import AutoModelForCausalLM

    model, out, _ = worsened
    plain_start = AutoModelForCausalLM.from_pretrained(model)  # the faithful start stays plain-loadable
    assert type(plain_start).__name__ == "LlamaForCausalLM"
    # without ssacli (a fresh interpreter): every way of loading it refuses, naming ssacli
    refused = plain_loads([out], tmp_path, register=False)[str(out)]
    for way in WAYS[1:]:
        assert refuses_naming_ssacli(way, refused[way]), (way, refused[way])
    assert "ssacli" in json.loads((out / "config.json").read_text())["ssacli_note"]
    loaded = ssacli.load_model(str(out), device="cpu")
    assert (loaded.family, loaded.kind) == ("llama", "causal")
    assert loaded.config.ssacli_scorer == "ssa:init=faithful"
    scorer = next(iter(ssacli.scorers_of(loaded.model).values()))
    assert float(scorer.n.detach().mean()) == pytest.approx(2.0, rel=1e-5)  # annealed: the scorer moved
    ids = loaded.tokenizer("the cat sees a dog", return_tensors="pt").input_ids
    with torch.no_grad():
        ssa_logits = loaded.model(input_ids=ids).logits
        ssacli.restore(loaded.model)  # the same weights with softmax: what plain loading would run
        softmax_logits = loaded.model(input_ids=ids).logits
    assert not torch.allclose(ssa_logits, softmax_logits, rtol=1e-3, atol=0)
    result = cli("diagnose", out, "--probe", "logit-scale:1,4", "--samples", "1")
    assert result.exit_code == 0, result.output


# ---- temporary folders of killed writers -----------------------------------------------------------------

KILLED_WRITER = """
import os, signal, sys
from ssacli.models.checkpoint import write_icl_folder

class DiesWhileWriting:  # the config a writer saves first: the process is killed mid-write
    def to_json_file(self, path):
        os.kill(os.getpid(), signal.SIGKILL)

write_icl_folder(sys.argv[1], config=DiesWhileWriting(), state={}, record={})
"""


def test_a_resumed_run_removes_the_temp_folder_a_killed_writer_left_and_nothing_else(tmp_path, converted):
    out = tmp_path / "run"
    result = cli("finetune", converted, "--out", out, *ICL, "--steps", "2")
    assert result.exit_code == 0, result.output
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(out)], env={**os.environ})
    assert killed.returncode == -signal.SIGKILL
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]
    assert len(stale) == 1 and stale[0].is_dir()
    lookalike = tmp_path / ".run.abcd1234"  # the user's, named alike, without ssacli's marker
    lookalike.mkdir()
    (lookalike / "keep.txt").write_text("mine")
    result = cli("finetune", out, "--resume", "--steps", "4", "-q")
    assert result.exit_code == 0, result.output
    assert training_record(out)["step"] == 4
    assert not stale[0].exists()
    assert (lookalike / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.abcd1234", "run"]
