"""Attribution by attention-pattern patching (ssacli.diagnosis.attribution): the planted controls of
issue 52 and an independent recomputation of a patched forward.

The model is the tiny Llama of the family fixtures (2 layers × 4 heads, grouped-query: 2 K/V heads)
with its q/k projections sharpened, so that key-scale moves the weights, and its output head
sharpened, so that the loss notices."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.models.llama.modeling_llama import repeat_kv

from ssacli.attention.interface import apply_scorer
from ssacli.diagnosis.attribution import attribute
from ssacli.diagnosis.attribution_result import Attribution, SetAttribution
from ssacli.errors import UnsupportedModelError, UsageError
from ssacli.testing import tiny_models
from tests.helpers.models import build_model

HEAD = (1, 2)  # the head the controls plant
LEVEL = 8.0


def sharp_llama(live: tuple[int, int] | None = None, dead: tuple[int, int] | None = None):
    """The tiny Llama, sharpened; with ``live`` every other head's output projection is zeroed, with
    ``dead`` that head's alone."""
    model = build_model("llama")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            attention = layer.self_attn
            attention.q_proj.weight *= 8
            attention.k_proj.weight *= 8
            attention.o_proj.weight *= 5
            for head in range(model.config.num_attention_heads):
                if (live is not None and (index, head) != live) or (index, head) == dead:
                    attention.o_proj.weight[:, head * head_dim : (head + 1) * head_dim] = 0
        model.lm_head.weight *= 30
    return model


def prompts(n: int = 8, length: int = 16) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(3, 128, (n, length), generator=generator).tolist()


def given(model, heads, probe=f"key-scale:1,{LEVEL:g}", null=0):
    return attribute(model, probe, inputs=prompts(), heads=heads, null=null, per_head=False, resamples=500)


def test_a_head_whose_output_is_zeroed_has_exactly_zero_attribution():
    alive = given(sharp_llama(), [HEAD])
    dead = given(sharp_llama(dead=HEAD), [HEAD])
    assert alive.rise[HEAD[0]][HEAD[1]] > 0.1  # the head collapses under the shift
    assert np.abs(dead.damage).max() > 0.05  # there is damage to attribute
    assert np.abs(dead.ceiling.removed).max() > 0.05
    assert np.abs(alive.sets[0].removed).max() > 1e-3  # with its output, its pattern matters
    assert dead.sets[0].removed == [0.0] * len(dead.damage)


def test_the_one_head_that_carries_the_output_carries_all_the_damage():
    result = given(sharp_llama(live=HEAD), [HEAD], null=6)
    one, ceiling = result.sets[0], result.ceiling
    assert np.abs(result.damage).mean() > 0.05
    np.testing.assert_allclose(one.removed, result.damage, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one.removed, ceiling.removed, rtol=1e-5, atol=1e-6)
    # the null: one random head of layer 1 — the live one (all of it) or a dead one (nothing)
    for value in one.null:
        assert value == pytest.approx(one.mean, rel=1e-5) or abs(value) < 1e-6
    other = given(sharp_llama(live=HEAD), [(1, 0), (0, 2)])
    assert np.abs(other.sets[0].removed).max() < 1e-6


def test_the_unshifted_level_has_no_damage_to_attribute():
    model = sharp_llama()
    result = attribute(model, "key-scale:1", inputs=prompts(), k=2, null=1, per_head=False, resamples=500)
    assert result.level == result.reference_level == 1
    assert result.damage == [0.0] * 8
    for one in [*result.sets, result.ceiling]:
        assert one.removed == [0.0] * len(one.measured_on)
        assert one.share is None  # no damage clears its noise, so no share is claimed
    assert result.sets[0].measured_on == list(range(4, 8)) and result.sets[1].measured_on == list(range(4))


def test_a_scorer_that_ignores_the_logits_has_no_damage_to_attribute():
    # cosformer scores q and k directly: logit-scale cannot reach it, so nothing is damaged. (SSA
    # does respond to logit-scale, boundedly: on this model its damage is not 0, only different.)
    model = sharp_llama()
    apply_scorer(model, "cosformer")
    result = given(model, [HEAD], probe=f"logit-scale:1,{LEVEL:g}")
    assert result.damage == [0.0] * 8 and result.ceiling.removed == [0.0] * 8


def test_a_probe_inside_attention_is_carried_by_the_patterns_alone():
    # key-scale changes nothing but the weights, so restoring every head's removes all its damage;
    # embed-scale travels the residual stream too, so restoring the weights cannot remove it all
    keys = given(sharp_llama(), [HEAD])
    np.testing.assert_allclose(keys.ceiling.removed, keys.damage, rtol=1e-5, atol=1e-6)
    embeddings = given(sharp_llama(), [HEAD], probe="embed-scale:1,8")
    assert np.abs(np.subtract(embeddings.damage, embeddings.ceiling.removed)).max() > 1e-3


def test_a_patched_forward_matches_an_independent_recomputation():
    """The model's own attention, re-implemented by hand (logit-scale: every logit × LEVEL), with the
    unshifted weights that transformers' eager path returns put into the patched heads."""
    heads = [(0, 1), (1, 2), (1, 3)]
    result = given(sharp_llama(), heads, probe=f"logit-scale:1,{LEVEL:g}")
    model = sharp_llama()
    ids = torch.tensor(prompts())
    with torch.no_grad():
        unshifted = model(input_ids=ids, output_attentions=True)
        state = {"level": LEVEL, "patch": {}}

        def by_hand(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
            groups = module.num_key_value_groups
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
            logits = query @ key.transpose(2, 3) * scaling * state["level"]
            n = logits.shape[-1]
            logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            weights = logits.float().softmax(-1)
            chosen = [h for layer, h in state["patch"] if layer == module.layer_idx]
            weights[:, chosen] = unshifted.attentions[module.layer_idx][:, chosen]
            return (weights @ value).transpose(1, 2).contiguous(), weights

        AttentionInterface.register("test_by_hand", by_hand)
        model.set_attn_implementation("test_by_hand")

        def losses() -> np.ndarray:
            logits = model(input_ids=ids).logits
            losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
            return losses.mean(1).numpy()

        shifted = losses()
        state["patch"] = heads
        patched = losses()
        state["level"], state["patch"] = 1.0, []
        reference = losses()
    np.testing.assert_allclose(result.loss_reference, reference, rtol=1e-5)
    np.testing.assert_allclose(result.loss_shifted, shifted, rtol=1e-5)
    np.testing.assert_allclose(np.subtract(result.loss_shifted, result.sets[0].removed), patched, rtol=1e-5)
    assert np.abs(shifted - patched).max() > 1e-3  # the patch changed the loss: the check means something


def test_chosen_sets_are_measured_against_a_layer_matched_null():
    result = attribute(sharp_llama(), "key-scale:1,8", inputs=prompts(), k=2, null=2, resamples=500)
    payload = result.to_dict()
    assert len(payload["sets"]) == 2 and payload["ceiling"]["null"] == []
    assert json.loads(json.dumps(payload))["sets"][0]["reading"] == result.sets[0].reading
    for one in result.sets:
        assert len(one.heads) == 2 and len(one.null) == 2 and 0 <= one.percentile <= 100
        assert set(one.per_head) == {f"L{layer}H{head}" for layer, head in one.heads}
        assert not set(one.chosen_on) & set(one.measured_on)
    assert all(len(line) <= 80 for line in result.lines())


@pytest.mark.parametrize(
    ("probe", "options", "message"),
    [
        ("numeric:2,4", {}, "same tokens at every level"),
        ("length:1,2", {}, "needs text"),
        ("key-scale:2,8", {}, "unshifted level back"),
        ("key-scale:1,8", {"level": 4}, "not among"),
        ("key-scale:1,8", {"k": 0}, "k must be at least 1"),
        ("key-scale:1,8", {"k": 9}, "at most the model's 8 heads"),
        ("key-scale:1,8", {"heads": [(2, 0)]}, r"head \(2, 0\) is not in this model"),
        ("key-scale:1,8", {"null": -1}, "null must be"),
    ],
)
def test_refusals_name_the_problem(probe, options, message):
    with pytest.raises(UsageError, match=message):
        attribute(sharp_llama(), probe, inputs=prompts(), **options)


def test_length_patches_each_window_with_its_base_prompt():
    # Under length ×4 a long row is 4 consecutive base prompts. Every head given its base prompt's
    # pattern (within the window, nothing before it) makes each window compute as its base prompt did
    # (rotary positions act on q and k only), so the ceiling is the whole damage; one head is a part.
    result = attribute("builtin:wikitext-softmax", "length:1,4", samples=4, length=16, heads=[(0, 0)],
                       null=0, per_head=False, resamples=500)  # fmt: skip
    assert len(result.damage) == 4 and np.abs(result.damage).max() > 1e-3
    np.testing.assert_allclose(result.ceiling.removed, result.damage, rtol=1e-5, atol=1e-6)
    assert np.abs(np.subtract(result.sets[0].removed, result.damage)).max() > 1e-4


def test_models_it_cannot_patch_are_refused_in_one_line():
    with pytest.raises(UnsupportedModelError, match="causal LMs only, not encoder models"):
        attribute(build_model("bert"), "key-scale:1,8", inputs=prompts(4, 8), k=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback = tiny_models.build_tiny("gpt_neo", tiny_models.families()["gpt_neo"])
    with pytest.raises(UnsupportedModelError, match="runs on the eager fallback"):
        attribute(fallback, "key-scale:1,8", inputs=prompts(4, 8), k=1)


@pytest.mark.parametrize(
    ("interval", "percentile", "reading"),
    [
        ((0.01, 0.2), 97.0, "marks"),  # removes damage and beats >= 95 % of random sets
        ((-0.01, 0.2), 97.0, "undecided"),  # beats them, but its removed damage may be 0
        ((0.01, 0.2), 50.0, "does not mark"),  # inside the null's central 90 %
        ((0.01, 0.2), 95.0, "marks"),
        ((0.01, 0.2), 4.0, "undecided"),  # below the null: neither
        ((0.01, 0.2), None, None),  # no null: no reading
    ],
)
def test_a_set_is_read_against_its_null_as_the_plan_says(interval, percentile, reading):
    one = SetAttribution(
        heads=[HEAD], chosen_on=[0], measured_on=[1], removed=[0.1], mean=0.1, interval=interval, damage=0.2,
        damage_interval=None, share=None, null=[0.0] if percentile is not None else [], percentile=percentile,
    )  # fmt: skip
    assert one.reading == reading


@pytest.mark.parametrize(
    ("percentiles", "reading", "agreement"),
    [
        ((97.0, 98.0), "marks", "the halves agree"),
        ((50.0, 60.0), "does not mark", "the halves agree"),
        ((59.0, 97.0), "undecided", "the halves disagree"),  # SmolLM2 under key-scale:8
        ((97.0, None), None, None),  # one half without a null: no reading of the whole
    ],
)
def test_the_whole_reads_as_its_halves_only_where_they_agree(percentiles, reading, agreement):
    def half(percentile, chosen, measured):
        return SetAttribution(
            heads=[HEAD], chosen_on=chosen, measured_on=measured, removed=[0.1], mean=0.1,
            interval=(0.01, 0.2), damage=0.2, damage_interval=None, share=None,
            null=[0.0] if percentile is not None else [], percentile=percentile,
        )  # fmt: skip

    sets = [half(percentiles[0], [0], [1]), half(percentiles[1], [1], [0])]
    whole = Attribution(
        model="m", probe="key-scale", level=8.0, reference_level=1.0, k=1, layers=["l0"], heads=[1],
        loss_reference=[1.0, 1.0], loss_shifted=[1.2, 1.2], damage=[0.2, 0.2], damage_interval=None,
        rise=[[0.1]], sets=sets, ceiling=None, elapsed_s=0.0, settings={},
    )  # fmt: skip
    assert whole.reading == reading
    assert whole.to_dict()["reading"] == reading
    text = " ".join(line.strip() for line in whole.lines())  # wrapped at 80 columns
    said = "both halves: " in text and (agreement is None or agreement in text)
    assert said == (agreement is not None)


def test_per_prompt_collapse_is_diagnoses_and_the_association_its_rank_correlation():
    """The fresh collapse attribute keeps per prompt is the one diagnose measures on the same prompts
    (another code path: diagnose's statistics, not the patching recorder), and the association is
    Spearman's ρ of its change against the damage."""
    import ssacli
    from ssacli.stats import spearman

    model = sharp_llama()
    result = attribute(model, "key-scale:1,8", inputs=prompts(), heads=[HEAD], null=0, per_head=False,
                       ceiling=False, resamples=500)  # fmt: skip
    probe = ssacli.diagnose(model, ["key-scale:1,8"], inputs=prompts()).probe("key-scale")
    np.testing.assert_allclose(result.collapse_reference, probe.prompt_collapse[0], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(result.collapse_shifted, probe.prompt_collapse[1], rtol=1e-6, atol=1e-9)
    change = np.array(result.collapse_shifted) - np.array(result.collapse_reference)
    assert np.ptp(change) > 0, "precondition: prompts differ in collapse change"
    assert result.association["rho"] == pytest.approx(spearman(change, result.damage), rel=1e-12)
    assert result.association["prompts"] == len(prompts())
    back = type(result).from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.association == result.association and back.collapse_shifted == result.collapse_shifted
    assert any("Spearman ρ" in line for line in result.lines())
