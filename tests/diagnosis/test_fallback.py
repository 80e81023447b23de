"""Every family diagnose measures through its eager fallback (ssacli.testing.routes.FALLBACK_FAMILIES)
is checked here: diagnose's per-layer/per-head max weight and entropy equal values computed
independently from the model's own ``output_attentions=True`` weights on the same padded inputs.
Families off the registry that the fallback does not measure correctly are refused by diagnose and
listed with their reason (FALLBACK_UNCHECKED). A fallback family that a transformers release moves onto
the AttentionInterface fails here by name (the list is updated with the pin), unless it is known to
have moved (ON_THE_REGISTRY_FROM) or the installed release is not the one the audit was measured on
(a skip: the table is stale there)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import transformers
from packaging.version import Version

import ssacli
from ssacli.attention.interface import supports
from ssacli.diagnosis import routes
from ssacli.errors import UnsupportedModelError
from ssacli.testing import audit, tiny_models

# Fallback families that a release the package admits routes through the AttentionInterface: {family:
# the first such release}. There the registry route serves them (audited, docs/models.md); their fallback
# entry stays for the older admitted releases, where scripts/transformers_compat.sh checks it.
ON_THE_REGISTRY_FROM = {"falcon": "5.25.0"}
SEQS = [[5, 9, 17, 33, 8, 12, 40, 7, 21, 3], [11, 4, 60, 25, 9, 30, 14], [50, 6, 19, 27, 10, 8]]
TOL = 1e-6


def build(family: str):
    kind = tiny_models.families()[family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_models.build_tiny(family, kind)
    return model, tiny_models.model_kind(model, kind)


def padded(pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right padding, like diagnose's own batches."""
    width = max(map(len, SEQS))
    ids = torch.full((len(SEQS), width), pad_id)
    mask = torch.zeros(len(SEQS), width, dtype=torch.long)
    for row, seq in enumerate(SEQS):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return ids, mask


def eager_maps(model, kind: str, ids, mask) -> list[torch.Tensor]:
    """The model's own attention weights, in module order (seq2seq: encoder, then each decoder
    layer's self- and cross-attention)."""
    kwargs = dict(input_ids=ids, attention_mask=mask, output_attentions=True)
    if kind == "seq2seq":
        kwargs.update(decoder_input_ids=ids, decoder_attention_mask=mask)
    if kind in ("causal", "seq2seq"):
        kwargs["use_cache"] = False
    with torch.no_grad():
        out = model(**kwargs)
    if kind == "seq2seq":
        maps = list(out.encoder_attentions)
        for self_map, cross in zip(out.decoder_attentions, out.cross_attentions, strict=True):
            maps += [self_map, cross]
        return maps
    return list(out.attentions)


def reference(weights: torch.Tensor, valid: torch.Tensor) -> dict[str, np.ndarray]:
    """[head] means over counted rows (real queries that see ≥ 2 keys). Visible keys are read off the
    weights themselves: a masked key's softmax weight is exactly 0, a visible one's is not."""
    w = weights.double()
    n = (w > 0).sum(-1)
    mass = w.sum(-1)
    counted = (n >= 2) & (mass > 0) & valid[:, None, :]
    p = w / torch.where(counted, mass, 1.0)[..., None]
    entropy = -torch.special.xlogy(p, p).sum(-1) / torch.log(n.clamp_min(2).double())
    rows = counted.double().sum((0, 2))
    return {
        "max_weight": (torch.where(counted, p.amax(-1), 0.0).sum((0, 2)) / rows).numpy(),
        "entropy": (torch.where(counted, entropy, 0.0).sum((0, 2)) / rows).numpy(),
    }


@pytest.mark.parametrize("family", sorted(routes.FALLBACK_FAMILIES))
def test_fallback_metrics_equal_the_eager_weights(family):
    model, kind = build(family)
    if supports(model):
        installed = transformers.__version__
        since = ON_THE_REGISTRY_FROM.get(family)
        if since and Version(installed) >= Version(since):
            pytest.skip(
                f"{family} routes through the AttentionInterface from transformers {since} (installed "
                f"{installed}): the registry route serves it; its fallback is for older admitted releases"
            )
        stale = audit.stale_table()
        if stale:
            pytest.skip(f"{family} is on the registry here; {stale}")
        pytest.fail(
            f"{family} is on the registry now: drop it from FALLBACK_FAMILIES, or list it in "
            "ON_THE_REGISTRY_FROM while an older admitted release still needs its fallback"
        )
    result = ssacli.diagnose(model, ["embed-scale:1"], inputs=SEQS, batch_size=len(SEQS))
    assert result.route == "eager-fallback"
    probe = result.probe("embed-scale")
    # attention modules that never ran on token ids (vision or audio towers, unused cross-attention)
    # record no row; the others correspond, in order, to the eager weights
    rows = np.asarray(probe.rows)[0]
    live = rows.reshape(rows.shape[0], -1).sum(-1) > 0
    pad = getattr(model.config, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else 0
    ids, mask = padded(pad)
    maps = eager_maps(model, kind, ids, mask)
    assert live.sum() == len(maps) > 0, f"{family}: {live.sum()} layers measured, {len(maps)} eager maps"
    for layer, weights in zip(np.flatnonzero(live), maps, strict=True):
        ref = reference(weights, mask.bool())
        heads = weights.shape[1]
        assert np.isnan(probe.metrics["max_weight"][0, layer, heads:]).all()
        for metric in ("max_weight", "entropy"):
            np.testing.assert_allclose(
                probe.metrics[metric][0, layer, :heads], ref[metric], atol=TOL, err_msg=f"{family} {layer}"
            )


def test_unchecked_families_are_listed_with_a_reason_and_not_claimed():
    assert not routes.FALLBACK_FAMILIES & set(routes.FALLBACK_UNCHECKED)
    assert all(routes.FALLBACK_UNCHECKED.values())
    checked, refused = len(routes.FALLBACK_FAMILIES), len(routes.FALLBACK_UNCHECKED)
    print(f"\nfallback: {checked} families checked, {refused} refused:")
    for family, reason in sorted(routes.FALLBACK_UNCHECKED.items()):
        print(f"  {family}: {reason}")


@pytest.mark.parametrize("family", ["flaubert", "gemma3", "hy_v4", "ibert"])
def test_diagnose_refuses_what_its_fallback_gets_wrong(family):
    """A sample of the unchecked list (one per kind of failure): wrong weights, an unknown window,
    sparse keys, no weights; every one is refused by name with its reason."""
    model, _ = build(family)
    with pytest.raises(UnsupportedModelError, match=f"'{family}'.*not verified"):
        ssacli.diagnose(model, ["embed-scale:1"], inputs=SEQS)
