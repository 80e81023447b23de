"""What plain transformers sees of a folder ssacli wrote: config.json's guard (part of the format
:mod:`ssacli.models.checkpoint` owns; that module re-exports these names).

A folder may load in plain transformers as the original architecture, with softmax, only where
that is the same model (:func:`plain_loadable`). Any other folder's config.json is guarded
(:func:`guard_config`) so that no plain transformers path runs it as softmax. Three layouts of the
guard exist; ssacli reads all three (:func:`saved_config`), and ssacli.json's format_version stays 1
(ssacli.json did not change, and an ssacli that knows only layout 1 reads the others as an ordinary
folder with a saved scorer, which they are):

* **layout 3** (the one written now): layout 2 with ``model_type`` :func:`.guard_type.guarded_type`
  of the original (``"llama (needs import ssacli)"``), the original in :data:`ORIGINAL_TYPE_KEY`.
  Without ssacli, ``AutoConfig``, every ``AutoModel*`` and ``pipeline`` refuse the folder whatever
  ``attn_implementation`` is passed, with a message quoting that type (:mod:`.guard_type` says why
  this mechanism). ``import ssacli`` registers the type (:mod:`ssacli.transformers_hook`): AutoConfig
  then builds the original type's config with layout 2's keys, so the model is built as in layout 2;
  that config writes the guard back when saved while the model runs ssacli's attention
  (:func:`.guard_type.keep_guard`), so ``model.save_pretrained`` keeps it.
  The concrete class (``LlamaForCausalLM``) reads config.json whatever its model_type (transformers
  only warns, quoting the type): without ``attn_implementation=`` it refuses as in layout 2; with an
  explicit ``attn_implementation="sdpa"`` or ``"eager"`` it builds the softmax model, and only the
  warning ("You are using a model of type `llama (needs import ssacli)` to instantiate a model of
  type `llama`…") says so. transformers offers no way for a folder to stop that.
* **layout 2** (written before layout 3; CHANGELOG.md dates each): ``model_type`` stays the
  original; config.json adds ``"attn_implementation": "ssacli"`` (:data:`ATTENTION_KEY`), which
  transformers reads back from config.json and refuses at model construction ("Specified
  `attn_implementation="ssacli"` is not supported") unless ssacli registered that attention
  (``import ssacli``); then the model loads with its scorer (attached on its first forward,
  :mod:`ssacli.models.first_use`, from the layout in :data:`LAYOUT_KEY` and SCORER_FILE). An
  explicit ``attn_implementation=`` to any Auto class replaced the saved one: softmax, silently.
  Still loads, by ssacli and by Auto classes.
* **layout 1** (the first): ``model_type: ssacli-<type>``, the real one in :data:`ORIGINAL_TYPE_KEY`.
  Plain ``AutoConfig`` / ``AutoModel*`` refuse it; only ssacli loads it. Never written any more.

All hold a note (:data:`GUARD_NOTE_KEY`) saying what the folder is and how to load it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from ..attention.interface import ATTENTION_NAME, attention_modules
from ..errors import InputError
from .guard_type import (  # noqa: F401 (layouts 1 and 3's names, torch-free there; re-exported)
    ATTENTION_KEY,
    GUARDED_TYPE_PREFIX,
    GUARDED_TYPE_SUFFIX,
    ORIGINAL_TYPE_KEY,
    guarded_type,
    is_guarded_type,
    keep_guard,
    plain_config_dict,
)

# layouts 2 and 3: where each attention class's modules sit in the state dict: {class name: module
# name with "{layer}" for its layer_idx} (ATTENTION_KEY, the implementation's key: .guard_type)
LAYOUT_KEY = "ssacli_attention"
LAYER_FIELD = "{layer}"
# all layouts
GUARD_NOTE_KEY = "ssacli_note"

# What the record of a plain conversion holds, and nothing else: any other key (``training``, the
# conversion recipe's ``recipe``, whatever a later writer adds) means the weights or the scorer
# changed after the fidelity was measured, so the folder is guarded (safe by default: the recipe's
# n = 4 model once loaded silently as softmax because only ``training`` was looked for).
# ``source_weights`` (the source's commit or content hash) is provenance, not a change.
PLAIN_CONVERSION_KEYS = frozenset({"source", "source_weights", "fidelity"})


def plain_loadable(scorer: str, meta: dict[str, Any]) -> bool:
    """Whether plain transformers may load the folder (as softmax): its scorer is softmax, or it is
    a conversion from softmax and nothing since (its record holds only PLAIN_CONVERSION_KEYS) whose
    fidelity met its target (the faithful start: softmax within --max-error by measurement)."""
    if scorer == "softmax":
        return True
    fidelity = meta.get("fidelity") or {}
    met = (fidelity.get("target") or {}).get("met") is True
    return set(meta) <= PLAIN_CONVERSION_KEYS and fidelity.get("from") == "softmax" and met


def attention_layout(model: nn.Module) -> dict[str, str] | None:
    """{attention class name: its modules' state-dict name with LAYER_FIELD for the layer}: how a
    module that plain transformers built finds its scorer's saved tensors (it knows its class and
    ``layer_idx``, not its name). None where that does not tell every module apart (a module without
    an int ``layer_idx`` or without the model's own config, one class at two kinds of place, e.g.
    an encoder-decoder's self- and cross-attention): such a folder loads only through ssacli."""
    layout: dict[str, str] = {}
    for name, module in attention_modules(model):
        layer = getattr(module, "layer_idx", None)
        parts = name.split(".")
        at = [i for i, part in enumerate(parts) if part == str(layer)]
        if not isinstance(layer, int) or getattr(module, "config", None) is not model.config or len(at) != 1:
            return None
        parts[at[0]] = LAYER_FIELD
        template = ".".join(parts)
        if layout.setdefault(type(module).__name__, template) != template:
            return None
    return layout or None


def guard_config(file: Path, scorer: str, layout: dict[str, str] | None) -> None:
    """Rewrite a saved config.json in layout 3: plain transformers' Auto classes and pipeline refuse
    the folder unless ``import ssacli`` registered its model type, and then build the original
    architecture with ssacli's attention and the scorer (``layout``: see :func:`attention_layout`;
    None: even then only ssacli loads it, and the first forward says so)."""
    config = plain_config_dict(json.loads(file.read_text(encoding="utf-8")))
    original = config["model_type"]
    config.update({"model_type": guarded_type(original), ORIGINAL_TYPE_KEY: original})
    config[ATTENTION_KEY] = ATTENTION_NAME
    config[GUARD_NOTE_KEY] = (
        f"a {original} model whose attention scorer is {scorer}, not softmax: `import ssacli` before "
        "loading it with transformers (AutoModel*, pipeline), which then builds it with the scorer; "
        "with softmax attention it would be another model. ssacli.load_model and every ssacli "
        "command load it too"
    )
    if layout is not None:
        config[LAYOUT_KEY] = layout
    else:
        config.pop(LAYOUT_KEY, None)
    file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def guarded(config: dict[str, Any]) -> bool:
    """Whether a config.json (as a dict) is guarded, in any layout."""
    declared = is_guarded_type(config.get("model_type")) and isinstance(config.get(ORIGINAL_TYPE_KEY), str)
    return config.get(ATTENTION_KEY) == ATTENTION_NAME or declared  # layouts 2-3, or 1 and 3


def saved_config(path: str | Path) -> Any | None:
    """The transformers config of a folder whose config.json is guarded (any layout), as an
    ordinary config of its original model type: the guard's keys removed, no attention
    implementation set (the caller chooses one and attaches the scorer). None for any other folder
    (unguarded, or config.json unreadable)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not guarded(config):
        return None
    from transformers import CONFIG_MAPPING

    config = plain_config_dict(config)
    for key in (ATTENTION_KEY, LAYOUT_KEY, GUARD_NOTE_KEY):
        config.pop(key, None)
    original = config.get("model_type")
    try:
        return CONFIG_MAPPING[original].from_dict(config)
    except KeyError:
        raise InputError(
            f"{path} holds a {original} model, which this transformers does not know; upgrade transformers"
        ) from None
