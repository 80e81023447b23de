"""The one place ssacli touches transformers' attention.

ssacli registers one attention function and one mask function, both under the name ``"ssacli"``:

* ``AttentionInterface``: :func:`ssacli_attention_forward` computes the model's logits exactly as its
  eager path does (scaling, Gemma-2 softcap before the mask, T5 position bias, un-repeated GQA
  keys) and hands them to the scorer attached to that attention module.
* ``AttentionMaskInterface``: :func:`ssacli_mask` builds the boolean mask (True = visible). Without
  it transformers would pass ``attention_mask=None`` and a causal model would silently lose
  causality and padding (tests/test_attention.py::test_mask_registration_is_load_bearing).

:func:`apply_scorer` attaches one scorer instance per attention module as the submodule
``ssacli_scorer`` (so ``state_dict()`` and optimizers see its parameters) and switches the model's
implementation with ``set_attn_implementation``; :func:`restore` undoes both. Nothing in
transformers is monkey-patched.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Protocol

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..errors import UnsupportedModelError, UsageError
from ..scorers import Scorer, make_scorer

ATTENTION_NAME = "ssacli"
SCORER_ATTR = "ssacli_scorer"
ORIGINAL_ATTR = "_ssacli_original_attn_implementation"
CONFIG_SPEC_ATTR = "ssacli_scorer"  # survives save_pretrained, unlike _attn_implementation

# Families with an exactness test against the model's own eager path (tests/test_attention.py).
TESTED_FAMILIES = (
    "llama", "mistral", "qwen2", "gemma2", "phi3", "gpt2", "gpt_neox", "opt",
    "bert", "roberta", "distilbert", "bart", "t5",
)  # fmt: skip


# ---- the registered functions ---------------------------------------------------------------------


def ssacli_mask(*args, **kwargs) -> torch.Tensor | None:
    """transformers' boolean sdpa mask (True = visible).

    A plain causal mask (no padding, no window, q_len == k_len or 1) comes back as None, as for
    sdpa: the attention function then knows it is causal from the module, and neither the fused
    kernel nor the eager scorer needs an [L, L] tensor for it. Every other mask (padding, sliding
    windows, cache offsets, bidirectional) is materialized, so the scorer sees it exactly.
    """
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def ssacli_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """AttentionInterface function: query [b, h, q, d], key/value [b, h_kv, k, d] (not repeated)."""
    scorer = getattr(module, SCORER_ATTR, None)
    if scorer is None:
        raise RuntimeError(
            f"{type(module).__name__} has no ssacli scorer: use ssacli.apply_scorer(model, spec) "
            "instead of setting attn_implementation='ssacli' by hand"
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    observer = _OBSERVER.get()
    if observer is None:
        # Before repeating K/V: the fused kernels handle grouped-query attention themselves.
        output = _fused_output(module, scorer, query, key, value, attention_mask, scaling, dropout, kwargs)
        if output is not None:
            return output.transpose(1, 2).contiguous(), None
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each K/V head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if observer is not None:
        return _observed_attention(
            module, scorer, observer, query, key, value, attention_mask, scaling, kwargs
        )
    logits = _logits(query, key, scaling, kwargs, slice(None))
    logits, visible = _apply_mask(logits, attention_mask, module, kwargs.get("is_causal"))
    weights = scorer(logits, visible, query=query, key=key)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights.to(value.dtype), value).transpose(1, 2).contiguous()
    return output, weights


def _logits(
    query: torch.Tensor, key: torch.Tensor, scaling: float, kwargs: dict, rows: slice
) -> torch.Tensor:
    """Scaled q·k logits of query rows ``rows``, as the model's eager path computes them."""
    logits = torch.matmul(query[:, :, rows], key.transpose(-1, -2)) * scaling
    softcap = kwargs.get("softcap")
    if softcap is not None:  # Gemma-2: cap first, then mask, as its eager path does
        logits = torch.tanh(logits / softcap) * softcap
    position_bias = kwargs.get("position_bias")
    if position_bias is not None:  # T5 relative position bias, [b|1, h, q|1, k]
        if position_bias.shape[-2] == query.shape[-2]:
            position_bias = position_bias[:, :, rows]
        logits = logits + position_bias
    return logits


def _apply_mask(
    logits: torch.Tensor,
    mask: torch.Tensor | None,
    module: nn.Module,
    is_causal: bool | None,
    rows: slice = slice(None),
    q_total: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Boolean visibility (True = visible) for the scorer, from whatever mask the model passed.

    ``rows`` selects a block of query rows out of ``q_total`` (the observed, blocked path).
    """
    k_len = logits.shape[-1]
    q_total = logits.shape[-2] if q_total is None else q_total
    if mask is None:
        if not _is_causal(module, is_causal) or q_total == 1:
            return logits, None
        # Bottom-right aligned: with a KV cache the last query sits at the last key. [1, 1, q, k]
        # like the masks transformers builds, so observers can read it the same way.
        return logits, _causal_rows(rows, q_total, k_len, logits.device)[None, None]
    if mask.dim() == 4:
        mask = mask[..., :k_len]
        if mask.shape[-2] == q_total:
            mask = mask[..., rows, :]
    if mask.dtype == torch.bool:
        return logits, mask
    # A float additive mask (a user's custom 4D mask): keep any real bias it carries, and read the
    # large negative fill as "masked".
    visible = mask > torch.finfo(mask.dtype).min / 2
    return logits + torch.where(visible, mask, 0).to(logits.dtype), visible


def _is_causal(module: nn.Module, is_causal: bool | None) -> bool:
    """Causality when the model passed no mask: its ``is_causal`` argument, else the module's."""
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))


def _causal_rows(rows: slice, q_total: int, k_len: int, device: torch.device) -> torch.Tensor:
    """[q_rows, k] causal visibility, bottom-right aligned, for the query rows in ``rows``."""
    positions = torch.arange(k_len - q_total, k_len, device=device)[rows]
    return torch.arange(k_len, device=device).unsqueeze(0) <= positions.unsqueeze(1)


# ---- the fused path -------------------------------------------------------------------------------

BACKENDS = ("auto", "eager", "fused")
_BACKEND: ContextVar[str] = ContextVar("ssacli_attention_backend", default="auto")


@contextmanager
def attention_backend(name: str) -> Iterator[str]:
    """Within this block, ssacli attention runs on backend ``name``.

    * ``auto`` (the default): the scorer's fused kernel (ssacli.kernels.fused: SDPA for softmax, the blocked
      or flex SSA kernel) whenever nothing needs the weight matrix: not under ``observing`` (diagnose),
      not with ``output_attentions``, no Gemma-2 softcap or T5 position bias, a boolean mask. The eager
      scorer otherwise.
    * ``eager``: always the scorer's own ``forward`` (the reference the fused kernels are tested on).
    * ``fused``: the fused kernel, and a UsageError naming the reason where there is none.
    """
    check_backend(name)
    token = _BACKEND.set(name)
    try:
        yield name
    finally:
        _BACKEND.reset(token)


def check_backend(name: str) -> None:
    """UsageError unless ``name`` is an attention backend (the CLI's --attention values)."""
    if name not in BACKENDS:
        raise UsageError(f"--attention takes {', '.join(BACKENDS)}, got {name!r}")


def _weights_requested() -> bool:
    """Whether transformers is collecting attention weights in this forward (output_attentions)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without output capturing: stay on the exact path
        return True
    collected = _active_collector.get()
    return bool(collected) and any("attentions" in key for key in collected)


def _eager_reason(scorer: Scorer, mask: torch.Tensor | None, kwargs: dict) -> str | None:
    """Why this call must compute the weight matrix, or None if a fused kernel may run."""
    if _weights_requested():
        return "the attention weights were requested (output_attentions)"
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return "the model adds a softcap or a position bias to the logits"
    if mask is not None and mask.dtype != torch.bool:
        return "the model passed a float attention mask"
    if type(scorer).fused is Scorer.fused:
        return f"scorer '{scorer.name}' has no fused kernel"
    return None


def _fused_output(module, scorer, query, key, value, mask, scaling, dropout, kwargs):
    """The fused kernel's output [b, h, q, d], or None where this call takes the eager path."""
    backend = _BACKEND.get()
    if backend == "eager":
        return None
    reason = _eager_reason(scorer, mask, kwargs)
    if reason is None:
        causal = mask is None and _is_causal(module, kwargs.get("is_causal"))
        if mask is not None:
            mask = mask[..., : key.shape[-2]]
        output = scorer.fused(
            query, key, value, scale=scaling, causal=causal, mask=mask,
            dropout=dropout if module.training else 0.0,
        )  # fmt: skip
        if output is not None:
            return output
        reason = f"scorer '{scorer.name}' has no fused kernel for this call"
    if backend == "fused":
        raise UsageError(f"fused attention is not possible here: {reason}; use the auto or eager backend")
    return None


# ---- observing attention (diagnose) ---------------------------------------------------------------


class Observer(Protocol):
    """What diagnose plugs into the attention call (ssacli.diagnosis implements it)."""

    block_size: int  # query rows scored at a time

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        """The probe's change to the logits [b, h, q_rows, k] (logit-scale, dominant-key)."""
        ...

    def record(
        self,
        module: nn.Module,
        weights: torch.Tensor,
        visible: torch.Tensor | None,
        query_positions: torch.Tensor,
    ) -> None:
        """Reduce one block of weights [b, h, q_rows, k] (key indices of the rows given)."""
        ...


_OBSERVER: ContextVar[Observer | None] = ContextVar("ssacli_observer", default=None)


@contextmanager
def observing(observer: Observer) -> Iterator[Observer]:
    """Within this block, every ssacli attention call streams its weights to ``observer`` in query
    blocks and returns no weight map (so no [b, h, q, k] tensor outlives the call)."""
    token = _OBSERVER.set(observer)
    try:
        yield observer
    finally:
        _OBSERVER.reset(token)


def _observed_attention(module, scorer, observer, query, key, value, mask, scaling, kwargs):
    """The same attention, one block of query rows at a time: extra memory O(block × k)."""
    q_total, k_len = query.shape[-2], key.shape[-2]
    block = max(1, int(observer.block_size))
    positions = torch.arange(k_len - q_total, k_len, device=query.device)
    outputs = []
    for start in range(0, q_total, block):
        rows = slice(start, min(start + block, q_total))
        logits = observer.transform(_logits(query, key, scaling, kwargs, rows), module)
        logits, visible = _apply_mask(logits, mask, module, kwargs.get("is_causal"), rows, q_total)
        extra = {"query_positions": positions[rows]} if scorer.uses_qk else {}
        weights = scorer(logits, visible, query=query[:, :, rows], key=key, **extra)
        observer.record(module, weights, visible, positions[rows])
        outputs.append(torch.matmul(weights.to(value.dtype), value))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the attention and the mask function under ATTENTION_NAME (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, ssacli_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, ssacli_mask)


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


def _unrouted_attention(model: nn.Module) -> list[str]:
    """Names of attention-looking modules that neither route nor contain a module that does."""
    found = []
    for name, module in model.named_modules():
        if "Attention" not in type(module).__name__ or _routes_through_interface(type(module)):
            continue
        if not any(_routes_through_interface(type(m)) for m in module.modules()):
            found.append(name)
    return found


def _family(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def supports(model: nn.Module) -> bool:
    """Whether every attention layer of ``model`` can be scored by ssacli."""
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is None or not can_set():
        return False
    return any(True for _ in attention_modules(model)) and not _unrouted_attention(model)


def _check_supported(model: nn.Module) -> None:
    if supports(model):
        return
    raise UnsupportedModelError(
        f"model family '{_family(model)}' does not route attention through transformers' "
        "AttentionInterface, so ssacli cannot swap its scorer; supported families include "
        f"{', '.join(TESTED_FAMILIES)} (see docs/models.md)"
    )


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


def apply_scorer(model: nn.Module, spec: str) -> nn.Module:
    """Score every attention layer of ``model`` with its own instance of scorer ``spec``.

    Parameters of the scorers become submodules (``<attention module>.ssacli_scorer``), so they are
    in ``model.state_dict()`` and ``model.parameters()``. Applying again replaces the scorers.
    Returns the model (changed in place).
    """
    _check_supported(model)
    register()
    modules = list(attention_modules(model))
    # Build every scorer first, so a bad spec leaves the model untouched.
    scorers = [make_scorer(spec, num_heads=num_heads(m, model)) for _, m in modules]
    for (_, module), scorer in zip(modules, scorers, strict=True):
        reference = next(module.parameters(), None)
        if reference is not None:
            scorer.to(device=reference.device)
        setattr(module, SCORER_ATTR, scorer)
    if not hasattr(model, ORIGINAL_ATTR):
        setattr(model, ORIGINAL_ATTR, model.config._attn_implementation)
    model.set_attn_implementation(ATTENTION_NAME)
    setattr(model.config, CONFIG_SPEC_ATTR, scorers[0].spec)
    return model


def restore(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_scorer`: drop the scorers and go back to the original implementation."""
    original = getattr(model, ORIGINAL_ATTR, None)
    if original is None:
        return model
    for _, module in attention_modules(model):
        if hasattr(module, SCORER_ATTR):
            delattr(module, SCORER_ATTR)
    model.set_attn_implementation(original)
    delattr(model, ORIGINAL_ATTR)
    if hasattr(model.config, CONFIG_SPEC_ATTR):
        delattr(model.config, CONFIG_SPEC_ATTR)
    return model


def scorers_of(model: nn.Module) -> dict[str, Scorer]:
    """The scorer attached to each attention module, by module name."""
    return {
        name: getattr(module, SCORER_ATTR)
        for name, module in attention_modules(model)
        if hasattr(module, SCORER_ATTR)
    }
