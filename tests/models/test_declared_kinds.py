"""A folder's kind read before torch (ssacli.models.kinds.declared_kind) is the kind its loaded model has.

The family part reads transformers' auto mappings from their source without importing them
(issue 54, item 2: a report of a Llama against a bare ``BertModel`` refused before the model stack);
these tests hold that reading to the imported mappings and to the configs transformers builds.
"""

from __future__ import annotations

import json

import pytest
from transformers import CONFIG_MAPPING, AutoModel, BertConfig, LlamaConfig
from transformers.models.auto import modeling_auto

from ssacli.models.kinds import (
    ModelKind,
    auto_mapping_names,
    declared_family_kind,
    declared_kind,
    family_kind,
    kind_of,
)


def test_the_mappings_read_from_source_are_the_imported_ones():
    tables = auto_mapping_names()
    assert tables is not None
    for name, table in tables.items():
        assert table == dict(getattr(modeling_auto, name)), name


def test_every_family_decided_before_torch_is_decided_so_after_loading():
    """Where the source decides a family, its config (as transformers builds it) is no encoder-decoder,
    so the loaded model's kind is family_kind's; families it leaves open are left to loading."""
    tables = auto_mapping_names()
    families = set().union(*(set(t) for t in tables.values()))
    decided = {f: declared_family_kind(f) for f in sorted(families)}
    decided = {f: kind for f, kind in decided.items() if kind is not None}
    assert {"bert", "llama", "gpt2", "roberta"} <= set(decided)
    for family, kind in decided.items():
        assert kind == family_kind(family), family
        try:
            config = CONFIG_MAPPING[family]()
        except Exception:  # a config that cannot be built without arguments: its class default
            config = CONFIG_MAPPING[family]
        assert not getattr(config, "is_encoder_decoder", False), family
    assert declared_family_kind("t5") is None and declared_family_kind("no-such-family") is None


@pytest.mark.parametrize(
    ("config", "kind"),
    [(BertConfig, ModelKind.ENCODER), (LlamaConfig, ModelKind.CAUSAL)],
    ids=["bert", "llama"],
)
def test_a_bare_base_model_folder_is_declared_as_it_loads(config, kind, tmp_path):
    tiny = config(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=32
    )
    model = AutoModel.from_config(tiny)  # BertModel, LlamaModel: no LM head
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [type(model).__name__]
    assert declared_kind(tmp_path) == kind_of(model) == kind
