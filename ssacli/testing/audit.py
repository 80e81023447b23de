"""The all-family audit: every model family of the installed transformers, built tiny, is either exact
through ssacli or refused with a reason.

:func:`audit_family` builds one family tiny on the CPU (:mod:`ssacli.testing.tiny_models`) and returns
a :class:`FamilyResult`:

* ``exact``: :func:`~ssacli.attention.interface.supports` is True, ``apply_scorer(model, "softmax")``
  reproduces the model's own eager path on a padded batch (left padding for decoders, right for
  encoders) to a relative difference of at most :data:`TOLERANCE` on valid positions, every attention
  module's output is within :data:`TOLERANCE` of eager's on the same inputs
  (:func:`attention_difference`), and SSA keeps a causal family causal. A family whose logits differ
  beyond the tolerance in float32 and in float64 (or that cannot run in float64) is still exact when
  its attention outputs are and eager's attention outputs give eager's logits through ssacli's model:
  the difference is rounding amplified outside attention (e.g. a mixture-of-experts router's top-k flip),
  and the row says so (:data:`AMPLIFIED`);
* ``refused``: ``supports`` is False or ``apply_scorer`` / the forward raises UnsupportedModelError,
  with its reason;
* ``different``: accepted but not exact (or not causal): a bug, which
  tests/contracts/test_families.py forbids;
* ``not-buildable``: the family cannot be built tiny or run on token ids alone on the CPU (reason).

tests/contracts/test_families.py runs the audit over every family and scripts/models_table.py writes
docs/models.md from it (a test checks the committed table matches). The table is measured on one
transformers release, :data:`ssacli.attention.audited.AUDITED_ON`; :func:`stale_table` says when the
installed release is another.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, replace

import torch

from ..errors import UnsupportedModelError
from ..models.kinds import ModelKind
from .attention_outputs import (
    TOLERANCE,
    Comparison,
    attention_difference,
    compare,
    relative_difference,
    run,
)
from .tiny_models import VOCAB, build_tiny, families, model_kind

__all__ = [
    "AMPLIFIED", "SEQ", "STATUSES", "STRICT_ENV", "TOLERANCE", "Comparison", "FamilyResult",
    "attention_difference", "audit", "audit_family", "compare", "padded_batch", "relative_difference",
    "run", "stale_table", "summary",
]  # fmt: skip

SEQ = 7  # the audit's sequence length; windows are shorter so sliding layers matter
STATUSES = ("exact", "refused", "different", "not-buildable")
AMPLIFIED = (
    "exact attention: every attention output within 1e-5 of eager's on the same inputs, and eager's "
    "attention outputs give eager's logits through ssacli's model; the logits differ beyond 1e-5 in "
    "float32 (float64 does not settle it) only by rounding amplified outside attention, e.g. a "
    "mixture-of-experts router's top-k flip"
)  # the reason of an exact family whose logits alone differ (see the module docstring)
STRICT_ENV = "SSACLI_STRICT_AUDIT"  # set to 1: a stale table fails the drift tests instead of skipping them


@dataclass(frozen=True)
class FamilyResult:
    """One family's audit outcome (see the module docstring for the statuses)."""

    family: str
    kind: str
    status: str
    reason: str = ""
    difference: float | None = None  # relative difference of the softmax path's logits (exact / different)
    # the largest relative difference of one attention module's output from eager's, fed eager's inputs
    attention: float | None = None
    # the logits' relative difference with eager's attention outputs put into ssacli's model (measured
    # when the logits differ and the attention outputs do not): what differs outside attention
    outside: float | None = None


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


# ---- the verdict -------------------------------------------------------------------------------------


def _amplified(result: FamilyResult) -> bool:
    """Whether only the logits of ``result`` differ: its attention outputs are exact and eager's attention
    outputs give eager's logits through ssacli's model (measured, and within the tolerance)."""
    return (
        result.status == "different" and result.attention is not None and result.attention <= TOLERANCE
        and result.outside is not None and result.outside <= TOLERANCE
    )  # fmt: skip


def audit_family(family: str, kind: str) -> FamilyResult:
    """Build ``family`` tiny and classify it (see the module docstring).

    The comparison runs in fp32; a family found different there is compared again in float64, where
    rounding cannot flip a mixture-of-experts router (in fp32 a difference of 1e-7 in one attention
    output can send a token to another expert). Its verdict is the float64 one when it runs there,
    unless float64 does not make it exact and float32 showed that only the logits differ
    (:data:`AMPLIFIED`): some families do not run in float64 as they do in float32 (zaya keeps its
    residual stream in float32, and its convolution carries eager's NaN padded rows into valid ones).
    """
    result = _audit_in(family, kind, torch.float32)
    if result.status != "different":
        return result
    again = _audit_in(family, kind, torch.float64)
    if again.status == "exact":
        return again
    if _amplified(result):
        return replace(result, status="exact", reason=AMPLIFIED)
    return result if again.status == "not-buildable" else again


def _audit_in(family: str, kind: str, dtype: torch.dtype) -> FamilyResult:
    from ..attention.interface import apply_scorer, unsupported_reason

    try:
        model = build_tiny(family, kind, dtype=dtype)
        kind = model_kind(model, kind)
        ids, mask = padded_batch(kind)
        reference = run(model, kind, ids, mask)
        causal = kind == ModelKind.CAUSAL and _causal_ok(model, kind)
    except Exception as err:  # noqa: BLE001 - whatever stops a tiny build is the reason it is listed
        return FamilyResult(family, kind, "not-buildable", _reason(err))
    reason = unsupported_reason(model)
    if reason is not None:
        return FamilyResult(family, kind, "refused", reason)
    try:
        ours = apply_scorer(copy.deepcopy(model), "softmax")
        found = compare(model, ours, kind, ids, mask, reference)
    except UnsupportedModelError as err:
        return FamilyResult(family, kind, "refused", str(err))
    except Exception as err:  # noqa: BLE001 - accepted, then broken: as bad as different
        return FamilyResult(family, kind, "different", f"the softmax path raised {_reason(err)}")
    diff, attention = found.logits, found.attention
    if not attention <= TOLERANCE:
        why = f"an attention output differs from eager's by {attention:.3g} on the same inputs"
        return FamilyResult(family, kind, "different", why, diff, attention)
    if found.outside is not None and not found.outside <= TOLERANCE:
        why = (
            f"softmax path differs from eager by {diff:.3g}, and by {found.outside:.3g} with eager's "
            "attention outputs: something outside attention differs"
        )
        return FamilyResult(family, kind, "different", why, diff, attention, found.outside)
    if causal:  # the eager model is causal: SSA must keep it so
        try:
            # share=layer: the check is about masks; per-head parameters need attention over heads
            ssa = apply_scorer(copy.deepcopy(model), "ssa:share=layer")
            kept = _causal_ok(ssa, kind)
        except UnsupportedModelError as err:
            return FamilyResult(family, kind, "refused", str(err))
        except Exception as err:  # noqa: BLE001
            why = f"the ssa path raised {_reason(err)}"
            return FamilyResult(family, kind, "different", why, diff, attention)
        if not kept:
            return FamilyResult(family, kind, "different", "scorer ssa breaks causality", diff, attention)
    if not diff <= TOLERANCE:  # only the logits differ: audit_family decides (float64, or AMPLIFIED)
        why = f"softmax path differs from eager by {diff:.3g}"
        return FamilyResult(family, kind, "different", why, diff, attention, found.outside)
    return FamilyResult(family, kind, "exact", "", diff, attention)


def audit(selected: dict[str, str] | None = None) -> list[FamilyResult]:
    """:func:`audit_family` for every family (or the ``{family: kind}`` given), in name order."""
    chosen = families() if selected is None else selected
    return [audit_family(family, kind) for family, kind in sorted(chosen.items())]


def stale_table() -> str | None:
    """Why docs/models.md and the audited set do not describe the installed transformers (they were
    measured on another release, :data:`~ssacli.attention.audited.AUDITED_ON`), or None when they do,
    or when ``SSACLI_STRICT_AUDIT=1`` asks the drift tests to compare them all the same."""
    import transformers

    from ..attention.audited import AUDITED_ON

    installed = transformers.__version__
    if installed == AUDITED_ON or os.environ.get(STRICT_ENV, "") not in ("", "0"):
        return None
    return (
        f"docs/models.md was measured on transformers {AUDITED_ON}; installed {installed}: the table is "
        f"stale here, run `python scripts/models_table.py` to measure this release ({STRICT_ENV}=1 "
        "fails instead of skipping)"
    )


def summary(results: list[FamilyResult]) -> str:
    """The one-line count: N built tiny → exact / refused / different / not buildable."""
    count = {s: sum(r.status == s for r in results) for s in STATUSES}
    built = len(results) - count["not-buildable"]
    return (
        f"{len(results)} families: {built} built tiny → {count['exact']} exact / {count['refused']} "
        f"refused / {count['different']} silently different; {count['not-buildable']} not buildable tiny"
    )
