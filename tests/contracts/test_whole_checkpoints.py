"""A checkpoint is whole or refused (issue 50, part B): a folder whose weights lack a tensor the
architecture builds, hold tensors its config does not build or of other shapes, ship a tokenizer
with more ids than the embedding has rows, or hold a NaN is refused as it loads, in every command
that loads a model, with exit 4 (``check``: 3, a model that cannot be checked) and one line naming
the tensor or the file. Tied weights and the buffers transformers computes itself are not flagged:
whole folders of several families, and the bundled models, load.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import ssacli
from ssacli.errors import EXIT_CHECK_UNCHECKABLE, EXIT_INPUT, BrokenModelError
from ssacli.models.builtins import BUILTIN_DIR
from tests.helpers.cli import run_main
from tests.helpers.models import build_model

QUICK = ["--probe", "key-scale:1,8", "--samples", "1", "--length", "8", "--random"]
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


def _edit(folder: Path, edit) -> None:
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in stderr, stderr
    return " ".join(lines[0].split())


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A tiny Llama saved whole, then: without one attention weight, with a layer its config does not
    build, with a weight of another shape, with a NaN; and the bundled WikiText LM with a tokenizer
    grown past its embedding."""
    root = tmp_path_factory.mktemp("whole")
    made = {}
    for name in ("whole", "missing", "extra", "shape", "nan"):
        build_model("llama").save_pretrained(root / name)
        made[name] = root / name
    _edit(made["missing"], lambda w: w.pop(Q_PROJ))
    _edit(made["extra"], lambda w: w.update({"model.layers.9.self_attn.q_proj.weight": w[Q_PROJ].clone()}))
    _edit(made["shape"], lambda w: w.update({Q_PROJ: w[Q_PROJ][:-1].clone()}))

    def poison(w):
        w[Q_PROJ][0, 0] = math.nan

    _edit(made["nan"], poison)
    made["tokens"] = root / "tokens"
    shutil.copytree(BUILTIN_DIR / "wikitext-softmax", made["tokens"])
    tokenizer = ssacli.load_model("builtin:wikitext-softmax").tokenizer
    tokenizer.add_tokens([f"<new{i}>" for i in range(5)])
    tokenizer.save_pretrained(made["tokens"])
    return made


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", ["not whole", Q_PROJ, "initialized at random"]),
        ("extra", ["model.layers.9.self_attn.q_proj.weight", "does not build"]),
        ("shape", ["do not have the shapes", Q_PROJ, "in the weights", "built"]),
        ("nan", ["non-finite weights", Q_PROJ]),
    ],
)
def test_a_checkpoint_that_is_not_whole_is_refused_by_every_command(
    case, words, folders, tmp_path, monkeypatch, capsys
):
    ref, out = str(folders[case]), tmp_path / "out.json"
    text = tmp_path / "train.txt"
    text.write_text("the cat sat on the mat. " * 200)
    commands = {
        "diagnose": (["diagnose", ref, *QUICK, "--json", str(out)], EXIT_INPUT),
        "report": (["report", ref, ref, "--random", *QUICK[:4]], EXIT_INPUT),
        "check": (["check", ref, *QUICK[2:], "-r", "collapse_rate@key-scale:8 max <= 0.99"],
                  EXIT_CHECK_UNCHECKABLE),
        "convert": (["convert", ref, "--scorer", "ssa:init=faithful", "--text", str(text),
                     "--out", str(tmp_path / "conv")], EXIT_INPUT),
        "finetune": (["finetune", ref, "--data", str(text), "--steps", "1", "--seq-len", "16",
                      "--out", str(tmp_path / "ft"), "-q"], EXIT_INPUT),
    }  # fmt: skip
    for command, (args, expected) in commands.items():
        code, stdout, stderr = run_main(args, monkeypatch, capsys)
        line = _one_line(stderr)
        assert code == expected, (command, code, stderr)
        assert all(w in line for w in words), (command, line)
        assert "overflow" not in stdout and "LOAD REPORT" not in stdout + stderr
    assert not out.exists() and not (tmp_path / "conv").exists() and not (tmp_path / "ft").exists()


@pytest.mark.parametrize("verbosity", ["error", "warning", "info"])
def test_the_shape_refusal_names_the_tensor_whatever_transformers_verbosity(verbosity, folders, capsys):
    """transformers names mismatched tensors only in its logged report: the refusal reads it at
    any verbosity (a test or a user that set transformers' logging to errors made it read 'some
    tensors'), and a quiet verbosity prints nothing of the report."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    getattr(hf_logging, f"set_verbosity_{verbosity}")()
    try:
        with pytest.raises(ssacli.InputError, match="in the weights") as refused:
            ssacli.load_model(str(folders["shape"]))
    finally:
        hf_logging.set_verbosity(before)
    assert Q_PROJ in str(refused.value)
    assert "LOAD REPORT" not in "".join(capsys.readouterr())


def test_a_tokenizer_with_more_ids_than_the_embedding_is_refused(folders, monkeypatch, capsys):
    ref = str(folders["tokens"])
    for args in (["diagnose", ref, *QUICK[:4]], ["report", ref, "builtin:wikitext-softmax", *QUICK[:4]]):
        code, _, stderr = run_main(args, monkeypatch, capsys)
        line = _one_line(stderr)
        assert code == EXIT_INPUT and "IndexError" not in line, line
        assert "1,029 ids" in line and "1,024 rows" in line and "tokenizer.json" in line, line


@pytest.mark.parametrize(
    "family, overrides, tensor",
    [
        ("llama", {"tie_word_embeddings": True}, "model.layers.0.self_attn.k_proj.weight"),  # lm_head tied
        ("gpt2", {}, "transformer.h.0.attn.c_attn.weight"),  # tied, attn.bias buffers
        ("bert", {}, "encoder.layer.0.attention.self.query.weight"),  # BertModel: a pooler
        ("t5", {}, "encoder.block.0.layer.0.SelfAttention.q.weight"),  # seq2seq, shared embeddings
    ],
)
def test_whole_folders_load_and_the_same_without_one_attention_weight_is_refused(
    family, overrides, tensor, tmp_path
):
    """Tied weights, rotary and position buffers transformers computes itself are not read as missing;
    one attention weight removed is."""
    folder = tmp_path / family
    build_model(family, **overrides).save_pretrained(folder)
    assert ssacli.load_model(str(folder)).family == family
    _edit(folder, lambda w: w.pop(tensor))
    with pytest.raises(BrokenModelError, match=tensor.replace(".", r"\.")):
        ssacli.load_model(str(folder))


def test_tensors_of_a_part_the_class_does_not_build_are_left(folders, tmp_path):
    """A pretraining head beside the weights (as bert-base's checkpoints carry): the model is whole."""
    folder = tmp_path / "head"
    shutil.copytree(folders["whole"], folder)
    _edit(folder, lambda w: w.update({"cls.seq_relationship.weight": w["model.norm.weight"].clone()}))
    loaded = ssacli.load_model(str(folder))
    assert loaded.family == "llama"
    with pytest.raises(BrokenModelError, match="model.layers.9"):  # ... but not a layer beyond the config's
        ssacli.load_model(str(folders["extra"]))


@pytest.mark.parametrize("name", ["wikitext-softmax", "wikitext-ssa", "every-softmax"])
def test_the_bundled_models_load_whole_and_a_nan_in_one_is_refused(name, tmp_path):
    assert ssacli.load_model(f"builtin:{name}").model is not None
    folder = tmp_path / name
    shutil.copytree(BUILTIN_DIR / name, folder)
    first = next(iter(load_file(folder / "model.safetensors")))

    def poison(w):
        w[first].view(-1)[0] = math.inf

    _edit(folder, poison)
    with pytest.raises(BrokenModelError, match=first.replace(".", r"\.")):
        ssacli.load_model(str(folder))


def test_icl_eval_refuses_a_nan_in_an_icl_checkpoint(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "every"
    shutil.copytree(BUILTIN_DIR / "every-softmax", folder)
    first = next(iter(load_file(folder / "model.safetensors")))

    def poison(w):
        w[first].view(-1)[0] = math.nan

    _edit(folder, poison)
    code, _, stderr = run_main(["icl", "eval", str(folder), "--prompts", "4"], monkeypatch, capsys)
    line = _one_line(stderr)
    assert code == EXIT_INPUT and "non-finite weights" in line and first in line, line
