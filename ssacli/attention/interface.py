"""The one place ssacli touches transformers' attention.

ssacli registers one attention function and one mask function, both under the name ``"ssacli"``:

* ``AttentionInterface``: :func:`ssacli_attention_forward` computes the model's logits exactly as its
  eager path does (scaling, Gemma-2 softcap before the mask, T5 position bias, learned sinks,
  un-repeated GQA keys) and hands them to the scorer attached to that attention module. Every
  keyword argument a model passes is in :data:`ARGUMENTS` (understood) or makes the call raise
  :class:`~ssacli.errors.UnsupportedModelError` naming it and the family: none is ignored.
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
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Protocol

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

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


# ---- the keyword arguments transformers passes -----------------------------------------------------

# Every keyword argument that transformers' modeling code (5.x) passes to an attention function, and
# what ssacli does with it. A keyword not listed here with a value other than None raises
# UnsupportedModelError (tests/test_attention.py::test_an_unknown_argument_is_refused).
ARGUMENTS: dict[str, str] = {
    "scaling": "multiplies q·k (None: head_dim^-0.5; OPT and T5 pass 1.0)",
    "dropout": "dropout on the weights while training",
    "is_causal": "causality when no mask is passed",
    "sliding_window": "already in the mask transformers builds; applied to a missing causal mask too",
    "softcap": "softcap·tanh(x/softcap) on the logits before the mask (Gemma-2)",
    "position_bias": "added to the logits (T5 relative positions)",
    "s_aux": "learned sink logits [heads] (gpt-oss): one extra, always visible key with a zero value",
    "sinks": "sink logits [b, heads, q, 1] (inkling2): one extra, always visible key with a zero value",
    "cu_seq_lens_q": "packed sequences (batch of one): keys of another sequence are hidden",
    "cu_seq_lens_k": "packed sequences (batch of one): keys of another sequence are hidden",
    "max_length_q": "flash-attention size hint for packed sequences: no effect on the result",
    "max_length_k": "flash-attention size hint for packed sequences: no effect on the result",
    "position_ids": "already in the mask (transformers separates packed sequences found in them)",
    "cache_position": "already in the mask and the cache",
    "output_attentions": "bookkeeping: the weights are returned when transformers collects them",
    "output_hidden_states": "bookkeeping: no effect on attention",
    "output_router_logits": "bookkeeping (mixture-of-experts): no effect on attention",
    "num_items_in_batch": "bookkeeping (loss normalization): no effect on attention",
    "seq_idx": "packed-sequence index for Mamba layers: no effect on attention",
    "use_cache": "bookkeeping: no effect on this call's result",
    "past_key_values": "bookkeeping: keys and values arrive already concatenated",
    "past_key_value": "bookkeeping: keys and values arrive already concatenated",
    "deterministic": "flash-attention determinism flag: no effect on the result",
    "layer_idx": "bookkeeping: no effect on the result",
}
# Arguments ssacli understands but cannot reproduce: refused (with this reason) when not None.
REFUSED_ARGUMENTS: dict[str, str] = {
    "indices": "sparse top-k key indices (DeepSeek sparse attention) chosen outside the attention call",
    "block_indices": "block-sparse key indices chosen outside the attention call",
}


def check_arguments(module: nn.Module, kwargs: dict) -> None:
    """UnsupportedModelError for any keyword argument of an attention call ssacli would ignore."""
    for name, value in kwargs.items():
        if value is None or name in ARGUMENTS:
            continue
        what = REFUSED_ARGUMENTS.get(name)
        if what is None:
            what = "an attention argument ssacli does not understand"
        raise UnsupportedModelError(
            f"model family '{_family(module)}' passes '{name}' to its attention function ({what}); "
            f"ssacli would ignore it, so it refuses instead (docs/models.md). Supporting it needs the "
            f"argument's effect on the logits or the mask in ssacli.attention.interface.ARGUMENTS"
        )


def sink_logits(kwargs: dict) -> torch.Tensor | None:
    """The learned sink logits of this call, broadcastable to [b, h, q, 1], or None.

    gpt-oss passes ``s_aux`` [h] (one learned logit per head); inkling2 passes ``sinks`` [b, h, q, 1]
    (one per query). Either is a key that every query sees, whose logit is the sink and whose value is
    zero: with softmax, weights = exp(x) / (exp(s) + Σ exp(x)), as those models' eager paths compute.
    """
    sink = kwargs.get("s_aux")
    if sink is None:
        sink = kwargs.get("sinks")
    if sink is None:
        return None
    return sink.reshape(1, -1, 1, 1) if sink.dim() == 1 else sink


# ---- the registered functions ---------------------------------------------------------------------


# Families whose own code reads or edits the attention mask outside the attention function assuming
# eager's float convention (0 = visible, a large negative number = hidden). ssacli hands them that
# float mask (the eager scorer path reads it exactly; the fused kernels need a boolean one), and the
# all-family audit (tests/test_families.py) fails for them with the boolean mask.
EAGER_MASK_FAMILIES: dict[str, str] = {
    "nllb-moe": "its router reads the padding from the mask as additive (0 = visible)",
    "deepseek_v4": "it extends the mask for compressed keys by padding with 0.0 (visible in eager)",
    "bigbird_pegasus": "its decoder attention modules say is_causal=False; only a materialized mask "
    "keeps them causal",
}


def ssacli_mask(*args, **kwargs) -> torch.Tensor | None:
    """transformers' boolean sdpa mask (True = visible).

    A plain causal mask (no padding, no window, q_len == k_len or 1) comes back as None, as for
    sdpa: the attention function then knows it is causal from the module, and neither the fused
    kernel nor the eager scorer needs an [L, L] tensor for it. Every other mask (padding, sliding
    windows, cache offsets, bidirectional) is materialized, so the scorer sees it exactly. Families
    in :data:`EAGER_MASK_FAMILIES` get transformers' eager float mask instead.
    """
    if getattr(kwargs.get("config"), "model_type", None) in EAGER_MASK_FAMILIES:
        return eager_mask(*args, **kwargs)
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
    check_arguments(module, kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if sink_logits(kwargs) is not None and scorer.uses_qk:
        raise UnsupportedModelError(
            f"model family '{_family(module)}' has learned attention sinks; scorer '{scorer.name}' scores "
            "q and k directly and has no logit scale to place a sink on (docs/scorers.md#sinks)"
        )
    per_head = max((p.numel() for p in scorer.parameters()), default=1)
    if per_head > 1 and per_head != query.shape[1]:
        raise UnsupportedModelError(
            f"{type(module).__name__} ({_family(module)}) attends with {query.shape[1]} query rows per "
            f"position where its scorer holds {per_head} per-head parameters (attention that is not over "
            "heads); use the scorer's share=layer option"
        )
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
    logits, visible = visibility(logits, attention_mask, module, kwargs)
    weights = score_with_sink(scorer, logits, visible, sink_logits(kwargs), query=query, key=key)
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


def visibility(
    logits: torch.Tensor,
    mask: torch.Tensor | None,
    module: nn.Module,
    kwargs: dict,
    rows: slice = slice(None),
    q_total: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, visible): the boolean visibility (True = visible) the scorer gets, from whatever mask
    the model passed, and the logits with any real bias of a float mask added.

    * no mask: causal (bottom-right aligned, ``sliding_window`` applied) if the call's ``is_causal``
      or else the module's ``is_causal`` says so, otherwise None (everything visible);
    * a bool mask: used as it is; a float additive mask: its large negative fill is "hidden" and
      any other value is a bias added to the logits;
    * ``cu_seq_lens_q``/``cu_seq_lens_k`` (packed sequences): keys of another sequence are hidden.

    ``rows`` selects a block of query rows out of ``q_total`` (the observed, blocked path).
    """
    k_len = logits.shape[-1]
    q_total = logits.shape[-2] if q_total is None else q_total
    if mask is None:
        visible = None
        if _is_causal(module, kwargs.get("is_causal")) and q_total > 1:
            # Bottom-right aligned: with a KV cache the last query sits at the last key. [1, 1, q, k]
            # like the masks transformers builds, so observers can read it the same way.
            window = kwargs.get("sliding_window")
            visible = _causal_rows(rows, q_total, k_len, logits.device, window)[None, None]
    else:
        if mask.dim() == 4:
            mask = mask[..., :k_len]
            if mask.shape[-2] == q_total:
                mask = mask[..., rows, :]
        if mask.dtype == torch.bool:
            visible = mask
        else:
            # A float additive mask (a user's custom 4D mask): keep any real bias it carries, and read
            # the large negative fill as "masked".
            visible = mask > torch.finfo(mask.dtype).min / 2
            logits = logits + torch.where(visible, mask, 0).to(logits.dtype)
    packed = _packed_visibility(kwargs, q_total, k_len, logits.device)
    if packed is not None:
        packed = packed[rows][None, None]
        visible = packed if visible is None else visible & packed
    return logits, visible


def _packed_visibility(kwargs: dict, q_len: int, k_len: int, device) -> torch.Tensor | None:
    """[q, k] True where query and key belong to the same packed sequence (cu_seq_lens_*), or None."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_k is None:
        return None
    cu_q = cu_k if cu_q is None else cu_q
    cu_k = cu_q if cu_k is None else cu_k
    if int(cu_q[-1]) != q_len or int(cu_k[-1]) != k_len:
        raise UnsupportedModelError(
            f"cu_seq_lens_q/k end at {int(cu_q[-1])}/{int(cu_k[-1])} but this call has {q_len} queries and "
            f"{k_len} keys: packed sequences must be one row (batch of one) without a cache"
        )
    seq_q = torch.bucketize(torch.arange(q_len, device=device), cu_q[1:].to(device), right=True)
    seq_k = torch.bucketize(torch.arange(k_len, device=device), cu_k[1:].to(device), right=True)
    return seq_q[:, None] == seq_k[None, :]


def _is_causal(module: nn.Module, is_causal: bool | None) -> bool:
    """Causality when the model passed no mask: its ``is_causal`` argument, else the module's."""
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", False))


def _causal_rows(
    rows: slice, q_total: int, k_len: int, device: torch.device, window: int | None = None
) -> torch.Tensor:
    """[q_rows, k] causal visibility, bottom-right aligned, for the query rows in ``rows``; with a
    ``window``, key j is visible from position i only if i − j < window (transformers' convention)."""
    positions = torch.arange(k_len - q_total, k_len, device=device)[rows].unsqueeze(1)
    keys = torch.arange(k_len, device=device).unsqueeze(0)
    visible = keys <= positions
    if window is not None:
        visible = visible & (positions - keys < window)
    return visible


def score_with_sink(
    scorer: Scorer,
    logits: torch.Tensor,
    visible: torch.Tensor | None,
    sink: torch.Tensor | None,
    **inputs,
) -> torch.Tensor:
    """The scorer's weights [b, h, q, k]; with a ``sink`` [b|1, h, q|1, 1], over the keys plus one
    extra, always visible key whose logit is the sink (its weight is dropped: its value is zero).

    What the sink means therefore follows from each scorer's definition on an extra key: softmax gives
    exp(x)/(exp(s) + Σ exp(x)) (gpt-oss's eager path); SSA transforms s like any logit; sparse scorers
    may give the sink all or none of the mass; scorers counting visible keys count it (docs/scorers.md).
    """
    return scores_and_sink(scorer, logits, visible, sink, **inputs)[0]


def scores_and_sink(
    scorer: Scorer,
    logits: torch.Tensor,
    visible: torch.Tensor | None,
    sink: torch.Tensor | None,
    **inputs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`score_with_sink`'s weights [b, h, q, k] and the weight the sink key took [b, h, q]
    (None without a sink): what diagnose reports as the learned-sink mass."""
    if sink is None:
        return scorer(logits, visible, **inputs), None
    b, h, q, k = logits.shape
    column = sink.to(logits.dtype).expand(b, h, q, 1)
    if visible is None:
        visible = torch.ones(1, 1, 1, k, dtype=torch.bool, device=logits.device)
    visible = visible.expand(b, h, q, k)
    visible = torch.cat([visible, visible.new_ones(b, h, q, 1)], dim=-1)
    weights = scorer(torch.cat([logits, column], dim=-1), visible, **inputs)
    return weights[..., :k], weights[..., k]


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


def eager_reason(scorer: Scorer, mask: torch.Tensor | None, kwargs: dict) -> str | None:
    """Why this call must compute the weight matrix, or None if a fused kernel may run (the auto
    backend's routing rule; tests/test_fused.py checks it)."""
    if _weights_requested():
        return "the attention weights were requested (output_attentions)"
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        return "the model adds a softcap or a position bias to the logits"
    if mask is not None and mask.dtype != torch.bool:
        return "the model passed a float attention mask"
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return "packed sequences (cu_seq_lens_*) are separated in the eager mask"
    if type(scorer).fused is Scorer.fused:
        return f"scorer '{scorer.name}' has no fused kernel"
    return None


def with_sink_key(query, key, value, mask, causal, sink, scaling):
    """The same attention with the sink as an ordinary first key, for kernels that know no sinks.

    Every key gets one more, zero feature and the sink key is (0, …, 0, 1) with a zero value; every
    query gets the feature sink/scaling, so the scaled logit of the sink key is the sink itself and
    every other logit is unchanged. Values get a zero feature too (sliced off the output). The sink
    key is first and always visible, so a causal call becomes an explicit mask. Returns (query, key,
    value, mask, causal) for the kernel: query [b, h, q, d+1], key/value [b, h_kv, k+1, d+1].
    """
    b, h, q, _ = query.shape
    k_len = key.shape[-2]
    feature = (sink.to(query.dtype) / scaling).expand(b, h, q, 1)
    query = torch.cat([query, feature], dim=-1)
    key = nn.functional.pad(key, (0, 1, 1, 0))
    key[..., 0, -1] = 1.0
    value = nn.functional.pad(value, (0, 1, 1, 0))
    if causal:
        mask = _causal_rows(slice(None), q, k_len, query.device)[None, None]
    if mask is not None:
        mask = torch.cat([mask.new_ones(*mask.shape[:-1], 1), mask], dim=-1)
    return query, key, value, mask, False


def _fused_output(module, scorer, query, key, value, mask, scaling, dropout, kwargs):
    """The fused kernel's output [b, h, q, d], or None where this call takes the eager path."""
    backend = _BACKEND.get()
    if backend == "eager":
        return None
    reason = eager_reason(scorer, mask, kwargs)
    if reason is None:
        causal = mask is None and _is_causal(module, kwargs.get("is_causal"))
        if mask is not None:
            mask = mask[..., : key.shape[-2]]
        elif causal and kwargs.get("sliding_window") is not None and query.shape[-2] > 1:
            window = kwargs["sliding_window"]
            mask = _causal_rows(slice(None), query.shape[-2], key.shape[-2], query.device, window)[None, None]
            causal = False
        sink = sink_logits(kwargs)
        if sink is not None:
            query, key, value, mask, causal = with_sink_key(query, key, value, mask, causal, sink, scaling)
        output = scorer.fused(
            query, key, value, scale=scaling, causal=causal, mask=mask,
            dropout=dropout if module.training else 0.0,
        )  # fmt: skip
        if output is not None and sink is not None:
            output = output[..., : value.shape[-1] - 1]
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
        sink: torch.Tensor | None = None,
    ) -> None:
        """Reduce one block of weights [b, h, q_rows, k] (key indices of the rows given). Models with
        learned sinks also pass ``sink`` [b, h, q_rows], the weight each row gave its sink key (passed
        only when there is one, so observers of other models may omit the keyword)."""
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
    # Optional observer seam (diagnose's key-scale probe): the keys as this call received them
    # (after projection, norm and rotary; K/V heads already repeated), changed before any logit.
    transform_key = getattr(observer, "transform_key", None)
    if transform_key is not None:
        key = transform_key(key, module)
    positions = torch.arange(k_len - q_total, k_len, device=query.device)
    outputs = []
    for start in range(0, q_total, block):
        rows = slice(start, min(start + block, q_total))
        logits = observer.transform(_logits(query, key, scaling, kwargs, rows), module)
        logits, visible = visibility(logits, mask, module, kwargs, rows, q_total)
        extra = {"query_positions": positions[rows]} if scorer.uses_qk else {}
        sink = sink_logits(kwargs)
        if sink is not None and sink.shape[-2] == q_total:
            sink = sink[:, :, rows]
        weights, sink_weight = scores_and_sink(
            scorer, logits, visible, sink, query=query[:, :, rows], key=key, **extra
        )
        if sink_weight is None:
            observer.record(module, weights, visible, positions[rows])
        else:  # a learned sink: its weight [b, h, q_rows] too (observers of sink models take it)
            observer.record(module, weights, visible, positions[rows], sink=sink_weight)
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


# Positional parameters of an attention function, sometimes passed by keyword.
_POSITIONAL = frozenset({"module", "query", "key", "value", "attention_mask"})


def attention_call_arguments(source: str) -> frozenset[str]:
    """The keyword names passed by every ``attention_interface(...)`` call in ``source`` (the call's
    own arguments, not those of calls nested in them), positional parameters excluded."""
    names: set[str] = set()
    for match in re.finditer(r"attention_interface\(", source):
        depth, i, start = 1, match.end(), match.end()
        while depth and i < len(source):
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        top, depth = [], 0
        for char in source[start : i - 1]:
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
            top.append(char if depth == 0 or char in "([{" else " ")
        names.update(re.findall(r"(?<![\w*])(\w+)\s*=(?!=)", "".join(top)))
    return frozenset(names - _POSITIONAL)


@cache
def passed_arguments(cls: type) -> frozenset[str]:
    """The keyword names ``cls.forward`` passes to its attention function, read from its source
    (``**kwargs`` passed through are checked at call time by :func:`check_arguments`)."""
    try:
        return attention_call_arguments(inspect.getsource(cls.forward))
    except (OSError, TypeError):
        return frozenset()


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model``'s scorer cannot be swapped exactly (a sentence naming the family and what it
    would take), or None when :func:`apply_scorer` can: every attention module routes through the
    AttentionInterface and passes only arguments in :data:`ARGUMENTS` (tests/test_families.py checks
    this answer against the model's own eager path for every family of the installed transformers).
    """
    family = _family(model)
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
