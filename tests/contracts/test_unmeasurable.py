"""Models and probes that cannot be measured say so, in every command and every output: never a
verdict that reads like a measurement.

* a checkpoint folder without a tokenizer is refused for text probes (exit 4; ``check``: 2), naming
  the files it lacks and ``--random``; with ``--random`` it runs, and a loss on random ids is not
  read as "degenerate";
* non-finite weights are found before any probe and named (exit 4; ``check``: 3, neither a passed
  nor a failed gate), with no output file written;
* a probe non-finite at every level renders in the terminal, JSON, HTML and ``render``;
* a probe absorbed before attention whose outputs broke reads "outputs broke … through the residual
  stream", never "absorbed" alone.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from ssacli import DiagnoseResult, diagnose
from ssacli.errors import (
    EXIT_CHECK_UNCHECKABLE,
    EXIT_CHECK_USAGE,
    EXIT_INPUT,
)
from ssacli.report.html import diagnose_html
from tests.helpers.cli import run_main
from tests.helpers.models import build_model

QUICK = ["--probe", "key-scale:1,8", "--samples", "1", "--length", "8"]
REQUIRE = ["-r", "collapse_rate@key-scale:8 max <= 0.99"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny Llama saved without a tokenizer, and the same with one NaN weight."""
    root = tmp_path_factory.mktemp("unmeasurable")
    plain = root / "no-tokenizer"
    build_model("llama").save_pretrained(plain)
    nan = root / "nan-weight"
    build_model("llama").save_pretrained(nan)
    weights = load_file(nan / "model.safetensors")
    name = next(k for k in weights if k.endswith("layers.1.self_attn.q_proj.weight"))
    weights[name][0, 0] = math.nan
    save_file(weights, nan / "model.safetensors", metadata={"format": "pt"})
    return {"plain": plain, "nan": nan, "nan_tensor": name}


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_folder_without_a_tokenizer_is_refused_for_text_probes(folders, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.json"
    ref = str(folders["plain"])
    code, _, stderr = run_main(["diagnose", ref, *QUICK, "--json", str(out)], monkeypatch, capsys)
    line = _one_line(stderr)
    assert code == EXIT_INPUT and not out.exists()
    assert "no tokenizer" in line and "tokenizer.json" in line and "--random" in line
    code, _, stderr = run_main(["check", ref, *QUICK[2:], *REQUIRE], monkeypatch, capsys)
    assert code == EXIT_CHECK_USAGE and "--random" in _one_line(stderr)
    code, _, stderr = run_main(["report", ref, ref, "--probe", "key-scale:1,8", "--samples", "1"],
                               monkeypatch, capsys)  # fmt: skip
    assert code == EXIT_INPUT and "no tokenizer" in _one_line(stderr)


def test_random_ids_are_an_explicit_choice_and_not_read_as_a_degenerate_model():
    """The bundled WikiText LM on random token ids: its loss there is worse than guessing (no model
    predicts random tokens), which says nothing of the model, so no verdict reads it as degenerate."""
    result = diagnose("builtin:wikitext-softmax", ["key-scale:1,8"], random_ids=True, samples=2)
    assert result.settings["inputs"] == "random token ids"
    base = result.probes[0].extras["loss"][0]
    assert base >= 0.9 * math.log(result.settings["vocab_size"])  # the case the loss rule would flag
    assert result.degenerate() is None
    assert all(v["verdict"] != "degenerate" for v in result.verdicts().values())


def test_non_finite_weights_are_named_before_probing(folders, tmp_path, monkeypatch, capsys):
    ref, tensor = str(folders["nan"]), folders["nan_tensor"]
    html, out = tmp_path / "r.html", tmp_path / "r.json"
    args = ["diagnose", ref, *QUICK, "--random", "--html", str(html), "--json", str(out)]
    code, stdout, stderr = run_main(args, monkeypatch, capsys)
    line = _one_line(stderr)
    assert code == EXIT_INPUT and "non-finite weights" in line and tensor in line and "1 of" in line
    assert not html.exists() and not out.exists() and "overflow" not in stdout
    code, _, stderr = run_main(["check", ref, *QUICK[2:], "--random", *REQUIRE], monkeypatch, capsys)
    assert code == EXIT_CHECK_UNCHECKABLE and tensor in _one_line(stderr)  # neither passed nor failed
    args = ["report", ref, ref, "--random", "--probe", "key-scale:1,8"]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == EXIT_INPUT and tensor in _one_line(stderr)


def test_a_probe_non_finite_at_every_level_renders_everywhere(tmp_path, monkeypatch, capsys):
    """key-scale levels past float32's range: every forward overflows. The verdict names the
    overflow; the terminal, the JSON, the HTML page and `ssacli render` of the JSON all render."""
    model = build_model("llama")
    result = diagnose(model, ["key-scale:1e39,1e40"], random_ids=True, samples=1, length=8)
    probe = result.probes[0]
    assert probe.all_overflowed and result.verdicts()["key-scale"]["verdict"] == "overflow"
    page = diagnose_html(result)
    assert "every level overflowed" in page
    data = result.to_dict()
    text = json.dumps(data, allow_nan=False)  # strict JSON: no NaN leaks out
    again = DiagnoseResult.from_dict(json.loads(text))
    assert again.probes[0].all_overflowed
    saved = tmp_path / "r.json"
    saved.write_text(text)
    html = tmp_path / "r.html"
    code, stdout, stderr = run_main(["render", str(saved), "--html", str(html)], monkeypatch, capsys)
    assert code == 0, stderr
    assert "overflow" in stdout and "every level overflowed" in html.read_text()


def test_embed_scale_absorbed_before_attention_but_breaking_the_outputs_says_so(tmp_path):
    """The bundled pre-norm Llama: the first layer's input norm absorbs the embedding scale before
    attention (the logits barely move), yet the scaled embeddings ride the residual stream to the
    output, whose KL to the unshifted run grows far past 0.1. The verdict is "outputs broke",
    naming the residual stream and the KL, not "absorbed"."""
    result = diagnose("builtin:wikitext-softmax", ["embed-scale:1,10,1000"], samples=2)
    probe = result.probes[0]
    assert probe.reached() is False  # the shift did not arrive at attention
    kl = probe.extras["output_kl"]
    assert max(v for v in kl if v is not None) > 0.1  # and still the outputs moved
    verdict = result.verdicts()["embed-scale"]
    assert verdict["verdict"] == "outputs broke", verdict
    assert "residual stream" in verdict["text"] and "KL" in verdict["text"]
    assert any(f["kind"] == "outputs_broke" and "residual stream" in f["text"] for f in result.findings())


def test_an_absorbed_probe_whose_outputs_held_is_still_absorbed():
    """The other side of the rule: on a model whose outputs barely move (a random tiny Llama at a
    small shift) an absorbed embed-scale stays "absorbed", not "outputs broke"."""
    torch.manual_seed(0)
    result = diagnose(build_model("llama"), ["embed-scale:1,1.5"], random_ids=True, samples=2, length=16)
    probe = result.probes[0]
    kl = [v for v in probe.extras.get("output_kl", []) if v is not None]
    assert probe.reached() is False and kl and max(kl) <= 0.1, (probe.reached(), kl)  # the case
    assert result.verdicts()["embed-scale"]["verdict"] == "absorbed"


def test_a_length_above_the_models_maximum_is_capped_and_said_in_one_line(monkeypatch, capsys):
    """--length beyond the model's positions (the bundled LM has 128): the run uses 128, the result
    records both, and the report's summary says so in one line (not only in a table title)."""
    result = diagnose("builtin:wikitext-softmax", ["key-scale:1,8"], samples=1, length=500)
    assert result.settings["length"] == 128 and result.settings["length_asked"] == 500
    code, stdout, _ = run_main(["diagnose", "builtin:wikitext-softmax", "--probe", "key-scale:1,8",
                                "--samples", "1", "--length", "500"], monkeypatch, capsys)  # fmt: skip
    assert code == 0
    line = next(x for x in stdout.splitlines() if "--length 500" in x)
    assert "128 tokens" in line and "capped" in line
    plain = diagnose("builtin:wikitext-softmax", ["key-scale:1,8"], samples=1, length=64)
    assert "length_asked" not in plain.settings
