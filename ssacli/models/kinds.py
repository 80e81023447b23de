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

import json
import re
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..errors import InputError


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
    encoder-decoder config, or an architecture named …ForCausalLM, …LMHeadModel or …ForMaskedLM;
    None where only transformers' auto mappings can tell (a family without such an architecture,
    e.g. ``BertModel``), or the config cannot be read (loading says why)."""
    from .builtins import ICL_FORMAT, folder_format

    if folder_format(path) == ICL_FORMAT:
        return ModelKind.ICL
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if config.get("is_encoder_decoder"):
        return ModelKind.SEQ2SEQ
    names = config.get("architectures") or ()
    names = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    if any(n.endswith(_CAUSAL_SUFFIXES) for n in names):
        return ModelKind.CAUSAL
    if any(n.endswith(_MASKED_SUFFIX) for n in names):
        return ModelKind.MASKED
    return None


def different_kinds(names: tuple[str, str], refs: tuple[str, str], kinds: tuple[str, str]) -> InputError:
    """Two sides of a comparison of different kinds (``names``: BEFORE, AFTER, CONTROL)."""
    return InputError(
        f"{names[0]} '{refs[0]}' is {ModelKind(kinds[0]).with_article} model and {names[1]} '{refs[1]}' "
        f"{ModelKind(kinds[1]).with_article} one; compare models of one kind"
    )


def not_icl(ref: str, kind: str) -> InputError:
    """A model of another kind given where an ICL model is needed (``icl eval``)."""
    return InputError(
        f"{ref} is {ModelKind(kind).with_article} model; icl eval needs an ICL model (train one with "
        "`ssacli icl train --task every --out DIR`, or give builtin:every-softmax)"
    )
