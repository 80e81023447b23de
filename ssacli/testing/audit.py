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

import contextlib
import copy
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from ..errors import UnsupportedModelError
from ..models.kinds import ModelKind
from .tiny_models import VOCAB, build_tiny, families, model_kind

__all__ = [
    "AMPLIFIED", "SEQ", "STATUSES", "STRICT_ENV", "TOLERANCE", "Comparison", "FamilyResult",
    "attention_difference", "audit", "audit_family", "compare", "padded_batch", "relative_difference",
    "run", "stale_table", "summary",
]  # fmt: skip

TOLERANCE = 1e-5  # relative difference (max |ssacli - eager| / max |eager|) on valid positions
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


# ---- the attention outputs, layer by layer ------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` measured: relative differences of ssacli's softmax path from eager's."""

    logits: float  # the logits on valid positions
    attention: float  # the worst attention module's output, fed eager's inputs (attention_difference)
    outside: float | None  # the logits with eager's attention outputs in ssacli's model (None: not measured)


def _attention_names(ours) -> list[str]:
    from ..attention.forward import SCORER_ATTR

    return [name for name, module in ours.named_modules() if hasattr(module, SCORER_ATTR)]


def _output(out):
    """The attention output of an attention module's return value (a tensor or (output, weights, ...))."""
    return out if isinstance(out, torch.Tensor) else out[0]


def _floating(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _kept(value):
    return value.detach().clone() if _floating(value) else value


@contextlib.contextmanager
def _hooks(model, names: list[str], pre=None, post=None) -> Iterator[None]:
    """Forward (pre-)hooks on the named modules: ``pre(name, call, module, args, kwargs)`` and
    ``post(name, call, output)``, ``call`` counting the module's calls within the block."""
    modules = dict(model.named_modules())
    calls: dict[str, int] = {}
    handles = []

    def before(name):
        def hook(module, args, kwargs):
            calls[name] = calls.get(name, -1) + 1
            return pre(name, calls[name], module, args, kwargs) if pre else None

        return hook

    def after(name):
        def hook(module, args, kwargs, out):
            return post(name, calls[name], out) if post else None

        return hook

    try:
        for name in names:
            handles.append(modules[name].register_forward_pre_hook(before(name), with_kwargs=True))
            handles.append(modules[name].register_forward_hook(after(name), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _eager_calls(model, names: list[str], kind: str, ids, mask) -> dict[str, list]:
    """{name: [[args, kwargs, output], ...]}: each named module's calls in one eager forward."""
    calls: dict[str, list] = {}

    def pre(name, call, module, args, kwargs):
        kept = tuple(_kept(a) for a in args), {k: _kept(v) for k, v in kwargs.items()}
        calls.setdefault(name, []).append([*kept, None])

    def post(name, call, out):
        calls[name][call][2] = _output(out).detach().clone()

    with _hooks(model, names, pre, post):
        run(model, kind, ids, mask)
    return calls


def _fed(module, args, kwargs, eager_args, eager_kwargs):
    """``args`` and ``kwargs`` with each floating-point tensor replaced by eager's in the same place (same
    shape): hidden states, cross-attention states, position biases. Masks are not replaced: each path
    keeps its own (ssacli's boolean mask, eager's additive one), which is part of what is compared."""
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        names = []

    def take(name, ours, theirs):
        fits = _floating(ours) and _floating(theirs) and ours.shape == theirs.shape
        return theirs if fits and "mask" not in name else ours

    fed_args = tuple(
        take(names[i] if i < len(names) else "", a, eager_args[i] if i < len(eager_args) else None)
        for i, a in enumerate(args)
    )
    return fed_args, {k: take(k, v, eager_kwargs.get(k)) for k, v in kwargs.items()}


def _difference(ref: torch.Tensor, got: torch.Tensor, mask: torch.Tensor) -> float:
    """relative_difference of two attention outputs: on valid positions where they are [batch, seq, ...]
    like ``mask`` (a padded query's output is no one's business), else everywhere."""
    if got.shape != ref.shape:
        return float("inf")
    if ref.dim() >= 2 and tuple(ref.shape[:2]) == tuple(mask.shape):
        return relative_difference(ref, got, mask.bool())
    return relative_difference(ref.reshape(1, -1), got.reshape(1, -1), torch.ones(1, dtype=torch.bool))


def attention_difference(model, ours, kind: str, ids, mask, calls: dict | None = None) -> float:
    """The largest relative difference between an attention module's output in ``ours`` (``model`` with
    ssacli applied) and in ``model`` (eager), each module of ``ours`` fed the inputs eager's got: the
    attention function compared layer by layer, whatever earlier layers or the rest of the network do
    to rounding (inf where a module's calls or output shapes do not match)."""
    names = _attention_names(ours)
    calls = _eager_calls(model, names, kind, ids, mask) if calls is None else calls
    got: dict[str, list] = {}

    def pre(name, call, module, args, kwargs):
        if call < len(calls.get(name, ())):
            eager_args, eager_kwargs, _ = calls[name][call]
            return _fed(module, args, kwargs, eager_args, eager_kwargs)
        return None

    def post(name, call, out):
        got.setdefault(name, []).append(_output(out).detach())

    with _hooks(ours, names, pre, post):
        run(ours, kind, ids, mask)
    worst = 0.0
    for name, eager in calls.items():
        mine = got.get(name, [])
        if len(mine) != len(eager):
            return float("inf")
        for (_, _, ref), out in zip(eager, mine, strict=True):
            difference = _difference(ref, out, mask)
            if not difference <= worst:
                worst = difference
    return worst


def _outside_difference(ours, kind: str, ids, mask, calls: dict, ref, valid) -> float:
    """The relative difference of ``ours``' logits from eager's ``ref`` when every attention module of
    ``ours`` returns eager's output: zero unless something outside attention differs (a mask read
    outside attention, say)."""

    def post(name, call, out):
        if call >= len(calls.get(name, ())):
            return None
        eager = calls[name][call][2]
        return eager if isinstance(out, torch.Tensor) else (eager, *out[1:])

    with _hooks(ours, _attention_names(ours), None, post):
        got, _ = run(ours, kind, ids, mask)
    return relative_difference(ref, got, valid)


def compare(model, ours, kind: str, ids, mask, reference=None) -> Comparison:
    """ssacli's softmax path (``ours``, ``model`` with ``apply_scorer(..., "softmax")``) against ``model``'s
    eager path on one batch: the logits, every attention output on the same inputs, and (where only
    the logits differ) the logits with eager's attention outputs in ``ours``. ``reference``: eager's
    ``run`` on the batch, when the caller has it."""
    ref, valid = run(model, kind, ids, mask) if reference is None else reference
    got, _ = run(ours, kind, ids, mask)
    logits = relative_difference(ref, got, valid)
    calls = _eager_calls(model, _attention_names(ours), kind, ids, mask)
    attention = attention_difference(model, ours, kind, ids, mask, calls)
    outside = None
    if not logits <= TOLERANCE and attention <= TOLERANCE:
        outside = _outside_difference(ours, kind, ids, mask, calls, ref, valid)
    return Comparison(logits, attention, outside)


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
