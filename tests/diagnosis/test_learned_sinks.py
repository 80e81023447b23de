"""Diagnose reports the learned-sink mass of models with learned sinks (gpt-oss ``s_aux``): the weight
each real query row gives the sink key, 1 − Σ weights on real keys. The reference is the model's own
eager path (``output_attentions=True`` returns the weights over real keys only), per layer and head,
over valid (non-padded) query rows; the CLI on a saved folder and the API both report it. Models
without learned sinks get NaN (n/a) and no column."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import ssacli
from ssacli.cli import app
from ssacli.diagnosis.plan import TokenSource, pad_sequences

VOCAB = 128
LEVELS = (1.0, 4.0)  # embed-scale σ
SAMPLES, LENGTH, SEED = 3, 12, 0


def gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GptOssForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)  # random, non-zero: some heads park most mass there
    return model


def reference(model, batches, sigma: float) -> dict[str, np.ndarray]:
    """[layer, head] means over valid query rows, from the model's eager weights (real keys only):
    the learned sink 1 − Σw, and the max weight of the row renormalized over real keys."""
    sink = max_w = rows = shape_rows = 0
    for batch in batches:
        ids, mask = batch.input_ids, batch.attention_mask
        with torch.no_grad():
            embeds = model.get_input_embeddings()(ids) * sigma
            out = model(inputs_embeds=embeds, attention_mask=mask, output_attentions=True, use_cache=False)
        weights = torch.stack(out.attentions).double()  # [layer, b, h, q, k]
        mass = weights.sum(-1)
        valid = mask.bool()[None, :, None, :].expand_as(mass)  # real queries
        sink = sink + torch.where(valid, 1 - mass, 0.0).sum((1, 3))
        rows = rows + valid.double().sum((1, 3))
        # shape metrics: rows that see two keys or more (masked keys have weight exactly 0), renormalized
        counted = valid & ((weights > 0).sum(-1) >= 2)
        max_w = max_w + torch.where(counted, weights.amax(-1) / mass, 0.0).sum((1, 3))
        shape_rows = shape_rows + counted.double().sum((1, 3))
    return {"learned_sink": (sink / rows).numpy(), "max_weight": (max_w / shape_rows).numpy()}


def cli_inputs():
    """The inputs diagnose draws for a folder without a tokenizer (random ids, --seed)."""
    ids = TokenSource(None, text=None, random_ids=True, vocab_size=VOCAB, seed=SEED).sequences(
        SAMPLES, LENGTH
    )
    return ids


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss")
    model = gpt_oss()
    model.save_pretrained(folder)
    return folder, model


def test_cli_reports_the_learned_sink_of_a_saved_gpt_oss(saved):
    folder, model = saved
    out = folder.parent / "sink.json"
    probe = "embed-scale:" + ",".join(f"{s:g}" for s in LEVELS)
    args = ["diagnose", str(folder), "--probe", probe, "--samples", str(SAMPLES), "--length", str(LENGTH),
            "--seed", str(SEED), "--random", "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert "learned sink" in result.output  # the column of the per-probe table
    print(result.output)
    doc = json.loads(out.read_text())
    got = np.array(doc["probes"][0]["metrics"]["learned_sink"], dtype=float)  # [level, layer, head]
    batches = pad_sequences(cli_inputs(), 0, 8)
    for i, sigma in enumerate(LEVELS):
        ref = reference(model, batches, sigma)
        np.testing.assert_allclose(got[i], ref["learned_sink"], atol=1e-5, err_msg=f"σ={sigma}")
    assert (got > 1e-3).all() and np.nanmax(got) > 0.5  # visible, and some head parks most of its mass


def test_api_learned_sink_and_shape_metrics_match_the_eager_path():
    model = gpt_oss()
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (11, 7, 9, 4)]
    result = ssacli.diagnose(model, ["embed-scale:1,4"], inputs=seqs, batch_size=3)
    assert result.route == "ssacli"
    probe = result.probe("embed-scale")
    batches = pad_sequences(seqs, 0, 3)
    for i, sigma in enumerate(LEVELS):
        ref = reference(model, batches, sigma)
        np.testing.assert_allclose(probe.metrics["learned_sink"][i], ref["learned_sink"], atol=1e-5)
        # shape metrics read the real keys renormalized (rows of one key are not counted there)
        np.testing.assert_allclose(probe.metrics["max_weight"][i], ref["max_weight"], atol=1e-5)
    # row_mass is the real keys' share: 1 − learned sink, row by row, so on average too
    rows_mass = probe.metrics["row_mass"]
    assert np.all(np.isfinite(rows_mass)) and (rows_mass < 1 - 1e-3).all()


def test_models_without_learned_sinks_show_no_column():
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    config = AutoConfig.for_model("llama", vocab_size=VOCAB, num_key_value_heads=2, **sizes)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    result = ssacli.diagnose(model, ["embed-scale:1"], inputs=[[5, 6, 7, 8, 9]])
    assert np.isnan(result.probe("embed-scale").metrics["learned_sink"]).all()
    from ssacli.report.summary import table_columns

    assert "learned_sink" not in table_columns(result.probe("embed-scale"))
    assert "learned_sink" in table_columns(
        ssacli.diagnose(gpt_oss(), ["embed-scale:1"], inputs=[[5, 6, 7, 8, 9]]).probe("embed-scale")
    )
