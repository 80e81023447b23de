"""What transformers passes to an attention function, and what ssacli does with each keyword.

:data:`ARGUMENTS` lists every keyword ssacli understands (and how), :data:`REFUSED_ARGUMENTS` those it
understands but cannot reproduce. :func:`check_arguments` refuses any other at call time;
:func:`passed_arguments` reads the keywords a model class passes from its source, so
``unsupported_reason`` can refuse the model before it runs.
"""

from __future__ import annotations

import inspect
import re
from functools import cache

from torch import nn

from ..errors import UnsupportedModelError

# Every keyword argument that transformers' modeling code (5.x) passes to an attention function, and
# what ssacli does with it. A keyword not listed here with a value other than None raises
# UnsupportedModelError (tests/contracts/test_families.py::test_an_unknown_argument_is_refused).
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
    # Since transformers 5.24 an attention module takes its KV cache as `cache` and never passes it on;
    # before, it read `past_key_values`, and a `cache=` given to the model (5.24's name) went through
    # **kwargs to here unread: this call's keys lack the cached ones, so ignoring it would be a
    # silently wrong result. ssacli's own decoding passes the release's name (cache_argument).
    "cache": "a KV cache the attention module did not read (before transformers 5.24 the model's "
    "keyword is past_key_values: pass the cache under that name)",
    "indices": "sparse top-k key indices (DeepSeek sparse attention) chosen outside the attention call",
    "block_indices": "block-sparse key indices chosen outside the attention call",
}


def family_name(model: nn.Module) -> str:
    """The model family named in messages: the config's model_type, else the class name."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def check_arguments(module: nn.Module, kwargs: dict) -> None:
    """UnsupportedModelError for any keyword argument of an attention call ssacli would ignore."""
    for name, value in kwargs.items():
        if value is None or name in ARGUMENTS:
            continue
        what = REFUSED_ARGUMENTS.get(name)
        if what is None:
            what = "an attention argument ssacli does not understand"
        raise UnsupportedModelError(
            f"model family '{family_name(module)}' passes '{name}' to its attention function ({what}); "
            f"ssacli would ignore it, so it refuses instead (docs/models.md). Supporting it needs the "
            f"argument's effect on the logits or the mask in ssacli.attention.interface.ARGUMENTS"
        )


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


# ---- the KV cache's name: `cache` since transformers 5.24, `past_key_values` before -----------------


def cache_argument(model: nn.Module, cache) -> dict:
    """The keyword that hands ``cache`` to ``model``'s forward on the installed transformers:
    ``cache`` where its forward takes that name (5.24 on), else ``past_key_values``."""
    try:
        names = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        names = {}
    if "cache" in names or "past_key_values" in names:
        return {"cache" if "cache" in names else "past_key_values": cache}
    import transformers  # a forward that names neither (**kwargs): the release decides

    renamed = tuple(int(p) for p in transformers.__version__.split(".")[:2]) >= (5, 24)
    return {"cache" if renamed else "past_key_values": cache}


def returned_cache(output):
    """The KV cache a forward returned: ``output.cache`` (5.24 on) or ``output.past_key_values``."""
    found = output.get("cache")
    return found if found is not None else output.get("past_key_values")
