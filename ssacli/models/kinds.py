"""What kind of model this is: the one answer, for a loaded model, a config, a model_type or a reference.

A kind is a :class:`ModelKind` (a ``str`` enum: results and configs write its value):

* ``icl``: ssacli's in-context-learning model (a GPT-2 backbone between scalar read-in and read-out);
* ``causal``: a decoder-only language model (causal attention);
* ``masked``: a masked-language model (bidirectional attention with an LM head);
* ``encoder``: any other encoder (bidirectional attention, hidden states out);
* ``seq2seq``: an encoder-decoder.

The decision reads the architecture's class name (``…ForCausalLM``, ``…LMHeadModel``,
``…ForMaskedLM``) when there is one, and transformers' auto mappings for the family otherwise.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from enum import StrEnum
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError


class ModelKind(StrEnum):
    ICL = "icl"
    CAUSAL = "causal"
    MASKED = "masked"
    ENCODER = "encoder"
    SEQ2SEQ = "seq2seq"

    @property
    def with_article(self) -> str:
        """ "a causal", "an encoder", "an icl": the kind as a message says it before "model"."""
        return f"{'an' if self.value[0] in 'aeiou' else 'a'} {self.value}"


KINDS = tuple(ModelKind)  # every kind, in the order above (config validation, help text)
ICL_FAMILY = "icl-gpt2"  # the model_type ssacli reports for its ICL models
BUILTIN_PREFIX = "builtin:"  # MODEL references to the checkpoints bundled with ssacli
# "name" or "owner/name" on the Hugging Face Hub, optionally "@REV" (a branch, tag or commit)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?$")

_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_MASKED_SUFFIX = "ForMaskedLM"


def is_local_reference(ref: str) -> bool:
    """Whether MODEL names something on this machine (``builtin:NAME``, an existing path, a path whose
    folder exists here — ``models/nope`` beside a ``models/`` folder is a missing local folder, not a
    Hub question — or anything that cannot be a Hub id) rather than a Hub id."""
    path = Path(ref).expanduser()
    in_a_folder_here = path.parent != Path(".") and path.parent.is_dir()
    return ref.startswith(BUILTIN_PREFIX) or path.exists() or in_a_folder_here or not HUB_ID.match(ref)


def is_causal_family(model_type: str) -> bool:
    """Decoder-only families (causal attention) as transformers' auto mappings list them."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    causal, masked = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return model_type in causal and model_type not in masked


def language_model_kind(model_type: str | None) -> ModelKind | None:
    """``masked`` or ``causal``: the LM head a family is trained with (encoders such as bert also have
    a causal head, but are pretrained as MLMs), or None when transformers has no LM head for it."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return ModelKind.MASKED
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return ModelKind.CAUSAL
    return None


def family_kind(model_type: str) -> ModelKind:
    """The kind when nothing but the family (``model_type``) is known: icl, causal or encoder."""
    if model_type.startswith("icl"):
        return ModelKind.ICL
    return ModelKind.CAUSAL if is_causal_family(model_type) else ModelKind.ENCODER


def kind_of(model: Any) -> ModelKind:
    """The kind of a loaded model (ssacli's ICL model, or a transformers model), from its class."""
    if hasattr(model, "spec") and hasattr(model, "backbone"):
        return ModelKind.ICL
    return _decide(model.config, (type(model).__name__,))


def kind_from_config(source: Any, *, name: str | None = None) -> ModelKind:
    """The kind read from a config alone (no weights are loaded, so it is instant for any size).

    ``source``: a transformers config, or a folder (an ssacli ICL checkpoint or a save_pretrained
    folder) or Hub id whose config.json is read from disk or the local cache only. ``name`` is what
    error messages call it (default: ``source``)."""
    if isinstance(source, str | Path):
        from .builtins import ICL_FORMAT, folder_format
        from .checkpoint import saved_config

        if Path(source).is_dir() and folder_format(source) == ICL_FORMAT:
            return ModelKind.ICL
        from transformers import AutoConfig

        try:
            guarded = saved_config(source) if Path(source).is_dir() else None
            source = guarded or AutoConfig.from_pretrained(
                source, local_files_only=True, trust_remote_code=False
            )
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0]
            raise InputError(f"cannot read the config of '{name or source}': {first}") from None
    return _decide(source, getattr(source, "architectures", None) or ())


def max_positions(config: Any) -> int | None:
    """The longest input the model's position table covers, when its config says (else None)."""
    for attr in ("max_position_embeddings", "n_positions", "max_positions", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _decide(config: Any, class_names: Iterable[str]) -> ModelKind:
    if getattr(config, "is_encoder_decoder", False):
        return ModelKind.SEQ2SEQ
    names = tuple(class_names)
    if any(n.endswith(_CAUSAL_SUFFIXES) for n in names):
        return ModelKind.CAUSAL
    if any(n.endswith(_MASKED_SUFFIX) for n in names):
        return ModelKind.MASKED
    return ModelKind.CAUSAL if is_causal_family(config.model_type) else ModelKind.ENCODER


def declared_kind(path: Path) -> ModelKind | None:
    """The kind a local folder's files decide without transformers or torch: ssacli's ICL format, an
    encoder-decoder config, an architecture named …ForCausalLM, …LMHeadModel or …ForMaskedLM, or
    else the family, as transformers' auto mappings list it (:func:`declared_family_kind`: a bare
    ``BertModel`` is an encoder); None where only the loaded config can tell, or the config cannot
    be read (loading says why)."""
    from .builtins import ICL_FORMAT, folder_format

    if folder_format(path) == ICL_FORMAT:
        return ModelKind.ICL
    config = config_json(path)
    if config is None:
        return None
    if config.get("is_encoder_decoder"):
        return ModelKind.SEQ2SEQ
    names = config.get("architectures") or ()
    names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    if any(n.endswith(_CAUSAL_SUFFIXES) for n in names):
        return ModelKind.CAUSAL
    if any(n.endswith(_MASKED_SUFFIX) for n in names):
        return ModelKind.MASKED
    return declared_family_kind(config.get("model_type"))


def config_json(path: str | Path) -> dict[str, Any] | None:
    """A folder's config.json as the JSON object it holds, or None where it is missing, unreadable
    or not an object (never raises: for the checks that read a folder's headers)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return config if isinstance(config, dict) else None


# the auto mappings that decide a family's kind when its architecture does not (is_causal_family)
_CAUSAL_TABLE, _MASKED_TABLE = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"


def declared_family_kind(model_type: object) -> ModelKind | None:
    """What :func:`family_kind` says of ``model_type``, read without importing transformers (which
    imports torch) from its auto mappings' source (:func:`auto_mapping_names`); None where that
    source cannot be read, the family is in neither LM mapping, or a mapping says it may be an
    encoder-decoder (:func:`_may_be_seq2seq`: then only the loaded config's ``is_encoder_decoder``
    tells, :func:`_decide`)."""
    tables = auto_mapping_names()
    if not isinstance(model_type, str) or tables is None:
        return None
    if any(_may_be_seq2seq(name, table.get(model_type)) for name, table in tables.items()):
        return None
    if model_type in tables.get(_MASKED_TABLE, {}):
        return ModelKind.ENCODER  # pretrained as an MLM: is_causal_family says no, so an encoder
    return ModelKind.CAUSAL if model_type in tables.get(_CAUSAL_TABLE, {}) else None


@cache
def auto_mapping_names() -> dict[str, dict[str, object]] | None:
    """transformers' auto mappings ``MODEL_…_MAPPING_NAMES`` (model_type -> class names), read as the
    literals its modeling_auto.py writes them, without running it; None when that file is not there
    or not as expected (a check that needs them is then left to loading)."""
    tree = transformers_source("models", "auto", "modeling_auto.py")
    if tree is None:
        return None
    tables: dict[str, dict[str, object]] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not isinstance(target, ast.Name) or not target.id.endswith("_MAPPING_NAMES"):
            continue
        call = node.value
        items = call.args[0] if isinstance(call, ast.Call) and len(call.args) == 1 else None
        if not isinstance(items, ast.List) or call.keywords:
            return None  # not an OrderedDict([...]) any more: read nothing rather than half
        table: dict[str, object] = {}
        for item in items.elts:
            included = _included_table(item, tables)  # *list(OTHER_MAPPING_NAMES.items())
            try:
                table.update(included if included is not None else [ast.literal_eval(item)])
            except (ValueError, TypeError, SyntaxError):
                return None
        tables[target.id] = table
    return tables if _CAUSAL_TABLE in tables and _MASKED_TABLE in tables else None


def transformers_source(*parts: str) -> ast.Module | None:
    """A file of the installed transformers (``parts`` under its package folder) parsed, never run
    (importing transformers imports torch); None when it is not there or does not parse."""
    spec = find_spec("transformers")  # a top-level name: finds, never imports
    if spec is None or spec.origin is None:
        return None
    try:
        return ast.parse((Path(spec.origin).parent.joinpath(*parts)).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


def _may_be_seq2seq(table: str, entry: object) -> bool:
    """Whether a mapping's entry for a family says it may be an encoder-decoder: a sequence-to-sequence
    mapping lists it, or its class is a …ForConditionalGeneration."""
    if entry is None:
        return False
    return "SEQ_TO_SEQ" in table or "SEQ_2_SEQ" in table or "ForConditionalGeneration" in str(entry)


def _included_table(item: ast.expr, tables: dict[str, dict[str, object]]) -> dict[str, object] | None:
    """The table an item ``*list(NAME.items())`` of a mapping includes, when NAME was read before."""
    call = item.value if isinstance(item, ast.Starred) else None
    inner = call.args[0] if isinstance(call, ast.Call) and len(call.args) == 1 else None
    items = inner.func if isinstance(inner, ast.Call) and not inner.args else None
    if isinstance(items, ast.Attribute) and items.attr == "items" and isinstance(items.value, ast.Name):
        return tables.get(items.value.id)
    return None


def different_kinds(names: tuple[str, str], refs: tuple[str, str], kinds: tuple[str, str]) -> InputError:
    """Two sides of a comparison of different kinds (``names``: BEFORE, AFTER, CONTROL)."""
    return InputError(
        f"{names[0]} '{refs[0]}' is {ModelKind(kinds[0]).with_article} model and {names[1]} '{refs[1]}' "
        f"{ModelKind(kinds[1]).with_article} one; compare models of one kind"
    )


def text_of_no_use(ref: str) -> UsageError:
    """``--text`` (``text=``) given for an ICL model, whose probe prompts are always its task's: the
    text would be silently unused, so it is refused."""
    return UsageError(f"--text has no effect on '{ref}': an ICL model is probed with prompts of its own "
                      "task; drop --text, or give a language model")  # fmt: skip


def not_icl(ref: str, kind: str) -> InputError:
    """A model of another kind given where an ICL model is needed (``icl eval``)."""
    return InputError(
        f"{ref} is {ModelKind(kind).with_article} model; icl eval needs an ICL model (train one with "
        "`ssacli icl train --task every --out DIR`, or give builtin:every-softmax)"
    )
