"""diagnose --generate: every decoding step's attention against the KV cache.

The reference is independent of the code under test: the tokens are transformers' own greedy
``generate``, and the metrics of each generated position come from the model's own eager attention
over the finished sequence (``output_attentions=True``, no cache), reduced row by row in numpy.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ssacli import diagnose
from ssacli.cli import app
from ssacli.diagnosis.generation import EXACT_METRICS
from ssacli.diagnosis.result import DiagnoseResult
from ssacli.errors import UsageError
from tests.helpers.models import VOCAB, build_model, clone
from tests.helpers.result_schema import schema_errors

TAU, TOP_K = 0.5, 2  # a low tau, so that collapse_rate is not 0 everywhere on a tiny random model


def reference_metrics(model, sequences: torch.Tensor, prompt: int) -> dict[str, np.ndarray]:
    """[step, layer, head] from full eager weight maps of ``sequences`` (no cache), the rows of the
    generated positions, averaged over sequences."""
    with torch.no_grad():
        maps = model(input_ids=sequences, output_attentions=True, use_cache=False).attentions
    steps = sequences.shape[1] - prompt
    out = {name: np.zeros((steps, len(maps), maps[0].shape[1])) for name in EXACT_METRICS}
    for layer, w in enumerate(maps):
        w = w.double().numpy()
        for t in range(steps):
            position = prompt + t
            row = w[:, :, position, : position + 1]  # [b, h, keys]: the causal row
            p = row / row.sum(-1, keepdims=True)
            entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
            values = {
                "entropy": entropy / math.log(position + 1),
                "max_weight": p.max(-1),
                "collapse_rate": (p.max(-1) >= TAU).astype(float),
                "effective_tokens": np.exp(entropy),
                "topk_mass": np.sort(p, -1)[..., ::-1][..., :TOP_K].sum(-1),
                "sink_mass": p[..., 0],
            }
            for name, value in values.items():
                out[name][t, layer] = value.mean(0)
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_generation_matches_greedy_decoding_and_full_recomputation(family):
    model = build_model(family)
    reference = clone(model)
    generator = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, VOCAB, (3, 9), generator=generator)
    steps = 7
    result = diagnose(
        model, ["embed-scale:1"], inputs=prompts.tolist(), generate=steps, tau=TAU, top_k=TOP_K,
        batch_size=2,
    )  # fmt: skip
    gen = result.generation
    assert gen.steps == steps and gen.prompt_length == 9 and gen.prompts == 3
    assert gen.key_lengths() == list(range(10, 10 + steps))
    with torch.no_grad():
        greedy = reference.generate(
            prompts,
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
            attention_mask=torch.ones_like(prompts),
        )
    assert gen.tokens == greedy[:, 9:].tolist()
    expected = reference_metrics(reference, greedy, 9)
    for name in EXACT_METRICS:
        np.testing.assert_allclose(gen.metrics[name], expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert (gen.rows == 3).all()  # one query row per prompt per step
    assert gen.max_rel_diff is not None and gen.max_rel_diff < 1e-4  # vs the in-library recomputation
    # the probes ran as before
    assert result.probes[0].name == "embed-scale"


def test_generation_under_a_converted_scorer_agrees_with_its_recomputation():
    # SSA (not softmax): the decoding steps and the no-cache rows through the same scorer
    result = diagnose("builtin:wikitext-ssa", ["embed-scale:1"], samples=1, length=8, generate=4)
    assert result.generation.max_rel_diff < 1e-4
    assert np.isfinite(result.generation.metrics["entropy"]).all()


def test_generation_is_refused_where_it_cannot_run():
    model = build_model("llama")
    with pytest.raises(UsageError, match="--generate"):
        diagnose(model, ["embed-scale:1"], inputs=[[5, 6, 7]], generate=0)
    cap = model.config.max_position_embeddings
    with pytest.raises(UsageError, match="no room"):
        diagnose(model, ["embed-scale:1"], inputs=[[5, 6, 7]], generate=cap)
    with pytest.raises(UsageError, match="causal language model"):
        diagnose("builtin:every-softmax", ["embed-scale:1"], generate=2)


def test_cli_generate_json_frames_terminal_and_html(tmp_path):
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    runner = CliRunner()
    args = [
        "diagnose", "builtin:wikitext-softmax", "--probe", "embed-scale:1", "--samples", "2",
        "--length", "16", "--generate", "5", "--json", str(out), "--html", str(page),
    ]  # fmt: skip
    run = runner.invoke(app, args, terminal_width=80, env={"COLUMNS": "80"})
    assert run.exit_code == 0, run.output
    assert "generation · 5 greedy tokens after 2 prompts · keys 17→21" in run.output
    assert "model means per generated position" in run.output
    for line in run.output.splitlines():  # "wrote PATH" names a file: a path is never broken, and
        assert len(line) <= 80 or line.startswith("wrote "), line  # pytest-xdist's are 83+ characters
    data = json.loads(out.read_text())
    assert schema_errors(data) == []
    section = data["generation"]
    assert section["steps"] == 5 and section["key_lengths"] == [17, 18, 19, 20, 21]
    assert section["max_rel_diff"] < 1e-4
    loaded = DiagnoseResult.from_dict(data)
    assert loaded.generation.metrics["entropy"].shape == (5, len(data["layers"]), max(data["heads"]))
    np.testing.assert_allclose(
        loaded.generation.metrics["entropy"], np.array(section["metrics"]["entropy"], dtype=float)
    )
    rows = [r for r in loaded.to_records() if r["probe"] == "generation"]
    layers, width = len(data["layers"]), max(data["heads"])
    assert len(rows) == 5 * layers * width * len(section["metrics"])
    assert sorted({r["level"] for r in rows}) == [17.0, 18.0, 19.0, 20.0, 21.0]
    first = next(r for r in rows if r["metric"] == "entropy" and r["level"] == 17.0)
    assert first["value"] == pytest.approx(section["metrics"]["entropy"][0][0][0])
    again = runner.invoke(app, ["render", str(out)], terminal_width=80, env={"COLUMNS": "80"})
    assert again.exit_code == 0 and "generation · 5 greedy tokens after 2 prompts" in again.output
    html = page.read_text()
    assert "<h2>generation (KV cache)</h2>" in html and "vs full recomputation: max rel. diff" in html
    assert "data:image/png;base64" in html


def test_results_without_generation_still_load_and_validate(tmp_path):
    result = diagnose("builtin:wikitext-softmax", ["embed-scale:1"], samples=1, length=8)
    data = result.to_dict()
    assert data["generation"] is None and schema_errors(data) == []
    del data["generation"]  # a result written before --generate existed
    assert DiagnoseResult.from_dict(data).generation is None


def test_compare_reads_both_generations(tmp_path):
    # diagnose --compare of two --generate results: per metric A, B and B - A of the mean over the
    # common decoding steps, checked against each side's own saved per-step arrays
    runner = CliRunner()
    common = ["--probe", "embed-scale:1", "--samples", "2", "--length", "16"]
    files = {}
    for name, steps in (("softmax", 6), ("ssa", 4)):
        files[name] = tmp_path / f"{name}.json"
        args = ["diagnose", f"builtin:wikitext-{name}", *common, "--generate", str(steps), "--json",
                str(files[name])]  # fmt: skip
        assert runner.invoke(app, args).exit_code == 0
    out, page = tmp_path / "cmp.json", tmp_path / "cmp.html"
    run = runner.invoke(app, ["diagnose", "builtin:wikitext-softmax", *common, "--generate", "6",
                              "--compare", str(files["ssa"]), "--json", str(out), "--html", str(page)],
                        terminal_width=80, env={"COLUMNS": "80"})  # fmt: skip
    assert run.exit_code == 0, run.output
    assert "generation · first 4 greedy tokens · prompt 16" in run.output
    data = json.loads(out.read_text())
    section = data["generation"]
    assert section["steps"] == 4
    sides = [np.array(data[side]["generation"]["metrics"]["max_weight"], dtype=float)[:4] for side in "ab"]
    expected = [float(np.nanmean(values)) for values in sides]
    got = section["metrics"]["max_weight"]
    assert got["a"] == pytest.approx(expected[0], rel=1e-12)
    assert got["b"] == pytest.approx(expected[1], rel=1e-12)
    assert got["delta"] == pytest.approx(expected[1] - expected[0], rel=1e-9)
    html = page.read_text()
    assert "<h2>generation (KV cache)</h2>" in html and "first 4 greedy tokens" in html
    # one side without --generate: said, not hidden
    plain = tmp_path / "plain.json"
    saved = runner.invoke(app, ["diagnose", "builtin:wikitext-ssa", *common, "--json", str(plain)])
    assert saved.exit_code == 0
    run = runner.invoke(app, ["diagnose", "builtin:wikitext-softmax", *common, "--generate", "3",
                              "--compare", str(plain)], terminal_width=80)  # fmt: skip
    assert run.exit_code == 0 and "generation: only in A (run both with --generate)" in run.output
