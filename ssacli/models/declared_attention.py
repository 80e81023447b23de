"""How many attention layers, and heads in each, a local folder's config.json declares, read without
torch or transformers: enough to refuse a head that is not there before the model stack loads
(issue 54; ``ssacli attribute --heads``).

The counts are transformers' standard config attributes ``num_hidden_layers`` and
``num_attention_heads``, which a family's config class may keep under keys of its own (its
``attribute_map``: GPT-2's ``n_layer`` and ``n_head``). That map is read as the family's
configuration file writes it, never run (:func:`config_attribute_map`), as
:func:`~ssacli.models.kinds.auto_mapping_names` reads the auto mappings.

What a config declares is a bound, not the count loading finds: a hybrid stack has fewer attention
layers than decoder layers (its Mamba or linear-attention layers are not attention that ssacli
routes). A head beyond the bound is in no layer loading can find; a head within it is left to the
check after loading. Where the attention modules could outnumber the declared layers or heads, the
config declares nothing here (None): an encoder-decoder family (also built as a decoder alone, with
cross-attention in each layer), cross-attention in a decoder, nested sub-configs (a multimodal
model's towers), another count of layers beside the declared one (a second stack), heads given per
layer, code of the checkpoint's own (``auto_map``), a family whose configuration file is not where
transformers keeps its families or not as expected.
tests/models/test_declared_attention.py holds the bound against the models every causal family
of the installed transformers builds.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any

from .guard_type import plain_config_dict
from .kinds import config_json, transformers_source

LAYERS, HEADS = "num_hidden_layers", "num_attention_heads"  # transformers' standard names
# the classes a family's config may derive from and still hold all of its attribute_map itself
_ROOT_CONFIGS = {"PreTrainedConfig", "PretrainedConfig", "BackboneConfigMixin"}


def declared_attention(path: str | Path) -> tuple[int, int] | None:
    """(layers, heads per layer) that the config.json of folder ``path`` declares: bounds of the
    attention loading finds; None where the config cannot tell (module docstring)."""
    config = config_json(path)
    if config is None:
        return None
    config = plain_config_dict(config)  # a folder ssacli guarded: its original family
    if config.get("is_encoder_decoder") or config.get("add_cross_attention") or "auto_map" in config:
        return None
    if any(isinstance(value, dict) and "model_type" in value for value in config.values()):
        return None  # sub-configs: attention stacks the top level does not count
    model_type = config.get("model_type")
    names = config_attribute_map(model_type) if isinstance(model_type, str) else None
    if names is None:
        return None
    keys = [names.get(name, name) for name in (LAYERS, HEADS)]
    if any(part in key for key in keys for part in ("encoder", "decoder")):
        return None  # an encoder-decoder family's config (also when built as a decoder alone)
    if any(_count(value) and _names_layers(key) and key != keys[0] for key, value in config.items()):
        return None  # another count of layers: a second stack, shared or predicting layers
    if any(isinstance(value, list) and "heads" in key for key, value in config.items()):
        return None  # heads per layer
    counts = [config.get(key) for key in keys]
    if not all(_count(n) for n in counts):
        return None  # not written (the class default applies): loading tells
    return counts[0], counts[1]


def _names_layers(key: str) -> bool:
    """A key that counts layers (``num_layers_per_stack``, ``n_layers``), not one that indexes them
    (``max_window_layers``)."""
    return key.startswith(("num_", "n_")) and "layers" in key


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@cache
def config_attribute_map(model_type: str) -> dict[str, str] | None:
    """The ``attribute_map`` of the config class of family ``model_type`` ({} when it has none),
    read from ``models/<family>/configuration_<family>.py`` of the installed transformers: the
    class there that declares this ``model_type``. None when there is no such file or class, the
    class derives from another family's config (whose map it may inherit), or its map is not a
    literal."""
    module = model_type.replace("-", "_")
    tree = transformers_source("models", module, f"configuration_{module}.py")
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ClassDef) and _class_value(node, "model_type") == model_type:
            bases = {base.id if isinstance(base, ast.Name) else None for base in node.bases}
            if not bases <= _ROOT_CONFIGS:
                return None
            found = _class_value(node, "attribute_map", {})
            valid = isinstance(found, dict) and all(isinstance(v, str) for v in found.values())
            return found if valid else None
    return None


_INVALID = object()


def _class_value(node: ast.ClassDef, name: str, default: Any = None) -> Any:
    """The literal a class body assigns to ``name`` (``default`` when it assigns none)."""
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == name:
            try:
                return ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError):
                return _INVALID
    return default
