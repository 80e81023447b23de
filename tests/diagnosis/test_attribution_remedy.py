"""The remedy beside attribution (issue 52): a temperature T on a set's heads at the shifted level,
tempered as weights^(1/T) renormalized, checked against the definition (the model's own attention
re-implemented by hand with those heads' logits divided by T), and refused under logit-scale, which
T = α undoes exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.models.llama.modeling_llama import repeat_kv

from ssacli.diagnosis.attribution import attribute
from ssacli.errors import UsageError
from tests.diagnosis import test_attribution as planted

HEADS = [(0, 1), (1, 2)]
TEMPERATURES = (0.5, 1.0, 2.0)


def test_tempering_equals_a_temperature_on_the_heads_logits():
    result = attribute(planted.sharp_llama(), "embed-scale:1,8", inputs=planted.prompts(), heads=HEADS,
                       null=0, per_head=False, ceiling=False, remedy=TEMPERATURES, resamples=500)  # fmt: skip
    model = planted.sharp_llama()
    ids = torch.tensor(planted.prompts())
    state = {"temperature": 1.0}

    def by_hand(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = module.num_key_value_groups
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        logits = (query @ key.transpose(2, 3) * scaling).float()
        n = logits.shape[-1]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        chosen = [h for layer, h in HEADS if layer == module.layer_idx]
        logits[:, chosen] = logits[:, chosen] / state["temperature"]
        weights = logits.softmax(-1)
        return (weights.to(value.dtype) @ value).transpose(1, 2).contiguous(), weights

    AttentionInterface.register("test_by_hand_temper", by_hand)
    model.set_attn_implementation("test_by_hand_temper")
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: out * 8)  # embed-scale 8

    def losses() -> np.ndarray:
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none").mean(1).numpy()

    shifted = losses()
    np.testing.assert_allclose(result.loss_shifted, shifted, rtol=1e-5)
    doses = result.sets[0].remedy
    assert [dose["temperature"] for dose in doses] == list(TEMPERATURES)
    for dose in doses:
        state["temperature"] = dose["temperature"]
        np.testing.assert_allclose(dose["removed"], float((shifted - losses()).mean()), rtol=1e-4, atol=1e-6)
    assert abs(doses[1]["removed"]) < 1e-6  # T = 1 changes nothing
    assert max(abs(doses[0]["removed"]), abs(doses[2]["removed"])) > 1e-3  # the check means something
    assert any(line.lstrip().startswith("remedy, not attribution: T=") for line in result.lines())


@pytest.mark.parametrize(
    ("probe", "remedy", "message"),
    [("logit-scale:1,4", (4.0,), "undoes logit-scale exactly"), ("key-scale:1,8", (0.0,), "above 0")],
)
def test_a_remedy_that_cannot_mean_anything_is_refused(probe, remedy, message):
    with pytest.raises(UsageError, match=message):
        attribute(planted.sharp_llama(), probe, inputs=planted.prompts(), heads=HEADS, null=0, remedy=remedy)
