"""Tiny models of every supported family, built from fixtures/families.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FAMILIES = {k: v for k, v in json.loads((FIXTURES / "families.json").read_text()).items() if k[0] != "_"}
VOCAB = 128
SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}

_AUTO = {"causal": AutoModelForCausalLM, "encoder": AutoModel, "seq2seq": AutoModelForSeq2SeqLM}


def build_model(family: str, attn_implementation: str = "eager", seed: int = 0, **overrides):
    """A tiny randomly initialized model of ``family`` in fp32, eval mode, no dropout."""
    spec = FAMILIES[family]
    kwargs = {"vocab_size": VOCAB, **SPECIAL, **spec["kwargs"], **overrides}
    config = AutoConfig.for_model(family, **kwargs)
    for name in ("dropout", "attention_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    torch.manual_seed(seed)
    model = _AUTO[spec["kind"]].from_config(config, attn_implementation=attn_implementation)
    return model.eval()


def clone(model):
    return copy.deepcopy(model)
