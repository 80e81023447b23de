"""Converted folders in plain transformers: ssacli's attention registered with transformers.

A folder whose scorer is not softmax (after ``ssacli convert --finetune``, any training, a conversion
that missed its fidelity target) declares the model type ``<type> (needs import ssacli)`` and
``attn_implementation: "ssacli"`` in its config.json (:mod:`ssacli.models.guard`). Without ssacli,
transformers' Auto classes and pipeline refuse it (an unknown model type, quoted in the message) and
the concrete class refuses to build it ("Specified `attn_implementation="ssacli"` is not
supported") unless given an explicit ``attn_implementation=``. After this import,
``AutoModelForCausalLM.from_pretrained(DIR)``, the concrete class (``LlamaForCausalLM``) and
``pipeline("text-generation", model=DIR)`` build it with its scorer and the learned values:

>>> import ssacli
>>> from transformers import AutoModelForCausalLM
>>> model = AutoModelForCausalLM.from_pretrained("my-model-ssa")

Each attention module takes its scorer on the model's first forward (transformers runs no code of
ssacli's at load time; :mod:`ssacli.models.first_use`), computing what ``ssacli.load_model(DIR)``
computes. :func:`attach` attaches them all at once, for code that needs the scorers' parameters
before any forward (an optimizer built before training). An explicit ``attn_implementation=``
argument to ``from_pretrained`` replaces the saved one: the model then runs that softmax attention.

``import ssacli`` imports this module as soon as transformers is imported (at once if it already
is: :mod:`ssacli.transformers_hook`), so ``import ssacli`` is the one line; ``import ssacli`` itself
stays free of torch and transformers until then (the CLI refuses bad options in well under a second).
"""

from __future__ import annotations

from torch import nn

from .attention.forward import set_scorer_source
from .attention.interface import register as _register_attention
from .models.first_use import attach_pending, scorer_on_first_use

__all__ = ["attach", "register"]


def register() -> None:
    """Register ssacli's attention and mask functions with transformers under the name "ssacli",
    with the saved scorer as what a module without one takes on its first call (done on import;
    idempotent)."""
    set_scorer_source(scorer_on_first_use)  # first: a forwarder being replaced may be running
    _register_attention(replace=True)


def attach(model: nn.Module) -> nn.Module:
    """Attach every scorer of a model built from a converted folder now, rather than on its first
    forward (the same scorers, the same values); any other model is returned as it is."""
    return attach_pending(model)


register()
