"""The attention function transformers calls (registered as ``"ssacli"`` by :mod:`.interface`).

Read in file order, one call goes:

1. :func:`ssacli_attention_forward` checks the call (every keyword understood, :mod:`.arguments`),
   reads the learned sink, and serves the teacher modes of conversion (:mod:`.teacher`);
2. where nothing observes the weights, the scorer's fused kernel runs if it may (:mod:`.backend`);
   under :func:`observing` (diagnose, m=auto) :func:`observed_attention` takes the call;
3. there, where the scorer is a softmax of a transformed logit, diagnose's fused statistics
   (:func:`online_observed_attention`) reduce the call to running row statistics in one blocked pass
   and hand them to the :class:`Observer`'s ``record_rows``;
4. otherwise :func:`eager_attention`, the one eager implementation: the logits as the model's
   eager path computes them (:func:`scaled_logits`: scaling, Gemma-2 softcap, T5 position bias), the
   keys each query sees (:func:`~.masks.visibility`), the scorer's weights (with a learned sink,
   :func:`~.sinks.scores_and_sink`), and ``weights @ value``. The plain path calls it once for every
   query row; :func:`observed_attention` calls it one block of query rows at a time and hands each
   block's weights and logits to the observer's ``record``, so no [b, h, q, k] tensor outlives a
   block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..kernels import routing
from ..kernels.online_stats import STATS_BLOCK_KEYS, softmax_statistics
from ..kernels.positions import PositionBins
from ..kernels.stats_call import StatisticsCall
from ..scorers import Scorer, make_scorer
from ..scorers.softmax_family import SSA, Softmax
from .arguments import check_arguments, family_name
from .backend import fused_output
from .masks import causal_when_unmasked, visibility
from .sinks import scores_and_sink, sink_logits
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
    stats_mode: str = "eager"  # "eager" | "fused" | "auto" (STATS_MODES)
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
        logits: torch.Tensor | None = None,
    ) -> None:
        """One block of weights [b, h, q_rows, k] (``query_positions``: the rows' key indices) and the
        logits they were scored from (after :meth:`transform`, before a float mask's bias); models
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
    :func:`statistics_backend` chooses the fused statistics (the observer's ``stats_mode``, the call's
    facts), :func:`online_observed_attention`.
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


# ---- 3. diagnose's fused statistics: running row statistics instead of weight blocks -----------------
# For scorers that are a softmax of a transformed logit (Scorer.transformed_logits: softmax,
# temperature, SSA, SSMax, sink, softmax1) the call is described as one StatisticsCall (mask or causal
# band, softcap, position bias, the observer's probe, the scorer's transform and keyless terms); the
# kernel (ssacli.kernels.online_stats) forms every block's logits exactly as observed_attention does,
# so its statistics are those of the eager weights, and no [rows, keys] tile exists.

STATS_MODES = routing.MODEL_BACKENDS  # --stats: the values of every model-wide backend option


def online_reason(scorer: Scorer, mask: torch.Tensor | None, kwargs: dict) -> str | None:
    """Why this call's statistics need the eager weights, or None if the fused pass computes them."""
    if scorer.uses_qk or type(scorer).transformed_logits is Scorer.transformed_logits:
        return f"scorer '{scorer.name}' is not a softmax of a transformed logit"
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return "packed sequences (cu_seq_lens_*) are separated in the eager mask"
    if mask is not None and mask.dim() != 4:
        return f"the model passed a {mask.dim()}-d attention mask"
    return None


def statistics_backend(observer, query: torch.Tensor, reason: str | None) -> str:
    """ "eager" where this observed call takes the eager weights, else the backend its fused
    statistics run on (ssacli.kernels.online_stats.softmax_statistics's ``backend``): chosen by
    ssacli.kernels.routing.choose_backend from the observer's ``stats_mode`` (``auto`` reads
    SSACLI_BACKEND) and ``reason`` (:func:`online_reason`)."""
    backend = routing.requested(observer.stats_mode)
    call = routing.Call(
        query.device.type, query.dtype, kind="statistics", scope="model", backend=backend,
        weights_needed=reason,
    )  # fmt: skip
    if routing.choose_backend(call) == "eager":
        return "eager"
    return "auto" if backend == "fused" else backend


def online_observed_attention(
    module, scorer, observer, query, key, value, mask, scaling, sink, kwargs, backend: str = "auto"
):
    """:func:`observed_attention`'s output, with the call's statistics
    handed to ``observer.record_rows`` instead of its weights to ``observer.record``. key/value are
    already repeated for GQA; ``sink``: the learned sink logits or None; ``backend``: the statistics'
    (:func:`statistics_backend`)."""
    b, h, q_total, _ = query.shape
    k_len = key.shape[-2]
    key = observer.transform_key(key, module)
    compute = torch.promote_types(query.dtype, torch.float32)
    causal = mask is None and causal_when_unmasked(module, kwargs.get("is_causal")) and q_total > 1
    target = observer.target
    if target is not None and target.shape[0] != b:
        target = None
    keyless = scorer.keyless_logit(torch.zeros(1, h, 1, 1, dtype=compute, device=query.device))
    if keyless is not None:
        keyless = keyless.to(compute).expand(1, h, 1, 1).reshape(1, h, 1)

    def probe(x: torch.Tensor, cols: slice) -> torch.Tensor:
        return observer.transform_block(x, module, cols)

    call = StatisticsCall(
        scaling=float(scaling), mask=mask, causal=causal,
        window=kwargs.get("sliding_window") if causal else None,
        softcap=kwargs.get("softcap"), position_bias=kwargs.get("position_bias"),
        # every level of a probe on the logits takes the same path, the reference level included
        probe=probe if observer.changes_logits(module) else None,
        transform=None if type(scorer).transformed_logits is Softmax.transformed_logits
        else scorer.transformed_logits,
        # SSA's transform as data too, for the kernels that compute it themselves (Triton on CUDA)
        ssa=(scorer.b, scorer.n) if type(scorer).transformed_logits is SSA.transformed_logits else None,
        sink=sink, keyless=keyless, target=target, top_k=int(observer.top_k), positions=observer.positions,
    )  # fmt: skip
    out, stats = softmax_statistics(
        query, key, value, call, block_rows=max(1, int(observer.block_size)), block_keys=STATS_BLOCK_KEYS,
        backend=backend,
    )  # fmt: skip
    observer.record_rows(module, stats, torch.arange(k_len - q_total, k_len, device=query.device))
    return out.transpose(1, 2).contiguous(), None


# ---- 4. eager attention -----------------------------------------------------------------------------


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
    rounded only for the matmul) and go to its :meth:`~Observer.record` with those logits."""
    q_total, k_len = query.shape[-2], key.shape[-2]
    logits = scaled_logits(query, key, scaling, kwargs, rows)
    if observer is not None:
        logits = observer.transform(logits, module)
    observed = logits  # as the scorer sees them, before a float mask's bias: the observer's logit scale
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
    if observer is not None:  # with a learned sink, its weight [b, h, q_rows] too (else None)
        observer.record(module, weights, visible, positions, sink=sink_weight, logits=observed)
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


__all__ = [
    "SCORER_ATTR", "STATS_MODES", "Observer", "attend", "current_observer", "eager_attention",
    "observed_attention", "observing", "online_observed_attention", "online_reason", "scaled_logits",
    "set_scorer_source", "ssacli_attention_forward", "statistics_backend",
]  # fmt: skip
