"""The model_type a guarded config.json declares, the way back to the original's, and the config
class that writes the guard back when saved (:func:`keep_guard`): torch-free, because
:mod:`ssacli.transformers_hook` (imported by ``import ssacli``) registers these types with
transformers and must not import torch. Part of the guard (:mod:`.guard`, which re-exports it).

In layout 3, the one written now, a guarded folder's ``model_type`` is :func:`guarded_type` of the original
(``"llama (needs import ssacli)"``), the original beside it in :data:`ORIGINAL_TYPE_KEY` (layout 1's
key, which every earlier ssacli maps back, so they read layout 3 folders too). Only
``import ssacli`` registers that type, so without it every ``AutoConfig`` / ``AutoModel*`` /
``pipeline`` refuses the folder before any model is built, whatever ``attn_implementation`` is
passed, with transformers' own message for an unknown type, which quotes the type:

    The checkpoint you are trying to load has model type `llama (needs import ssacli)` but
    Transformers does not recognize this architecture. …

Why a type with spaces rather than an identifier: that quoted type is the one part of transformers'
refusal a folder controls (a refusal raised by ssacli's code is impossible where ssacli is not
imported), and the user must read ``import ssacli`` in it, not a name to look up. transformers
uses a registered model_type only as a key of its config mapping (module names are derived only
for its own types), so spaces are harmless there. The mechanisms transformers offers otherwise do
not fit: ``auto_map`` asks the user for ``trust_remote_code=True`` (and would run code from the
folder), and no config key is validated at load time for every family.
"""

from __future__ import annotations

import json
from typing import Any

GUARDED_TYPE_SUFFIX = " (needs import ssacli)"  # layout 3, the one written now
GUARDED_TYPE_PREFIX = "ssacli-"  # layout 1, the first: model_type "ssacli-<type>", still read
ORIGINAL_TYPE_KEY = "ssacli_model_type"  # layouts 1 and 3: the original model_type
# layouts 2 and 3: transformers' own key for the attention implementation (read from config.json by
# PreTrainedConfig, never written back by save_pretrained: :func:`keep_guard` writes it back)
ATTENTION_KEY = "attn_implementation"


def guarded_type(original: str) -> str:
    """The model_type a guarded config.json declares for a model of type ``original``."""
    return base_type(original) + GUARDED_TYPE_SUFFIX


def is_guarded_type(model_type: Any) -> bool:
    """Whether ``model_type`` is one only ssacli knows (layout 3, or layout 1's prefix)."""
    return isinstance(model_type, str) and (
        model_type.endswith(GUARDED_TYPE_SUFFIX) or model_type.startswith(GUARDED_TYPE_PREFIX)
    )


def base_type(model_type: str) -> str:
    """The original family of a model_type, guarded (either layout) or not: what every reader of a
    family (kinds, audited families, messages) works with."""
    if model_type.endswith(GUARDED_TYPE_SUFFIX):
        return model_type[: -len(GUARDED_TYPE_SUFFIX)]
    if model_type.startswith(GUARDED_TYPE_PREFIX):
        return model_type[len(GUARDED_TYPE_PREFIX) :]
    return model_type


def plain_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config.json dict with its original model_type back (ORIGINAL_TYPE_KEY, else the
    guarded name read back) and ORIGINAL_TYPE_KEY removed; every other key is kept."""
    plain = dict(config)
    original = plain.pop(ORIGINAL_TYPE_KEY, None)
    model_type = plain.get("model_type")
    if isinstance(original, str):
        plain["model_type"] = original
    elif isinstance(model_type, str):
        plain["model_type"] = base_type(model_type)
    return plain


def keep_guard(config: Any, attention: str) -> None:
    """Make a transformers config built from a guarded folder write the guard back when saved
    (``model.save_pretrained``, ``config.save_pretrained``), as long as the model still runs
    ``attention`` (ssacli's): without it transformers writes the original model type and no
    attention implementation, a folder that every plain path then runs as softmax. After
    ``ssacli.restore`` (or an explicit ``attn_implementation=``) it writes the plain config of the
    softmax model it then is. Idempotent."""
    if not getattr(type(config), "_ssacli_keeps_guard", False):
        config.__class__ = _guarding(type(config), attention)


_GUARDING: dict[tuple[type, str], type] = {}


def _guarding(base: type, attention: str) -> type:
    """``base`` with a ``to_json_string`` that writes the guard (every JSON save goes through it;
    ``to_dict``, which transformers also uses in memory, is left alone). It keeps ``base``'s name,
    module and model_type: transformers' Auto mappings look a config class up by its name, and
    every reader of ``model.config`` sees the original. Pickles (and deep-copies) as itself."""
    key = (base, attention)
    if key not in _GUARDING:

        def to_json_string(self, use_diff: bool = True) -> str:
            text = base.to_json_string(self, use_diff=use_diff)
            if getattr(self, "_attn_implementation", None) != attention:
                return text
            config = json.loads(text)
            original = base_type(config.get("model_type") or base.model_type)
            config.update({"model_type": guarded_type(original), ORIGINAL_TYPE_KEY: original})
            config[ATTENTION_KEY] = attention
            return json.dumps(config, indent=2, sort_keys=True) + "\n"

        def __reduce__(self):
            return _rebuild, (base, attention), self.__dict__

        namespace = {"to_json_string": to_json_string, "__reduce__": __reduce__, "_ssacli_keeps_guard": True}
        namespace.update({"__module__": base.__module__, "__qualname__": base.__qualname__})
        _GUARDING[key] = type(base.__name__, (base,), namespace)
    return _GUARDING[key]


def _rebuild(base: type, attention: str) -> Any:
    cls = _guarding(base, attention)
    return cls.__new__(cls)


__all__ = [
    "ATTENTION_KEY",
    "GUARDED_TYPE_PREFIX",
    "GUARDED_TYPE_SUFFIX",
    "ORIGINAL_TYPE_KEY",
    "base_type",
    "guarded_type",
    "is_guarded_type",
    "keep_guard",
    "plain_config_dict",
]
