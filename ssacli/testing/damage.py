"""Known changes to a model, to measure what ``ssacli check``'s gates catch (tests/check/test_gates.py,
scripts/gate_table.py, docs/ci.md "What the default gates catch").

Graded damage, applied in place to a loaded transformers model whose attention modules project their
queries with ``q_proj`` (Llama, Mistral, Qwen, SmolLM, ...; anything else is refused with a
ValueError naming the module): a temperature on every head, some heads made uniform, a broken LM
head. Each acts on the weights, so the damaged model is an ordinary checkpoint that runs on every
attention route and saves like any other; none uses ssacli's scorers (a check must catch damage it
did not make).

Why scaling the queries is an exact temperature: every logit is ``q·k·scale`` and rotary position
embeddings rotate q linearly, so q/t gives logits/t on every head at every position; where a
family normalizes q per head (``q_norm``, Qwen3's RMSNorm after the projection, which would undo a
scale before it), the norm's weight is scaled instead. Zero queries give zero logits: every visible
key gets the same weight, so a zeroed head attends uniformly (within its mask).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    found = [module for module in model.modules() if isinstance(getattr(module, "q_proj", None), nn.Linear)]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no attention module with a q_proj projection: these damages "
            "are written for Llama-like families"
        )
    return found


def _query_weights(attn: nn.Module) -> list[torch.Tensor]:
    """The tensors the logits are linear in, per head along dim 0: q_norm's weight where the family
    normalizes q (scaling the projection would be undone), else q_proj's weight and bias."""
    norm = getattr(attn, "q_norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None:
        return [norm.weight]
    return [t for t in (attn.q_proj.weight, attn.q_proj.bias) if t is not None]


@torch.no_grad()
def temper(model: nn.Module, t: float) -> None:
    """Every head's logits divided by ``t`` (softmax(x / t)): t > 1 spreads attention, t < 1 sharpens it."""
    for attn in _attention_modules(model):
        for weight in _query_weights(attn):
            weight.div_(t)


@torch.no_grad()
def uniform_heads(model: nn.Module, share: float) -> None:
    """The first ceil(share · heads) heads of every layer made uniform (their queries zeroed)."""
    for attn in _attention_modules(model):
        head_dim = attn.head_dim
        heads = attn.q_proj.weight.shape[0] // head_dim
        count = math.ceil(share * heads)
        # Zero rows give zero queries, which a q_norm keeps at zero (RMSNorm of 0 is 0).
        attn.q_proj.weight[: count * head_dim] = 0
        if attn.q_proj.bias is not None:
            attn.q_proj.bias[: count * head_dim] = 0


@torch.no_grad()
def break_lm_head(model: nn.Module, seed: int = 0) -> None:
    """The output embedding's rows permuted (untied from the input embedding first): every token's
    logit is another token's, so predictions are wrong while attention is untouched."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (LM head) to break")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(head.weight.shape[0], generator=gen)
    head.weight = nn.Parameter(head.weight.detach()[order].clone())  # a new tensor: unties it
    if hasattr(model.config, "tie_word_embeddings"):
        model.config.tie_word_embeddings = False


# Graded damage, mildest first within each kind: what docs/ci.md's gate table applies. The last one
# sharpens attention instead: a model made more prone to saturate, which the output-change gates are for.
DAMAGE: dict[str, Callable[[nn.Module], None]] = {
    "temperature 1.5 (every head)": lambda m: temper(m, 1.5),
    "temperature 3 (every head)": lambda m: temper(m, 3.0),
    "half the heads uniform": lambda m: uniform_heads(m, 0.5),
    "uniform attention (every head)": lambda m: uniform_heads(m, 1.0),
    "broken LM head (rows permuted)": break_lm_head,
    "temperature 1/2 (every head: sharper)": lambda m: temper(m, 0.5),
}
