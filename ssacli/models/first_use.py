"""A converted folder loaded by plain transformers (``import ssacli.transformers``, then
``AutoModelForCausalLM.from_pretrained(DIR)``, a concrete class or ``pipeline``): its scorers.

transformers has no hook that runs ssacli's code when it builds a model: config.json's
``attn_implementation: "ssacli"`` (:mod:`.guard`, layouts 2 and 3) only makes every attention module call
ssacli's registered function. So each module gets its scorer there, on its first call
(:func:`scorer_on_first_use`, which ``ssacli.transformers`` hands to
:func:`ssacli.attention.forward.ssacli_attention_forward`): the
spec from the config (``ssacli_scorer``), the module's saved tensors from the folder's SCORER_FILE
(found by the folder's layout: the module knows its class and layer_idx, not its state-dict name),
built exactly as :func:`~ssacli.models.checkpoint.attach_saved_scorer` builds them for
``ssacli.load_model``, so both compute the same model. :func:`attach_pending` does it for every
module at once (what an ssacli function does with such a model, and ``ssacli.transformers.attach``:
before training, so that an optimizer sees the scorers' parameters).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ..attention.forward import SCORER_ATTR
from ..attention.interface import (
    ATTENTION_NAME,
    CONFIG_SPEC_ATTR,
    ORIGINAL_ATTR,
    attention_modules,
    execution_device,
    num_heads,
)
from ..errors import InputError
from ..scorers import Scorer, make_scorer
from .checkpoint import SCORER_FILE, SCORER_KEY, WEIGHTS_FILE
from .guard import LAYER_FIELD, LAYOUT_KEY, keep_guard


def _no_scorer(module: nn.Module, why: str) -> RuntimeError:
    return RuntimeError(
        f"{type(module).__name__} has no ssacli scorer ({why}): load a converted folder with "
        "ssacli.load_model(DIR), or `import ssacli` before transformers' from_pretrained; "
        "in memory use ssacli.apply_scorer(model, spec), not attn_implementation='ssacli' by hand"
    )


def _scorer_file(config) -> Path:
    """The SCORER_FILE of the folder the model was loaded from (config.name_or_path: a folder, or a
    Hub id resolved through transformers' cache). A local folder without one that has a single
    WEIGHTS_FILE: that file, which holds the scorers' tensors when ``model.save_pretrained`` wrote
    the folder from a model with its scorers attached (its config keeps the guard: ``keep_guard``)."""
    source = str(getattr(config, "name_or_path", "") or "")
    if os.path.isdir(source):
        folder = Path(source)
        own, weights = folder / SCORER_FILE, folder / WEIGHTS_FILE
        return weights if not own.is_file() and weights.is_file() else own
    from transformers.utils import cached_file

    try:
        found = cached_file(source, SCORER_FILE, _raise_exceptions_for_missing_entries=False)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot find {SCORER_FILE} of '{source}' ({err})") from None
    if found is None:
        raise InputError(f"'{source}' has no {SCORER_FILE}; the folder is incomplete")
    return Path(found)


@lru_cache(maxsize=8)
def _read(file: str, stamp: tuple[int, int]) -> dict[str, torch.Tensor]:
    """The scorers' tensors in ``file`` (SCORER_FILE, or the model's weights: only those are read),
    read once per file version (``stamp``: its mtime and size)."""
    try:
        with torch.inference_mode(False), safe_open(file, framework="pt") as tensors:
            # ordinary tensors even when read under inference mode
            return {key: tensors.get_tensor(key) for key in tensors.keys() if SCORER_KEY in key}
    except (OSError, SafetensorError) as err:
        raise InputError(f"cannot read {file} ({err}); the file is corrupt or truncated") from None


def saved_scorer(module: nn.Module, device: torch.device | None) -> Scorer:
    """The scorer of ``module`` (an attention module of a model built from a guarded folder), with
    its saved parameters, on ``device``. RuntimeError where the model's config names no saved
    scorer; InputError where the folder does not hold it."""
    config = getattr(module, "config", None)
    spec = getattr(config, CONFIG_SPEC_ATTR, None)
    layout = getattr(config, LAYOUT_KEY, None)
    if spec is None:
        raise _no_scorer(module, "its config names no saved scorer")
    template = (layout or {}).get(type(module).__name__)
    layer = getattr(module, "layer_idx", None)
    if template is None or not isinstance(layer, int):
        raise _no_scorer(module, f"the folder's config.json has no {LAYOUT_KEY} entry for it")
    prefix = template.replace(LAYER_FIELD, str(layer)) + SCORER_KEY
    with torch.inference_mode(False), torch.no_grad():  # parameters that can train later
        scorer = make_scorer(spec, num_heads=num_heads(module, module))
        expected = set(scorer.state_dict())
        if expected:
            file = _scorer_file(config)
            try:
                stat = file.stat()
            except OSError:
                raise InputError(f"{file.parent} has no {SCORER_FILE} for scorer '{spec}'") from None
            tensors = _read(str(file), (stat.st_mtime_ns, stat.st_size))
            own = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            if not tensors and file.name == WEIGHTS_FILE:  # model.save_pretrained before any forward
                raise InputError(
                    f"{file.parent} has no {SCORER_FILE} and its weights hold no scorer for '{spec}': "
                    "save a model with ssacli.save_model(model, DIR) (model.save_pretrained writes the "
                    "scorers only once they are attached: ssacli.transformers.attach(model))"
                )
            if set(own) != expected:
                raise InputError(
                    f"{file} does not match scorer '{spec}' at {prefix.rstrip('.')} (expected "
                    f"{sorted(expected)}, found {sorted(own)}); re-create the folder"
                )
            scorer.load_state_dict(own)
        if device is not None:
            scorer.to(device=device)
    scorer.train(module.training)
    return scorer


def scorer_on_first_use(module: nn.Module, device: torch.device) -> Scorer:
    """Attach ``module``'s saved scorer (:func:`saved_scorer`) and return it: the registered attention
    function's answer to a module without one."""
    scorer = saved_scorer(module, device)
    setattr(module, SCORER_ATTR, scorer)
    keep_guard(module.config, ATTENTION_NAME)  # the concrete class's config too (Auto's already does)
    return scorer


def attach_pending(model: nn.Module) -> nn.Module:
    """Attach every scorer that a plain transformers load left to the first forward (a model whose
    config says attn_implementation 'ssacli' and names a saved scorer); a model without any is
    returned as it is."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != ATTENTION_NAME:
        return model
    if getattr(config, CONFIG_SPEC_ATTR, None) is None:
        return model
    for name, module in attention_modules(model):
        if getattr(module, SCORER_ATTR, None) is None:
            setattr(module, SCORER_ATTR, saved_scorer(module, execution_device(model, name)))
    keep_guard(config, ATTENTION_NAME)
    if not hasattr(model, ORIGINAL_ATTR):  # what ssacli.restore goes back to, as after load_model
        setattr(model, ORIGINAL_ATTR, "eager")
    return model
