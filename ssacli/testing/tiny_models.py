"""Any model family of the installed transformers, built tiny on the CPU from its own default config.

:func:`families` lists the families of transformers' causal-LM, masked-LM and seq2seq auto mappings;
:func:`tiny_config` shrinks a family's own default config (every size field small, a representative
subset of its layer types); :func:`build_tiny` builds the model from it. The all-family audit
(:mod:`ssacli.testing.audit`) and the eager-fallback tests build their models here.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..models.kinds import ModelKind

VOCAB = 128
WINDOW = 3  # sliding windows, shorter than the audit's sequences so sliding layers matter
BUILT_KINDS = (ModelKind.CAUSAL, ModelKind.MASKED, ModelKind.SEQ2SEQ)  # the heads the audit builds

_HIDDEN = {
    "hidden_size", "d_model", "n_embd", "embed_dim", "word_embed_proj_dim", "dim", "model_dim", "d_embed",
    "attention_hidden_size", "embedding_size", "d_latents",
}  # fmt: skip
_FFN = {
    "intermediate_size", "ffn_dim", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "hidden_dim", "n_inner",
    "moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
    "ffn_hidden_size", "intermediate_size_mlp", "d_inner", "dense_intermediate_size",
}  # fmt: skip
_HEADS = {
    "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
    "n_heads", "num_decoder_attention_heads", "encoder_num_attention_heads", "decoder_num_attention_heads",
}  # fmt: skip
_KV_HEADS = {"num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "n_kv_head"}
_LAYERS = {
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
    "num_decoder_layers", "num_encoder_layers", "encoder_num_hidden_layers", "decoder_num_hidden_layers",
}  # fmt: skip
_EXPERTS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"}
_SMALL = {  # other size fields and their tiny values
    "head_dim": 8, "d_kv": 8, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 8, "v_head_dim": 8, "qk_head_dim": 12, "num_experts_per_tok": 2, "moe_k": 2,
    "top_k": 2, "n_group": 1, "topk_group": 1, "mamba_dt_rank": 8, "time_step_rank": 8,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "mamba_n_heads": 4, "mamba_d_head": 8, "mamba_headdim": 8,
    "ssm_state_size": 8, "mamba_d_state": 8, "state_size": 8, "num_latents": 8, "rotary_dim": 4,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": VOCAB, "laurel_rank": 4,
    "first_k_dense_replace": 1, "num_nextn_predict_layers": 0, "index_head_dim": 8, "index_n_heads": 2,
    "index_topk": 4, "relative_attention_num_buckets": 8, "sliding_window": WINDOW,
    "attention_window": 4, "conv_dim": 8, "projection_dim": 16, "num_memory_tokens": 0,
    "num_kv_shared_layers": 0, "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
    "expert_layer_offset": 1, "num_filters": 4,
}  # fmt: skip
_AT_MOST = {"num_experts_per_tok", "moe_k", "top_k"}  # top-k: the _SMALL value at most (zaya takes 1 only)
_POSITIONS = {
    "max_position_embeddings", "n_positions", "max_source_positions", "max_target_positions", "n_ctx",
}  # fmt: skip


def families() -> dict[str, str]:
    """{model_type: kind} for every family of the causal-LM, masked-LM and seq2seq auto mappings
    (a family in several mappings is audited once, as the first of causal, seq2seq, masked)."""
    from transformers.models.auto import modeling_auto as auto

    found: dict[str, str] = {}
    for kind, mapping in (
        (ModelKind.CAUSAL, auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        (ModelKind.SEQ2SEQ, auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
        (ModelKind.MASKED, auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
    ):
        for family in mapping:
            found.setdefault(family, kind)
    return dict(sorted(found.items()))


def _pick_layers(types: list) -> list[int]:
    """Indices of a small subset of layers that keeps every distinct layer type, two layers at least."""
    chosen: list[int] = []
    seen: set = set()
    for i, kind in enumerate(types):
        key = repr(kind)
        if key not in seen:
            seen.add(key)
            chosen.append(i)
    for i in range(len(types)):
        if len(chosen) >= 2:
            break
        if i not in chosen:
            chosen.append(i)
    return sorted(chosen[:4])


def _shrink(values: dict[str, Any]) -> dict[str, Any]:
    """A config dict with every known size field made tiny (recursively into sub-configs)."""
    out = dict(values)
    layers = next((out[k] for k in _LAYERS if isinstance(out.get(k), int)), None)
    per_layer = None
    types = next((out[k] for k in ("layer_types", "block_types") if isinstance(out.get(k), list)), None)
    if types and isinstance(layers, int) and len(types) >= layers:
        per_layer = _pick_layers(types[:layers])
    elif isinstance(layers, int):
        per_layer = list(range(min(layers, 2)))
    heads = next((out[k] for k in _HEADS if isinstance(out.get(k), int)), None)
    for key, value in values.items():
        if isinstance(value, dict):
            out[key] = _shrink(value)
        elif isinstance(value, bool) or (value is None and key != "vocab_size"):
            continue
        elif key in _LAYERS and isinstance(value, int):
            out[key] = len(per_layer) if per_layer is not None and value == layers else min(value, 2)
        elif isinstance(value, list) and per_layer and len(value) == layers and key != "layer_types":
            out[key] = [value[i] for i in per_layer]
            if key in _FFN:
                out[key] = [64] * len(per_layer)
        elif key in ("layer_types", "block_types") and per_layer is not None:
            out[key] = [value[i] for i in per_layer]
        elif key == "depths" and isinstance(value, list) and all(isinstance(v, int) for v in value):
            out[key] = [1] * len(value)  # convolutional stages (audio tokenizers): one block each
        elif key in _HIDDEN and isinstance(value, int):
            out[key] = 32
        elif key in _FFN and isinstance(value, int):
            out[key] = 64
        elif key in _HEADS and isinstance(value, int):
            out[key] = 4
        elif key in _KV_HEADS and isinstance(value, int):
            out[key] = 1 if value == 1 or (heads and value == heads and False) else 2
        elif key in _EXPERTS and isinstance(value, int):
            out[key] = 4
        elif key in _SMALL and isinstance(value, int):
            out[key] = min(value, _SMALL[key]) if key in _AT_MOST else _SMALL[key]
        elif key == "vocab_size" and (isinstance(value, int) or value is None):
            out[key] = VOCAB
        elif key in _POSITIONS and isinstance(value, int) and value > 512:
            out[key] = 512
    if isinstance(values.get("qk_rope_head_dim"), int):  # multi-head latent attention
        if values.get("head_dim") == values["qk_rope_head_dim"]:
            out["head_dim"] = out["qk_rope_head_dim"]
        if "qk_head_dim" in values:
            out["qk_head_dim"] = out["qk_rope_head_dim"] + out.get("qk_nope_head_dim", 0)
    return out


def _special_ids(values: dict[str, Any], taken: dict[int, int]) -> dict[str, Any]:
    """Token ids at or above VOCAB moved to distinct ids at the top of the tiny vocabulary."""

    def remap(v: int) -> int:
        if v < VOCAB:
            return v
        if v not in taken:
            taken[v] = VOCAB - 1 - len(taken)
        return taken[v]

    out = dict(values)
    for key, value in values.items():
        if isinstance(value, dict):
            out[key] = _special_ids(value, taken)
        elif isinstance(key, str) and _is_token_field(key) and not isinstance(value, bool):
            if isinstance(value, int):
                out[key] = remap(value)
            elif isinstance(value, list) and all(isinstance(v, int) for v in value):
                out[key] = [remap(v) for v in value]
    return out


def _is_token_field(key: str) -> bool:
    return "token_id" in key or "token_index" in key or key.endswith("_tokens")


def tiny_config(family: str, kind: str = "causal"):
    """The family's own default config with every size field shrunk (2-4 layers keeping each layer
    type, width 32, 4 heads over 2 KV heads, vocabulary 128, windows of 3) and dropout off."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(family)
    values = _special_ids(_shrink(default.to_dict()), {})
    for name in ("model_type", "transformers_version", "architectures"):
        values.pop(name, None)
    config = type(default)(**values)
    for sub in [config, *(getattr(config, k) for k in getattr(config, "sub_configs", {}) or {})]:
        for name in (
            "dropout", "attention_dropout", "hidden_dropout", "hidden_dropout_prob", "activation_dropout",
            "attention_probs_dropout_prob", "attn_pdrop", "resid_pdrop", "embd_pdrop", "layerdrop",
            "encoder_layerdrop", "decoder_layerdrop", "classifier_dropout", "dropout_rate",
            "attention_dropout_prob",
        ):  # fmt: skip
            if sub is not None and isinstance(getattr(sub, name, None), float):
                setattr(sub, name, 0.0)
    if kind == ModelKind.CAUSAL and hasattr(config, "is_decoder"):
        config.is_decoder = True  # BERT-like families are causal LMs only as decoders
    return config


def build_tiny(
    family: str, kind: str, attn_implementation: str = "eager", seed: int = 0, dtype=torch.float32
):
    """A tiny randomly initialized model of ``family`` (eval mode, ``dtype``) for the audit's ``kind``;
    mixture-of-experts layers use transformers' eager experts (the grouped kernels are fp32 only)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    auto = {"causal": AutoModelForCausalLM, "masked": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}
    config = tiny_config(family, kind)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = auto[kind].from_config(
            config, attn_implementation=attn_implementation, experts_implementation="eager"
        )
    return model.to(dtype).eval()


def model_kind(model, kind: str) -> str:
    """``kind`` as the built model really is: a seq2seq-mapped family without an encoder-decoder
    config (speech and audio LMs over token ids) runs as a causal decoder."""
    if kind == ModelKind.SEQ2SEQ and not getattr(model.config, "is_encoder_decoder", False):
        return "causal"
    return kind
