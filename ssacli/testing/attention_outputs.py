"""How the all-family audit (ssacli.testing.audit) compares ssacli's path with a model's own eager
path: one forward's logits (:func:`run`, :func:`relative_difference`), and every attention module's
output fed the very inputs eager's module received (:func:`attention_difference`, :func:`compare`),
so that a difference born outside attention (rounding a mixture-of-experts router amplifies) can be
told from one in attention."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..models.kinds import ModelKind

TOLERANCE = 1e-5  # relative difference (max |ssacli - eager| / max |eager|) on valid positions


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
