"""The one place ssacli touches transformers' attention.

ssacli registers one attention function and one mask function, both under the name ``"ssacli"``:

* ``AttentionInterface``: :func:`~ssacli.attention.forward.ssacli_attention_forward` computes the
  model's logits exactly as its eager path does (scaling, Gemma-2 softcap before the mask, T5
  position bias, learned sinks, un-repeated GQA keys) and hands them to the scorer attached to that
  attention module. Every keyword argument a model passes is in
  :data:`~ssacli.attention.arguments.ARGUMENTS` (understood) or makes the call raise
  :class:`~ssacli.errors.UnsupportedModelError` naming it and the family: none is ignored.
* ``AttentionMaskInterface``: :func:`~ssacli.attention.masks.ssacli_mask` builds the boolean mask
  (True = visible). Without it transformers would pass ``attention_mask=None`` and a causal model
  would silently lose causality and padding
  (tests/attention/test_attention.py::test_mask_registration_is_load_bearing).

:func:`apply_scorer` attaches one scorer instance per attention module as the submodule
``ssacli_scorer`` (so ``state_dict()`` and optimizers see its parameters) and switches the model's
implementation with ``set_attn_implementation``; :func:`restore` undoes both, and :func:`reattach`
undoes a temporary re-scoring of a model that already had scorers. Nothing in
transformers is monkey-patched.

The attention function itself, and the one eager attention it runs, are :mod:`.forward`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ..errors import SpecError, UnsupportedModelError, UsageError
from ..kernels.routing import BACKENDS
from ..scorers import Scorer, make_scorer
from .arguments import ARGUMENTS, REFUSED_ARGUMENTS, family_name, passed_arguments
from .audited import AUDITED_FAMILIES
from .backend import BACKEND_ATTR
from .forward import SCORER_ATTR, ssacli_attention_forward
from .masks import ssacli_mask

ATTENTION_NAME = "ssacli"
ORIGINAL_ATTR = "_ssacli_original_attn_implementation"
CONFIG_SPEC_ATTR = "ssacli_scorer"  # survives save_pretrained, unlike _attn_implementation

# Families with an exactness test against the model's own eager path (tests/attention/test_attention.py).
TESTED_FAMILIES = (
    "llama", "mistral", "qwen2", "gemma2", "phi3", "gpt2", "gpt_neox", "opt",
    "bert", "roberta", "distilbert", "bart", "t5",
)  # fmt: skip


# ---- registration ---------------------------------------------------------------------------------


def register(replace: bool = False) -> None:
    """Register the attention and the mask function under ATTENTION_NAME (idempotent), except over
    the forwarders that ``import ssacli`` registers (ssacli.transformers_hook) unless ``replace``:
    those import :mod:`ssacli.transformers` on their first call, so that plain transformers' models
    find their saved scorers, and replacing them here would skip that (:mod:`ssacli.transformers`
    replaces them with these functions)."""
    for interface, function in (
        (AttentionInterface, ssacli_attention_forward),
        (AttentionMaskInterface, ssacli_mask),
    ):
        current = interface().get(ATTENTION_NAME)
        if replace or getattr(current, "__module__", None) != FORWARDERS_MODULE:
            interface.register(ATTENTION_NAME, function)


FORWARDERS_MODULE = "ssacli.transformers_hook"


# ---- finding attention modules --------------------------------------------------------------------


@cache
def _routes_through_interface(cls: type) -> bool:
    """True if the class's forward dispatches through transformers' AttentionInterface."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source


def attention_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) for every attention module that ssacli can route."""
    for name, module in model.named_modules():
        if _routes_through_interface(type(module)):
            yield name, module


def execution_device(model: nn.Module, name: str = "") -> torch.device | None:
    """Where submodule ``name`` of ``model`` computes: the execution device of the nearest
    accelerate hook on it or above it (a model loaded with a device map: offloaded weights sit on
    'meta' and are brought in per forward), else the device of its first parameter that is not on
    'meta'; None when it has none. The hook is found as transformers' own save_pretrained finds it
    for offloaded weights (``_hf_hook``, innermost first)."""
    parts = name.split(".") if name else []
    for depth in range(len(parts), -1, -1):
        hook = getattr(model.get_submodule(".".join(parts[:depth])), "_hf_hook", None)
        for one in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):  # SequentialHook
            device = getattr(one, "execution_device", None)
            if device is not None:
                return torch.device(device)
    for param in model.get_submodule(name).parameters():
        if param.device.type != "meta":
            return param.device
    return None


def named_attention(module: nn.Module) -> bool:
    """Whether ``module``'s class is named ``*Attention*``: the one place ssacli finds attention by a
    name, for modules off the registry (which have no seam to be found by).

    It stays a name on purpose. Over the 222 families the installed transformers builds tiny, the
    structural alternative (a module holding q/k/v projections, or a torch MultiheadAttention) makes
    the same accept/refuse decision for every family, but names another module in 28 refusals
    (docs/models.md is those reasons); it still tells projections by their attribute names (and
    counting DeBERTa's fused ``in_proj`` would refuse jamba, lfm3 and nemotron_h, whose mixers hold
    one); it would let xLSTM checkpoints load; and it would change the eager fallback's layers (the
    layer axis of results) for olmo_hybrid (linear-attention layers) and phi4_multimodal (an audio
    relative-attention bias)."""
    return "Attention" in type(module).__name__


def _unrouted_attention(model: nn.Module) -> list[str]:
    """Names of attention-looking modules that neither route nor contain a module that does."""
    found = []
    for name, module in model.named_modules():
        if not named_attention(module) or _routes_through_interface(type(module)):
            continue
        if not any(_routes_through_interface(type(m)) for m in module.modules()):
            found.append(name)
    return found


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model``'s scorer cannot be swapped exactly (a sentence naming the family and what it
    would take), or None when :func:`apply_scorer` can: every attention module routes through the
    AttentionInterface and passes only arguments in :data:`ARGUMENTS` (tests/contracts/test_families.py checks
    this answer against the model's own eager path for every family of the installed transformers).
    """
    family = family_name(model)
    can_set = getattr(model, "_can_set_attn_implementation", None)
    routed = list(attention_modules(model))
    unrouted = _unrouted_attention(model)
    if can_set is None or not can_set() or not routed or unrouted:
        where = f" ({type(model.get_submodule(unrouted[0])).__name__})" if unrouted else ""
        return (
            f"model family '{family}' computes attention in its own code{where}, not through "
            "transformers' AttentionInterface, so ssacli cannot swap its scorer; it would take that "
            "family's attention ported to the AttentionInterface (upstream), or an explicit ssacli "
            "integration with an exactness test. Exact families (e.g. llama, mistral, gpt2, bert, t5): "
            "docs/models.md"
        )
    for _, module in routed:
        for name in sorted(passed_arguments(type(module))):
            if name in ARGUMENTS:
                continue
            what = REFUSED_ARGUMENTS.get(name, "an attention argument ssacli does not understand")
            return (
                f"model family '{family}' passes '{name}' to its attention function ({what}); ssacli "
                "would ignore it, so it refuses instead. It would take that argument's effect on the "
                "logits or the mask in ssacli.attention.interface (docs/models.md)"
            )
    return None


def unaudited_reason(family: str) -> str | None:
    """Why a model of ``family`` (its attention module's ``model_type``) is not covered by the
    all-family audit, or None when it is (:data:`~ssacli.attention.audited.AUDITED_FAMILIES`, the one
    list, generated with docs/models.md). Every other family that :func:`supports` accepts is accepted
    on structure alone: every output marks it unaudited, and ``--strict`` refuses it."""
    if family in AUDITED_FAMILIES:
        return None
    return (
        f"family '{family}' is not among the families the all-family audit found exact "
        "(docs/models.md): accepted on structure alone, its exactness is untested"
    )


def supports(model: nn.Module) -> bool:
    """Whether every attention layer of ``model`` can be scored by ssacli exactly (see
    :func:`unsupported_reason`)."""
    return unsupported_reason(model) is None


def _check_supported(model: nn.Module) -> None:
    reason = unsupported_reason(model)
    if reason is not None:
        raise UnsupportedModelError(reason)


def num_heads(module: nn.Module, model: nn.Module) -> int:
    """Heads of one attention module: its own attribute, else its or the model's config (per-head
    scorer parameters and diagnose's per-head arrays are this wide)."""
    for attr in ("num_heads", "num_attention_heads", "n_heads", "n_head"):
        value = getattr(module, attr, None)
        if isinstance(value, int):
            return value
    for config in (getattr(module, "config", None), getattr(model, "config", None)):
        value = getattr(config, "num_attention_heads", None)
        if isinstance(value, int):
            return value
    raise UnsupportedModelError(
        f"cannot tell the number of heads of {type(module).__name__}; per-head scorer parameters "
        "need it (use share=layer, or report this model family)"
    )


# ---- the public switch ----------------------------------------------------------------------------


def apply_scorer(model: nn.Module, spec: str, *, parameters_follow: bool = False) -> nn.Module:
    """Score every attention layer of ``model`` with its own instance of scorer ``spec``.

    Parameters of the scorers become submodules (``<attention module>.ssacli_scorer``), so they are
    in ``model.state_dict()`` and ``model.parameters()``. Applying again replaces the scorers.
    Returns the model (changed in place).

    A spec whose start is measured on the model (``ssa:init=faithful`` with m=auto,
    :attr:`~ssacli.scorers.Scorer.needs_calibration`) is refused with a SpecError naming what
    calibrates it (:func:`ssacli.convert`, which takes a model in memory too), unless
    ``parameters_follow``: the caller sets the scorers' parameters next (a checkpoint's saved values,
    or m=auto's own calibration), so the placeholder start is never used.
    """
    _check_supported(model)
    # Build every scorer first, so a bad spec leaves the model untouched.
    scorers = [make_scorer(spec, num_heads=num_heads(m, model)) for _, m in attention_modules(model)]
    if scorers and scorers[0].needs_calibration and not parameters_follow:
        raise SpecError(
            f"scorer '{spec}': m=auto chooses m per layer from this model's own attention logits, which "
            "attaching a scorer does not measure; use ssacli.convert(model, spec) (or `ssacli convert`), "
            f"which calibrates m and reports the fidelity, or give m, e.g. {spec},m=128"
        )
    register()
    modules = list(attention_modules(model))
    for (name, module), scorer in zip(modules, scorers, strict=True):
        device = execution_device(model, name)  # with a device map, where accelerate runs the layer
        if device is not None:
            scorer.to(device=device)
        setattr(module, SCORER_ATTR, scorer)
    if not hasattr(model, ORIGINAL_ATTR):
        setattr(model, ORIGINAL_ATTR, model.config._attn_implementation)
    model.set_attn_implementation(ATTENTION_NAME)
    setattr(model.config, CONFIG_SPEC_ATTR, scorers[0].spec)
    return model


@contextmanager
def attention_backend(model: nn.Module, name: str) -> Iterator[str]:
    """Within this block, ``model``'s ssacli attention runs on backend ``name`` (set on each of its
    attention modules, as the fact ssacli.kernels.routing.choose_backend decides each call on; the
    modules' earlier backends come back after the block).

    * ``auto`` (the default): the scorer's fused kernel (ssacli.kernels.fused: SDPA for softmax, the
      native, Triton or flex SSA kernels) whenever nothing needs the weight matrix: not under
      ``observing`` (diagnose), not with ``output_attentions``, no Gemma-2 softcap or T5 position bias,
      a boolean mask. The eager scorer otherwise. ``SSACLI_BACKEND`` may name another backend.
    * ``eager``: always the scorer's own ``forward`` (the reference the fused kernels are tested on).
    * ``fused``: the fused kernel, and a UsageError naming the reason where there is none.
    * a path of ssacli.kernels.routing.PATHS: that path for every SSA call (a ValueError where it
      cannot run), the eager scorer where the weights are needed.
    """
    if name not in BACKENDS:
        raise UsageError(f"the attention backend takes {', '.join(BACKENDS)}, got {name!r}")
    modules = [module for _, module in attention_modules(model)]
    before = [module.__dict__.get(BACKEND_ATTR) for module in modules]
    for module in modules:
        setattr(module, BACKEND_ATTR, name)
    try:
        yield name
    finally:
        for module, earlier in zip(modules, before, strict=True):
            if earlier is None:
                delattr(module, BACKEND_ATTR)
            else:
                setattr(module, BACKEND_ATTR, earlier)


def restore(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_scorer`: drop the scorers and go back to the original implementation."""
    original = getattr(model, ORIGINAL_ATTR, None)
    if original is None and getattr(model.config, "_attn_implementation", None) == ATTENTION_NAME:
        original = "eager"  # built as 'ssacli' by plain transformers from a converted folder
    if original is None:
        return model
    for _, module in attention_modules(model):
        if hasattr(module, SCORER_ATTR):
            delattr(module, SCORER_ATTR)
    model.set_attn_implementation(original)
    if hasattr(model, ORIGINAL_ATTR):
        delattr(model, ORIGINAL_ATTR)
    if hasattr(model.config, CONFIG_SPEC_ATTR):
        delattr(model.config, CONFIG_SPEC_ATTR)
    return model


def reattach(model: nn.Module, scorers: dict[str, Scorer], spec: str | None) -> nn.Module:
    """Undo a temporary :func:`apply_scorer`: put back what :func:`scorers_of` returned before it
    (``scorers``; empty for a model that had none, which is :func:`restore`) and the config's spec
    before it (``spec``; None for none). The old scorer objects themselves go back, not copies, so
    a caller holding them (an optimizer, a converted model's saved parameters) still holds the model's."""
    if not scorers:
        restore(model)
    else:
        modules = dict(attention_modules(model))
        for name, scorer in scorers.items():
            setattr(modules[name], SCORER_ATTR, scorer)
    if spec is not None:
        setattr(model.config, CONFIG_SPEC_ATTR, spec)
    elif hasattr(model.config, CONFIG_SPEC_ATTR):
        delattr(model.config, CONFIG_SPEC_ATTR)
    return model


def scorers_of(model: nn.Module) -> dict[str, Scorer]:
    """The scorer attached to each attention module, by module name."""
    return {
        name: getattr(module, SCORER_ATTR)
        for name, module in attention_modules(model)
        if hasattr(module, SCORER_ATTR)
    }
