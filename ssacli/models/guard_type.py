"""The model_type a guarded config.json declares, and the way back to the original's: torch-free,
because :mod:`ssacli.transformers_hook` (imported by ``import ssacli``) registers these types with
transformers and must not import torch. Part of the guard (:mod:`.guard`, which re-exports it).

Since issue 51 (layout 3) a guarded folder's ``model_type`` is :func:`guarded_type` of the original
(``"llama (needs import ssacli)"``), the original beside it in :data:`ORIGINAL_TYPE_KEY`. Only
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

from typing import Any

GUARDED_TYPE_SUFFIX = " (needs import ssacli)"  # layout 3 (since issue 51)
GUARDED_TYPE_PREFIX = "ssacli-"  # layout 1 (before issue 38): model_type "ssacli-<type>", still read
ORIGINAL_TYPE_KEY = "ssacli_model_type"  # layouts 1 and 3: the original model_type


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


__all__ = [
    "GUARDED_TYPE_PREFIX",
    "GUARDED_TYPE_SUFFIX",
    "ORIGINAL_TYPE_KEY",
    "base_type",
    "guarded_type",
    "is_guarded_type",
    "plain_config_dict",
]
