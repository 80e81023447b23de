"""MODEL references as paths, with no torch behind them: ``builtin:NAME`` and local folders resolved,
and a reference that names nothing refused before the model stack is imported (the CLI checks MODEL
here first; :mod:`ssacli.models.loading` resolves references with the same functions). A local
folder is read as far as its files' headers go (:func:`check_folder`): a config.json, weights, and
safetensors headers that are whole, each refused with the message loading would give.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, UsageError
from .builtins import BUILTIN_DIR, META_FILE, builtin_names
from .kinds import (
    BUILTIN_PREFIX,
    ModelKind,
    declared_kind,
    different_kinds,
    is_local_reference,
    not_icl,
    text_of_no_use,
)

CONFIG_FILE = "config.json"


def resolve_model_path(ref: str) -> Path:
    """``builtin:NAME`` -> the bundled folder; anything else must be an existing local folder."""
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        path = BUILTIN_DIR / name
        if name not in builtin_names():
            available = ", ".join(BUILTIN_PREFIX + n for n in builtin_names()) or "(none installed)"
            raise UsageError(f"no bundled model '{ref}'; available: {available}")
        return path
    path = Path(ref).expanduser()
    if not path.exists():
        raise InputError(f"model path '{ref}' does not exist; give a checkpoint folder or builtin:NAME")
    if not path.is_dir():
        raise InputError(f"model path '{ref}' is a file; give the checkpoint folder that contains it")
    return path


def local_model_path(ref: str) -> Path | None:
    """The folder MODEL names, when it is a builtin or an existing local path (else None); never
    raises, for cheap checks before loading."""
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        return BUILTIN_DIR / name if name in builtin_names() else None
    path = Path(ref).expanduser()
    return path if path.exists() else None


def check_reference(
    ref: str, offline: bool = False, revision: str | None = None, allow_pickle: bool = False
) -> None:
    """Refuse, as loading would, a ``builtin:NAME`` that is not bundled, a local path that does
    not exist (:func:`ssacli.models.kinds.is_local_reference`: ``./nope``, ``models/nope`` beside a
    ``models/`` folder), a folder whose headers are not a model's (:func:`check_folder`; pickle-only
    weights unless ``allow_pickle``, as :class:`~ssacli.models.options.LoadOptions` has it), and
    offline a Hub id not in the cache (:func:`ssacli.models.hub.check_available`, no network asked);
    anything that exists (a folder, a .gguf file) passes."""
    if revision is not None and is_local_reference(ref):
        raise UsageError(f"--revision applies to Hub ids (org/name), not to the local model '{ref}'")
    if ref.startswith(BUILTIN_PREFIX) or (is_local_reference(ref) and not Path(ref).expanduser().exists()):
        resolve_model_path(ref)
    elif is_local_reference(ref):
        if gguf_file(ref) is None:
            check_folder(ref, resolve_model_path(ref), allow_pickle)  # a file that is not .gguf: "is a file"
    else:
        from .hub import check_available

        check_available(ref, revision, offline)


def fetch_reference(ref: str, offline: bool = False, revision: str | None = None) -> None:
    """A Hub id downloaded into the cache now, unless it is there (:func:`ssacli.models.hub.fetch`:
    its download bars before any live display); anything else is left to loading."""
    if not ref.startswith(BUILTIN_PREFIX) and not is_local_reference(ref):
        from .hub import fetch

        fetch(ref, revision, offline)


def gguf_file(ref: str) -> Path | None:
    """The .gguf file MODEL names: the file itself, or the one .gguf in a folder without config.json."""
    path = Path(str(ref)).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    if path.is_dir() and not (path / CONFIG_FILE).exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise UsageError(f"'{ref}' holds several GGUF files ({names}); give the one to load")
    return None


def no_config(ref: str) -> InputError:
    return InputError(
        f"'{ref}' has no config.json; give a folder written by save_pretrained (or builtin:NAME)"
    )


def corrupt_weights(ref: str, err: BaseException) -> InputError:
    """A .safetensors file that cannot be read (a corrupt or truncated header or body)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return InputError(
        f"cannot load the weights of '{ref}': {first}; the file is corrupt or truncated, re-create or "
        "re-download it"
    )


def check_weights(path: Path, allow_pickle: bool) -> None:
    """Refuse a folder without weights, or (unless ``allow_pickle``) with pickle weights only."""
    if any(path.glob("*.safetensors")):
        return
    if any(path.glob("*.bin")) or any(path.glob("*.pt")) or any(path.glob("*.pth")):
        if allow_pickle:
            return
        raise InputError(
            f"'{path}' holds only pickle weights (.bin/.pt), which can run code when loaded; convert them "
            "to safetensors, or pass --allow-pickle if you trust the file (loaded with weights_only=True)"
        )
    raise InputError(f"'{path}' has no weights (*.safetensors); is the checkpoint complete?")


def check_folder(ref: str, path: Path, allow_pickle: bool = False) -> None:
    """A local model folder as far as its headers tell, before torch: a config.json that is a JSON
    object (ssacli's own folders, which hold an ssacli.json, are checked when they load), weights
    (pickle-only ones only with ``allow_pickle``: :func:`check_weights`, as loading refuses them), and every
    .safetensors header whole and covering its file (read by safetensors itself, with numpy: no
    tensor is read)."""
    config = path / CONFIG_FILE
    if not config.is_file():
        if (path / META_FILE).is_file():
            return
        raise no_config(ref)
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"cannot read the config of '{ref}': {err}; check its config.json") from None
    if not isinstance(data, dict):
        raise InputError(f"cannot read the config of '{ref}': not a JSON object; check its config.json")
    check_weights(path, allow_pickle)
    from safetensors import SafetensorError, safe_open  # the header only; torch-free with numpy

    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="numpy"):
                pass
        except (OSError, SafetensorError) as err:
            raise corrupt_weights(ref, err) from None


def check_same_kind(refs: tuple[str | None, ...]) -> None:
    """Refuse, before any model loads, BEFORE and AFTER (and AFTER and CONTROL) whose local folders
    declare different kinds (:func:`~ssacli.models.kinds.declared_kind`), with the message loading
    them would end in; a kind only transformers can tell (or a Hub id's) is left to loading."""
    sides = ("BEFORE", "AFTER", "CONTROL")
    paths = [local_model_path(ref) if ref is not None else None for ref in refs]
    kinds = [declared_kind(path) if path is not None and path.is_dir() else None for path in paths]
    for i in range(len(refs) - 1):
        pair = (kinds[i], kinds[i + 1])
        if None not in pair and pair[0] != pair[1]:
            raise different_kinds(sides[i : i + 2], (refs[i], refs[i + 1]), pair)


def check_prompt_source(ref: str | None, *, text: bool) -> None:
    """Refuse, before any model loads, ``--text`` for a local folder (or bundled model) whose files
    declare an ICL model: its prompts are its task's, so the text would be ignored."""
    path = local_model_path(ref) if text and ref is not None else None
    if path is not None and path.is_dir() and declared_kind(path) == ModelKind.ICL:
        raise text_of_no_use(ref)


def check_icl_model(ref: str) -> None:
    """Refuse, before any model loads, a local folder whose files declare another kind than ICL
    (:func:`~ssacli.models.kinds.declared_kind`); what only loading can tell is left to it."""
    path = local_model_path(ref)
    kind = declared_kind(path) if path is not None and path.is_dir() else None
    if kind not in (None, ModelKind.ICL):
        raise not_icl(ref, kind)
