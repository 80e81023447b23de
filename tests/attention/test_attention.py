"""The attention integration is exact: with scorer `softmax`, ssacli reproduces each family's own
eager path on padded batches and over KV-cache generation; masks reach the scorer intact."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, AutoConfig, AutoModel
from transformers.masking_utils import AttentionMaskInterface

import ssacli
from ssacli.attention.arguments import cache_argument, returned_cache
from ssacli.attention.forward import SCORER_ATTR
from ssacli.attention.interface import ATTENTION_NAME, register
from ssacli.attention.masks import visibility
from ssacli.errors import UnsupportedModelError
from tests.helpers.models import FAMILIES, VOCAB, build_model, clone

TOL = 1e-5
CAUSAL = [f for f, s in FAMILIES.items() if s["kind"] == "causal"]
GENERATIVE = [f for f, s in FAMILIES.items() if s["kind"] in ("causal", "seq2seq")]


def forward(model, ids, mask):
    kind = FAMILIES[model.config.model_type]["kind"]
    with torch.no_grad():
        if kind == "seq2seq":
            dec = ids[:, :4].clone()
            dec[:, 0] = model.config.decoder_start_token_id
            out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
            return out.logits, torch.ones(dec.shape, dtype=torch.bool)
        out = model(input_ids=ids, attention_mask=mask)
        values = out.logits if kind == "causal" else out.last_hidden_state
        return values, mask.bool()


def max_diff_on_valid(a, b, valid):
    return (a - b)[valid].abs().max().item()


def test_at_least_ten_families_are_covered():
    assert len(FAMILIES) >= 10
    assert set(FAMILIES) == set(ssacli.attention.interface.TESTED_FAMILIES)


@pytest.mark.parametrize("backend", ["eager", "auto"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_softmax_matches_eager_on_padded_batch(family, backend, padded_batch):
    """Both the scorer's own forward (eager) and the fused kernel (auto: SDPA) equal the family's
    eager path."""
    eager = build_model(family)
    ours = ssacli.apply_scorer(clone(eager), "softmax")
    assert ours.config._attn_implementation == ATTENTION_NAME
    ids, mask = padded_batch
    ref, valid = forward(eager, ids, mask)
    with ssacli.attention_backend(ours, backend):
        got, _ = forward(ours, ids, mask)
    diff = max_diff_on_valid(ref, got, valid)
    assert diff <= TOL, f"{family}: max |ssacli - eager| = {diff:.3g} on valid positions"


@pytest.mark.parametrize("family", GENERATIVE)
def test_softmax_matches_eager_over_kv_cache_generation(family, padded_batch):
    eager = build_model(family)
    ours = ssacli.apply_scorer(clone(eager), "softmax")
    ids, mask = padded_batch
    if FAMILIES[family]["kind"] == "causal":  # decoder-only generation wants left padding
        ids, mask = ids[:2], mask[:2]
    kwargs = dict(
        attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False, use_cache=True,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0,
    )  # fmt: skip
    with torch.no_grad():
        ref = eager.generate(ids, **kwargs)
        got = ours.generate(ids, **kwargs)
    assert len(ref.logits) == len(got.logits) == 3
    assert torch.equal(ref.sequences, got.sequences)
    diff = max((r - g).abs().max().item() for r, g in zip(ref.logits, got.logits))
    assert diff <= TOL, f"{family}: generate logits differ by {diff:.3g}"


def test_kv_cache_decoding_is_bottom_right_causal():
    """Token-by-token decoding with a cache equals one full forward pass (q_len < kv_len)."""
    model = ssacli.apply_scorer(build_model("llama"), "ssa")
    ids = torch.randint(3, VOCAB, (1, 6))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :3], use_cache=True)
        steps = [out.logits]
        cache = returned_cache(out)  # `cache` since transformers 5.24, `past_key_values` before
        for t in range(3, 6):
            out = model(ids[:, t : t + 1], use_cache=True, **cache_argument(model, cache))
            steps.append(out.logits)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= TOL


@pytest.mark.parametrize("family", CAUSAL)
def test_non_softmax_scorer_keeps_causality(family):
    """Changing a later token must not change earlier outputs, whatever the scorer."""
    model = ssacli.apply_scorer(build_model(family), "ssa")
    ids = torch.randint(3, VOCAB, (1, 7))
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % VOCAB
    with torch.no_grad():
        a = model(ids).logits[0, :5]
        b = model(changed).logits[0, :5]
    assert torch.allclose(a, b, atol=TOL, rtol=0)


def test_mask_registration_is_load_bearing(padded_batch, monkeypatch):
    """Without ssacli's AttentionMaskInterface entry, transformers passes attention_mask=None:
    padding (and causality) silently disappear. The exactness check must catch that."""
    eager = build_model("llama")
    ours = ssacli.apply_scorer(clone(eager), "softmax")
    ids, mask = padded_batch
    ref, valid = forward(eager, ids, mask)
    assert max_diff_on_valid(ref, forward(ours, ids, mask)[0], valid) <= TOL
    # What transformers does without an entry: it passes attention_mask=None. Stand in for the missing
    # entry with a mask function that returns None, through the public registry only.
    AttentionMaskInterface.register(ATTENTION_NAME, lambda *args, **kwargs: None)
    try:
        broken = max_diff_on_valid(ref, forward(ours, ids, mask)[0], valid)
    finally:
        register()
    assert broken > 1e-3, "dropping the mask registration went unnoticed"


def test_mask_function_reaches_the_scorer(padded_batch, monkeypatch):
    """The scorer sees a boolean mask with each row's true number of visible keys."""
    seen = []
    model = ssacli.apply_scorer(build_model("llama"), "softmax")
    for _, module in ssacli.attention_modules(model):
        scorer = getattr(module, SCORER_ATTR)
        original = scorer.forward

        def spy(scores, mask=None, _orig=original, **kw):
            seen.append(mask)
            return _orig(scores, mask, **kw)

        monkeypatch.setattr(scorer, "forward", spy)
    ids, mask = padded_batch
    with torch.no_grad(), ssacli.attention_backend(model, "eager"):
        model(input_ids=ids, attention_mask=mask)
    assert len(seen) == 2 and all(m is not None and m.dtype == torch.bool for m in seen)
    counts = seen[0][:, 0].sum(-1)  # [b, q]: visible keys per query
    # row 1 is left-padded by 2: query 2 (the first real token) sees exactly itself
    assert counts[1, 2].item() == 1 and counts[1, :2].sum().item() == 0
    assert counts[0].tolist() == list(range(1, 8))


def test_scorer_parameters_live_in_the_model():
    model = ssacli.apply_scorer(build_model("llama"), "ssa:share=head")
    keys = [k for k in model.state_dict() if SCORER_ATTR in k]
    assert len(keys) == 2 * 2  # b and n for each of 2 layers
    assert all(model.state_dict()[k].shape == (4,) for k in keys)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad and SCORER_ATTR in n}
    assert trainable == set(keys)
    scorers = list(ssacli.scorers_of(model).values())
    assert scorers[0] is not scorers[1]
    assert model.config.ssacli_scorer == "ssa:share=head"


def test_scorer_parameters_get_gradients():
    model = ssacli.apply_scorer(build_model("gpt2"), "ssa")
    ids = torch.randint(3, VOCAB, (2, 6))
    model(ids, labels=ids).loss.backward()
    for scorer in ssacli.scorers_of(model).values():
        assert scorer.b_raw.grad is not None and scorer.b_raw.grad.abs().sum() > 0
        assert scorer.n_raw.grad is not None and scorer.n_raw.grad.abs().sum() > 0


def test_restore_returns_to_the_original_implementation(padded_batch):
    eager = build_model("qwen2")
    ids, mask = padded_batch
    ref, valid = forward(eager, ids, mask)
    model = ssacli.apply_scorer(clone(eager), "ssa")
    assert max_diff_on_valid(ref, forward(model, ids, mask)[0], valid) > 1e-4  # ssa really differs
    ssacli.restore(model)
    assert model.config._attn_implementation == "eager"
    assert not any(SCORER_ATTR in k for k in model.state_dict())
    assert max_diff_on_valid(ref, forward(model, ids, mask)[0], valid) == 0.0


def test_bad_spec_leaves_the_model_untouched():
    model = build_model("llama")
    with pytest.raises(ssacli.SpecError):
        ssacli.apply_scorer(model, "ssa:bogus=1")
    assert model.config._attn_implementation == "eager"
    assert not ssacli.scorers_of(model)


@pytest.mark.parametrize(
    "family,kwargs",
    [
        ("bloom", dict(hidden_size=32, n_layer=2, n_head=4)),
        ("gpt_neo", dict(hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global"], 2]])),
        ("deberta-v2", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=8)),
    ],
)
def test_unsupported_families_are_refused_clearly(family, kwargs):
    model = AutoModel.from_config(AutoConfig.for_model(family, vocab_size=VOCAB, **kwargs))
    assert not ssacli.supports(model)
    with pytest.raises(UnsupportedModelError) as err:
        ssacli.apply_scorer(model, "ssa")
    message = str(err.value)
    assert model.config.model_type in message and "docs/models.md" in message and "llama" in message


@pytest.mark.parametrize("family", list(FAMILIES))
def test_supported_families_are_supported(family):
    assert ssacli.supports(build_model(family))


def test_missing_mask_on_a_causal_module_is_bottom_right_causal():
    """A None mask on a causal module (a caller bypassing mask creation) still gets causality,
    aligned bottom-right as a KV cache needs (SDPA's is_causal would be top-left)."""
    module = torch.nn.Module()
    module.is_causal = True
    logits = torch.randn(1, 2, 3, 5)
    _, visible = visibility(logits, None, module, {})
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert visible.shape == (1, 1, 3, 5) and torch.equal(visible[0, 0], expected)  # 4-D like HF masks
    module.is_causal = False
    assert visibility(logits, None, module, {})[1] is None
    assert visibility(logits[..., :1, :], None, module, {"is_causal": True})[1] is None  # one query sees all


def test_float_additive_mask_keeps_its_bias_and_its_holes():
    module = torch.nn.Module()
    logits = torch.zeros(1, 1, 2, 3)
    fill = torch.finfo(torch.float32).min
    mask = torch.tensor([[[[0.5, fill, -1.0], [fill, fill, 2.0]]]])
    biased, visible = visibility(logits, mask, module, {})
    assert torch.equal(visible, mask > fill / 2)
    assert torch.equal(biased[visible], mask[visible]) and torch.equal(biased[~visible], logits[~visible])


def test_registered_names_are_plain():
    assert "/" not in ATTENTION_NAME
    ssacli.attention.interface.register()
    assert ATTENTION_NAME in AttentionInterface()
    assert ATTENTION_NAME in AttentionMaskInterface()


def test_spec_survives_save_pretrained(tmp_path):
    model = ssacli.apply_scorer(build_model("gpt2"), "ssa:init=faithful,m=256")
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.ssacli_scorer == "ssa:init=faithful,m=256"


def test_output_attentions_returns_the_scorer_weights(padded_batch):
    """Weights collected by transformers are the scorer's: exact zeros where the mask says so."""
    model = ssacli.apply_scorer(build_model("llama"), "ssa")
    ids, mask = padded_batch
    with torch.no_grad():
        attentions = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    assert len(attentions) == 2
    weights = attentions[0]  # [b, h, q, k]
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert torch.all(weights[:, :, future] == 0)
    assert torch.all(weights[1, :, :2] == 0)  # padded queries: zero rows, not uniform ones
    assert torch.all(weights[1, :, :, :2] == 0)  # nobody attends to padding
    valid_rows = weights[1, :, 2:].sum(-1)
    assert torch.allclose(valid_rows, torch.ones_like(valid_rows), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_stay_finite_and_keep_fp32_scorer_parameters(dtype, padded_batch):
    model = ssacli.apply_scorer(build_model("mistral").to(dtype), "ssa")
    ids, mask = padded_batch
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert out.attentions[0].dtype == dtype
    assert torch.isfinite(out.logits[mask.bool()]).all()
    assert all(p.dtype == torch.float32 for s in ssacli.scorers_of(model).values() for p in s.parameters())
