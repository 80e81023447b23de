"""The all-family audit: every model family of the installed transformers, built tiny, is either exact
through ssacli or refused with a reason.

:func:`audit_family` builds one family tiny on the CPU (:mod:`ssacli.testing.tiny_models`) and returns
a :class:`FamilyResult`:

* ``exact``: :func:`~ssacli.attention.interface.supports` is True and ``apply_scorer(model, "softmax")``
  reproduces the model's own eager path on a padded batch (left padding for decoders, right for
  encoders) to a relative difference of at most :data:`TOLERANCE` on valid positions, and SSA keeps a
  causal family causal;
* ``refused``: ``supports`` is False or ``apply_scorer`` / the forward raises UnsupportedModelError,
  with its reason;
* ``different``: accepted but not exact (or not causal): a bug, which
  tests/contracts/test_families.py forbids;
* ``not-buildable``: the family cannot be built tiny or run on token ids alone on the CPU (reason).

tests/contracts/test_families.py runs the audit over every family and scripts/models_table.py writes
docs/models.md from it (a test checks the committed table matches).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..errors import UnsupportedModelError
from ..models.kinds import ModelKind
from .tiny_models import VOCAB, build_tiny, families, model_kind

__all__ = [
    "SEQ", "STATUSES", "TOLERANCE", "FamilyResult", "audit", "audit_family", "padded_batch",
    "relative_difference", "run", "summary",
]  # fmt: skip

TOLERANCE = 1e-5  # relative difference (max |ssacli - eager| / max |eager|) on valid positions
SEQ = 7  # the audit's sequence length; windows are shorter so sliding layers matter
STATUSES = ("exact", "refused", "different", "not-buildable")


@dataclass(frozen=True)
class FamilyResult:
    """One family's audit outcome (see the module docstring for the statuses)."""

    family: str
    kind: str
    status: str
    reason: str = ""
    difference: float | None = None  # relative difference of the softmax path (exact / different)


def padded_batch(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of SEQ tokens: one full, one padded by 2 (on the left for decoders, right otherwise)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB - 16, (2, SEQ), generator=gen)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    if kind == ModelKind.CAUSAL:
        mask[1, :2] = 0
    else:
        mask[1, -2:] = 0
    ids[mask == 0] = 0
    return ids, mask


def run(model, kind: str, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, valid positions) of one forward; seq2seq decodes 4 tokens from decoder_start."""
    with torch.no_grad():
        if kind == ModelKind.SEQ2SEQ:
            start = getattr(model.config, "decoder_start_token_id", None)
            if not isinstance(start, int):
                start = 1
            dec = ids[:, :4].clone()
            dec[:, 0] = start
            out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
            if tuple(out.logits.shape[:2]) != tuple(dec.shape):
                raise ValueError(f"logits of shape {tuple(out.logits.shape)} are not one row per token")
            return out.logits, torch.ones(dec.shape, dtype=torch.bool)
        out = model(input_ids=ids, attention_mask=mask)
        if tuple(out.logits.shape[:2]) != tuple(ids.shape):
            raise ValueError(f"logits of shape {tuple(out.logits.shape)} are not one row per token")
        return out.logits, mask.bool()


def relative_difference(ref: torch.Tensor, got: torch.Tensor, valid: torch.Tensor) -> float:
    """max |got - ref| / max |ref| over valid positions (inf where got is not finite)."""
    ref, got = ref[valid].double(), got[valid].double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def _causal_ok(model, kind: str) -> bool:
    """Whether changing the last two tokens leaves the earlier outputs of ``model`` unchanged."""
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB - 16, (1, SEQ), generator=gen)
    changed = ids.clone()
    changed[0, -2:] = (changed[0, -2:] + 1) % (VOCAB - 16) + 3
    mask = torch.ones_like(ids)
    a, _ = run(model, kind, ids, mask)
    b, _ = run(model, kind, changed, mask)
    return relative_difference(a[0, :-2], b[0, :-2], torch.ones(SEQ - 2, dtype=torch.bool)) <= TOLERANCE


def _reason(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".splitlines()[0]
    return text[:200]


def audit_family(family: str, kind: str) -> FamilyResult:
    """Build ``family`` tiny and classify it (see the module docstring).

    The comparison runs in fp32; a family found different there is compared again in float64, where
    rounding cannot flip a mixture-of-experts router (in fp32 a difference of 1e-7 in one attention
    output can send a token to another expert). Its verdict is the float64 one when it runs there.
    """
    result = _audit_in(family, kind, torch.float32)
    if result.status == "different":
        again = _audit_in(family, kind, torch.float64)
        if again.status != "not-buildable":
            return again
    return result


def _audit_in(family: str, kind: str, dtype: torch.dtype) -> FamilyResult:
    from ..attention.interface import apply_scorer, unsupported_reason

    try:
        model = build_tiny(family, kind, dtype=dtype)
        kind = model_kind(model, kind)
        ids, mask = padded_batch(kind)
        ref, valid = run(model, kind, ids, mask)
        causal = kind == ModelKind.CAUSAL and _causal_ok(model, kind)
    except Exception as err:  # noqa: BLE001 - whatever stops a tiny build is the reason it is listed
        return FamilyResult(family, kind, "not-buildable", _reason(err))
    reason = unsupported_reason(model)
    if reason is not None:
        return FamilyResult(family, kind, "refused", reason)
    try:
        ours = apply_scorer(copy.deepcopy(model), "softmax")
        got, _ = run(ours, kind, ids, mask)
    except UnsupportedModelError as err:
        return FamilyResult(family, kind, "refused", str(err))
    except Exception as err:  # noqa: BLE001 - accepted, then broken: as bad as different
        return FamilyResult(family, kind, "different", f"the softmax path raised {_reason(err)}")
    diff = relative_difference(ref, got, valid)
    if not diff <= TOLERANCE:
        return FamilyResult(family, kind, "different", f"softmax path differs from eager by {diff:.3g}", diff)
    if causal:  # the eager model is causal: SSA must keep it so
        try:
            # share=layer: the check is about masks; per-head parameters need attention over heads
            ssa = apply_scorer(copy.deepcopy(model), "ssa:share=layer")
            kept = _causal_ok(ssa, kind)
        except UnsupportedModelError as err:
            return FamilyResult(family, kind, "refused", str(err))
        except Exception as err:  # noqa: BLE001
            return FamilyResult(family, kind, "different", f"the ssa path raised {_reason(err)}", diff)
        if not kept:
            return FamilyResult(family, kind, "different", "scorer ssa breaks causality", diff)
    return FamilyResult(family, kind, "exact", "", diff)


def audit(selected: dict[str, str] | None = None) -> list[FamilyResult]:
    """:func:`audit_family` for every family (or the ``{family: kind}`` given), in name order."""
    chosen = families() if selected is None else selected
    return [audit_family(family, kind) for family, kind in sorted(chosen.items())]


def summary(results: list[FamilyResult]) -> str:
    """The one-line count: N built tiny → exact / refused / different / not buildable."""
    count = {s: sum(r.status == s for r in results) for s in STATUSES}
    built = len(results) - count["not-buildable"]
    return (
        f"{len(results)} families: {built} built tiny → {count['exact']} exact / {count['refused']} "
        f"refused / {count['different']} silently different; {count['not-buildable']} not buildable tiny"
    )
