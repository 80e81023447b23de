"""The attention function transformers calls (registered as ``"ssacli"`` by :mod:`.interface`).

Read in file order, one call goes:

1. :func:`ssacli_attention_forward` checks the call (every keyword understood, :mod:`.arguments`),
   reads the learned sink, and serves the teacher modes of conversion (:mod:`.teacher`);
2. where nothing observes the weights, the scorer's fused kernel runs if it may (:mod:`.backend`);
3. otherwise :func:`eager_attention`, the one eager implementation: the logits as the model's
   eager path computes them (:func:`scaled_logits`: scaling, Gemma-2 softcap, T5 position bias), the
   keys each query sees (:func:`visibility`), the scorer's weights (with a learned sink,
   :func:`scores_and_sink`), and ``weights @ value``. The plain path calls it once for every query
   row; under :func:`observing` (diagnose, m=auto) :func:`observed_attention` calls it one block of
   query rows at a time and hands each block's weights to the :class:`Observer`, so no
   [b, h, q, k] tensor outlives a block. Diagnose's fused statistics (:mod:`.online`) replace the
   blocks with running row statistics where the scorer is a softmax of a transformed logit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..kernels.positions import PositionBins
from ..kernels.visibility import causal_visibility
from ..scorers import Scorer, make_scorer
from .arguments import check_arguments, family_name
from .backend import fused_output
from .masks import causal_when_unmasked, packed_visibility
from .online import online_observed_attention, online_reason, statistics_backend
from .sinks import sink_logits
from .teacher import SOFTMAX, teacher_mode

SCORER_ATTR = "ssacli_scorer"  # the attention module's submodule holding its scorer (.interface)
SOFTMAX_SCORER = make_scorer("softmax")  # the original's scorer, for .teacher's modes


class Observer:
    """What diagnose (and m=auto's calibration) plugs into the attention call: every hook, each an
    identity or a no-op here, so an observer overrides only what it uses.

    The eager blocks call :meth:`transform_key` once per call, then per block of ``block_size`` query
    rows :meth:`transform`, :meth:`record` and :meth:`patch`. With ``stats_mode`` "auto" or "fused"
    (diagnose's ``--stats``) the fused statistics call :meth:`transform_block` per key block and
    :meth:`record_rows` once per call instead.
    """

    block_size: int = 256  # query rows scored at a time
    stats_mode: str = "eager"  # "eager" | "fused" | "auto" (ssacli.attention.online.STATS_MODES)
    top_k: int = 5  # the running top-k the fused statistics keep
    positions: PositionBins | None = None  # the bins of where the mass lands (None: not measured)
    target: torch.Tensor | None = None  # [b] a key index per sequence (diagnose's target metrics)

    def transform_key(self, key: torch.Tensor, module: nn.Module) -> torch.Tensor:
        """The keys as this call received them [b, h, k, d] (after projection, norm and rotary; K/V
        heads already repeated), changed before any logit (diagnose's key-scale probe)."""
        return key

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        """A probe's change to one block's logits [b, h, q_rows, k] (logit-scale, dominant-key)."""
        return logits

    def transform_block(self, logits: torch.Tensor, module: nn.Module, cols: slice) -> torch.Tensor:
        """:meth:`transform` for the fused statistics: the logits of key columns ``cols`` only."""
        return logits

    def changes_logits(self, module: nn.Module) -> bool:
        """Whether :meth:`transform_block` may change this call's logits (else the fused statistics
        may take them straight from their products); an observer that overrides it says when."""
        return type(self).transform_block is not Observer.transform_block

    def patch(self, module: nn.Module, weights: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
        """The weights [b, h, q_rows, k] that multiply the values, after :meth:`record` saw them:
        attribution by pattern patching (:mod:`ssacli.diagnosis.attribution`) puts another run's
        weights back into chosen heads here. Only the eager blocks call it: the fused statistics
        never form the weights (an observer that patches keeps ``stats_mode`` "eager")."""
        return weights

    def record(
        self,
        module: nn.Module,
        weights: torch.Tensor,
        visible: torch.Tensor | None,
        query_positions: torch.Tensor,
        sink: torch.Tensor | None = None,
    ) -> None:
        """One block of weights [b, h, q_rows, k] (``query_positions``: the rows' key indices); models
        with learned sinks also pass ``sink`` [b, h, q_rows], the weight each row gave its sink key."""

    def record_rows(self, module: nn.Module, stats, query_positions: torch.Tensor) -> None:
        """One call's per-row statistics (:class:`ssacli.kernels.row_stats.RowStatistics`, the learned
        sink's among them), the fused path's :meth:`record`."""


_OBSERVER: ContextVar[Observer | None] = ContextVar("ssacli_observer", default=None)
# Where a module without a scorer gets one on its first call: a converted folder that plain
# transformers built (transformers runs no code of ssacli's at load time). Set by
# ssacli.transformers.register to ssacli.models.first_use's, which this layer cannot import.
_scorer_source: Callable[[nn.Module, torch.device], Scorer] | None = None


def set_scorer_source(source: Callable[[nn.Module, torch.device], Scorer] | None) -> None:
    """What :func:`ssacli_attention_forward` calls for a module without a scorer (None: refuse)."""
    global _scorer_source
    _scorer_source = source


@contextmanager
def observing(observer: Observer) -> Iterator[Observer]:
    """Within this block, every ssacli attention call streams its weights to ``observer`` in query
    blocks and returns no weight map (so no [b, h, q, k] tensor outlives the call)."""
    token = _OBSERVER.set(observer)
    try:
        yield observer
    finally:
        _OBSERVER.reset(token)


def current_observer() -> Observer | None:
    """The observer of the enclosing :func:`observing` block, or None outside one."""
    return _OBSERVER.get()


# ---- 1. the registered function ---------------------------------------------------------------------


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
    """AttentionInterface function: query [b, h, q, d], key/value [b, h_kv, k, d] (not repeated);
    returns (output [b, q, h, d], weights [b, h, q, k] or None)."""
    scorer = getattr(module, SCORER_ATTR, None)
    if scorer is None:
        if _scorer_source is None:
            raise RuntimeError(
                f"{type(module).__name__} has no ssacli scorer: load a converted folder with "
                "ssacli.load_model(DIR), or `import ssacli` before transformers' "
                "from_pretrained; in memory use ssacli.apply_scorer(model, spec), not "
                "attn_implementation='ssacli' by hand"
            )
        scorer = _scorer_source(module, query.device)
    check_arguments(module, kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    sink = sink_logits(kwargs)  # read once here, handed to whichever path runs
    if sink is not None and scorer.uses_qk:
        raise UnsupportedModelError(
            f"model family '{family_name(module)}' has learned attention sinks; scorer '{scorer.name}' "
            "scores q and k directly and has no logit scale to place a sink on (docs/scorers.md#sinks)"
        )
    per_head = max((p.numel() for p in scorer.parameters()), default=1)
    if per_head > 1 and per_head != query.shape[1]:
        raise UnsupportedModelError(
            f"{type(module).__name__} ({family_name(module)}) attends with {query.shape[1]} query rows per "
            f"position where its scorer holds {per_head} per-head parameters (attention that is not over "
            "heads); use the scorer's share=layer option"
        )
    call = (query, key, value, attention_mask, scaling, dropout, sink, kwargs)
    mode = teacher_mode()
    if mode is None:
        return attend(module, scorer, *call)
    if mode == SOFTMAX:  # the softmax original inside the converted model (.teacher)
        return attend(module, SOFTMAX_SCORER, *call)
    output, _ = attend(module, scorer, *call)
    with torch.no_grad():
        target, _ = attend(module, SOFTMAX_SCORER, *call)
    return mode(module, output, target), None


def attend(module, scorer, query, key, value, mask, scaling, dropout, sink, kwargs):
    """One call with ``scorer``: fused where nothing observes and a kernel may, else eager (whole, or
    per query block under an observer). Returns (output [b, q, h, d], weights or None)."""
    observer = current_observer()
    if observer is None:
        # Before repeating K/V: the fused kernels handle grouped-query attention themselves.
        output = fused_output(module, scorer, query, key, value, mask, scaling, dropout, sink, kwargs)
        if output is not None:
            return output.transpose(1, 2).contiguous(), None
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each K/V head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if observer is not None:
        return observed_attention(module, scorer, observer, query, key, value, mask, scaling, sink, kwargs)
    output, weights = eager_attention(
        module, scorer, query, key, value, mask, scaling, kwargs, sink=sink, dropout=dropout
    )
    return output.transpose(1, 2).contiguous(), weights


def observed_attention(module, scorer, observer, query, key, value, mask, scaling, sink, kwargs):
    """The same attention, one block of ``observer.block_size`` query rows at a time (extra memory
    O(block × k)), each block's weights handed to ``observer.record``; or, where
    :func:`~ssacli.attention.online.statistics_backend` chooses the fused statistics (the observer's
    ``stats_mode``, the call's facts), :func:`~ssacli.attention.online.online_observed_attention`.
    key/value are already repeated for GQA. Returns (output [b, q, h, d], None)."""
    backend = statistics_backend(observer, query, online_reason(scorer, mask, kwargs))
    if backend != "eager":
        return online_observed_attention(
            module, scorer, observer, query, key, value, mask, scaling, sink, kwargs, backend=backend
        )
    key = observer.transform_key(key, module)
    q_total, block = query.shape[-2], max(1, int(observer.block_size))
    outputs = [
        eager_attention(
            module, scorer, query, key, value, mask, scaling, kwargs, sink=sink,
            rows=slice(start, min(start + block, q_total)), observer=observer,
        )[0]
        for start in range(0, q_total, block)
    ]  # fmt: skip
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


# ---- 3. eager attention -----------------------------------------------------------------------------


def eager_attention(
    module: nn.Module,
    scorer: Scorer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    kwargs: dict,
    *,
    sink: torch.Tensor | None = None,
    dropout: float = 0.0,
    rows: slice = slice(None),
    observer: Observer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the query rows ``rows`` over every key, as the model's eager path computes it with
    ``scorer`` in place of softmax: (output [b, h, rows, d], weights [b, h, rows, k]). query, key and
    value [b, h, ·, d] with K/V heads already repeated; ``sink``: the call's learned sink logits.

    With an ``observer`` the logits pass its :meth:`~Observer.transform` before the mask, the weights
    are scored in at least float32 (observed as the scorer computed them; a bf16 model's weights are
    rounded only for the matmul) and go to its :meth:`~Observer.record`."""
    q_total, k_len = query.shape[-2], key.shape[-2]
    logits = scaled_logits(query, key, scaling, kwargs, rows)
    if observer is not None:
        logits = observer.transform(logits, module)
    logits, visible = visibility(logits, mask, module, kwargs, rows, q_total)
    positions = torch.arange(k_len - q_total, k_len, device=query.device)[rows]
    inputs = {"query": query[:, :, rows], "key": key}
    if scorer.uses_qk:
        inputs["query_positions"] = positions
    if sink is not None and sink.shape[-2] == q_total:  # one sink logit per query row
        sink = sink[:, :, rows]
    if observer is not None:
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    weights, sink_weight = scores_and_sink(scorer, logits, visible, sink, **inputs)
    if observer is not None:
        if sink_weight is None:
            observer.record(module, weights, visible, positions)
        else:  # a learned sink: its weight [b, h, q_rows] too
            observer.record(module, weights, visible, positions, sink=sink_weight)
        weights = observer.patch(module, weights, positions)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights.to(value.dtype), value), weights


def scaled_logits(
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
        if causal_when_unmasked(module, kwargs.get("is_causal")) and q_total > 1:
            # Bottom-right aligned: with a KV cache the last query sits at the last key. [1, 1, q, k]
            # like the masks transformers builds, so observers can read it the same way.
            window = kwargs.get("sliding_window")
            visible = causal_visibility(q_total, k_len, logits.device, rows=rows, window=window)[None, None]
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
    packed = packed_visibility(kwargs, q_total, k_len, logits.device)
    if packed is not None:
        packed = packed[rows][None, None]
        visible = packed if visible is None else visible & packed
    return logits, visible


def scores_and_sink(
    scorer: Scorer,
    logits: torch.Tensor,
    visible: torch.Tensor | None,
    sink: torch.Tensor | None,
    **inputs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The scorer's weights [b, h, q, k] and, with a learned ``sink`` [b|1, h, q|1, 1], the weight the
    sink key took [b, h, q] (None without one): the sink is one extra, always visible key whose
    logit is the sink and whose value is zero, so its weight is dropped from the output.

    What the sink means therefore follows from each scorer's definition on an extra key: softmax gives
    exp(x)/(exp(s) + Σ exp(x)) (gpt-oss's eager path); SSA transforms s like any logit; sparse scorers
    may give the sink all or none of the mass; scorers counting visible keys count it (docs/scorers.md).
    """
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


__all__ = [
    "SCORER_ATTR", "Observer", "attend", "current_observer", "eager_attention", "observed_attention",
    "observing", "scaled_logits", "scores_and_sink", "set_scorer_source", "ssacli_attention_forward",
    "visibility",
]  # fmt: skip
