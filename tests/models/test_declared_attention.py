"""What a folder's config.json declares of its attention (ssacli.models.declared_attention) is a
bound of what loading finds, or nothing: a head refused before the model stack is never one the
model has. Held against the models transformers builds: a sample of families on every run (a plain
decoder, one whose config keeps the counts under its own names, hybrid stacks, an encoder-decoder
family built as a decoder, a second stack, heads per layer), every causal family with
SSACLI_FULL_AUDIT=1 (ssacli.testing.audit_record.FULL_ENV; 23 s for 200 families at nice 19)."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from ssacli.attention.interface import attention_modules, num_heads
from ssacli.models.builtins import BUILTIN_DIR
from ssacli.models.declared_attention import config_attribute_map, declared_attention
from ssacli.testing import audit_record, tiny_models

# family: whether its config declares a bound (False: it must declare none)
SAMPLE = {
    "llama": True, "gpt2": True, "jamba": True, "qwen3_next": True, "zamba2": True, "qwen2": True,
    "bart": False, "hrm_text": False, "laguna": False,
}  # fmt: skip


def _causal_families() -> list[str]:
    if os.environ.get(audit_record.FULL_ENV, "") in ("", "0"):
        return list(SAMPLE)
    return [family for family, kind in tiny_models.families().items() if kind == "causal"]


@pytest.mark.parametrize("family", _causal_families())
def test_a_declared_bound_holds_every_attention_module_the_family_builds(family, tmp_path):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = tiny_models.build_tiny(family, "causal")
    except Exception as err:  # noqa: BLE001 (the audit's not-buildable families)
        pytest.skip(f"{family} does not build tiny: {type(err).__name__}")
    model.config.save_pretrained(tmp_path)
    declared = declared_attention(tmp_path)
    if family in SAMPLE:
        assert (declared is not None) == SAMPLE[family], declared
    if declared is None:
        return
    layers = list(attention_modules(model))
    assert len(layers) <= declared[0], (len(layers), declared)
    assert all(num_heads(module, model) <= declared[1] for _, module in layers), declared


def test_the_bundled_models_declare_their_layers_and_heads():
    assert declared_attention(BUILTIN_DIR / "wikitext-softmax") == (4, 4)
    assert declared_attention(BUILTIN_DIR / "wikitext-ssa") == (4, 4)  # its config is guarded
    assert declared_attention(BUILTIN_DIR / "every-softmax") == (3, 4)  # n_layer, n_head: GPT-2's names


def test_a_family_keeps_its_counts_under_the_names_its_config_class_maps():
    assert config_attribute_map("gpt2")["num_hidden_layers"] == "n_layer"
    assert config_attribute_map("llama") == {}
    assert config_attribute_map("no-such-family") is None


LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 2}


@pytest.mark.parametrize(
    "extra",
    [
        {"auto_map": {"AutoConfig": "mine.Config"}},  # the checkpoint's own code
        {"add_cross_attention": True},  # a second attention in each layer
        {"is_encoder_decoder": True},
        {"text_config": {"model_type": "llama", "num_hidden_layers": 40}},  # a tower of its own
        {"num_attention_heads": [4, 8]},  # heads per layer
        {"num_layers_per_stack": 2},  # another count of layers
        {"num_hidden_layers": True},
        {"model_type": "no-such-family"},
    ],
    ids=lambda extra: next(iter(extra)),
)
def test_a_config_that_cannot_bound_its_attention_declares_nothing(extra, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **extra}))
    assert declared_attention(tmp_path) is None


def test_a_plain_config_declares_its_counts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "max_window_layers": 28}))  # an index
    assert declared_attention(tmp_path) == (4, 2)
