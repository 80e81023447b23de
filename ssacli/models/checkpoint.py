# Long on purpose: the folder format's one owner (docs/architecture.md); a split spreads it or adds a cycle.
"""The checkpoint format: ssacli's part of every folder it writes, read and written only here (its
torch-free part, ssacli.json's name, formats, versions and reader, in :mod:`.builtins`, so that a
folder's record is checked before the model stack loads; re-exported here).

Every folder holds ``ssacli.json`` (:data:`META_FILE`), whose ``format`` says which of two layouts
the rest of the folder has:

* ``"ssacli-model"`` (:data:`MODEL_FORMAT`), written by ``convert``, ``finetune`` and ``train``: an
  ordinary ``save_pretrained`` folder plus the parts below. Plain transformers loads it as the
  original architecture, with softmax attention, only where that is the same model
  (:func:`plain_loadable`: softmax, or a faithful conversion not trained since); any other folder's
  config.json is guarded (:mod:`.guard`, which owns that part of the format: written now, model_type
  ``<type> (needs import ssacli)`` and ``attn_implementation: "ssacli"``, which plain
  transformers' Auto classes refuse unless ``import ssacli`` registered them, and then load with
  the scorer; the two earlier layouts, ``attn_implementation: "ssacli"`` alone and before it
  model_type ``ssacli-<type>``, are still read: :func:`saved_config` reads all three);

  - ``ssacli.json``: ``{"format", "format_version", "scorer": SPEC, "source"?, "fidelity"?,
    "training"?, …}``;
  - ``ssacli_scorer.safetensors`` (:data:`SCORER_FILE`): the scorer's parameters (SSA's per-head b
    and n, …) keyed by state-dict name, absent for a scorer without parameters; the config also
    records the spec as ``ssacli_scorer``.

* ``"ssacli-icl"`` (:data:`ICL_FORMAT`), written by ``icl train``: ``config.json`` (the GPT-2
  backbone's config), ``model.safetensors`` (:data:`WEIGHTS_FILE`: every weight, scorer parameters
  included) and ``ssacli.json``: ``{"format", "format_version", **ICLSpec}`` (task, scorer, sizes and
  the ``training`` record).

Either may hold ``trainer.safetensors`` (:data:`TRAINER_FILE`), what a run needs to resume exactly:
``step``, the optimizer's per-parameter state as ``adam.{index}.{key}``, optionally ``generator``
(a torch.Generator's state) and run-specific tensors (:func:`trainer_state_tensors`,
:func:`restore_trainer_state`).

A training run's folder also holds ``best/`` (:data:`BEST_DIR`): the checkpoint with the lowest
held-out loss so far, without its trainer state (a loadable model folder).

Folders are written to a temporary sibling and renamed into place (``ssacli.files``), so a failure
leaves the previous folder as it was and nothing half-written; a temporary folder a killed writer
left is removed by the next write (:func:`remove_stale_temps`). Only a folder ssacli wrote, or an
empty one, is ever replaced (:func:`check_replaceable`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..attention.forward import SCORER_ATTR
from ..attention.interface import apply_scorer
from ..errors import InputError
from ..files import output_error, replace_folder, warn, writer_gone
from .builtins import (  # noqa: F401 (the format's torch-free part: its names and ssacli.json's reader, here too)
    FORMAT_VERSIONS,
    ICL_FORMAT,
    META_FILE,
    MODEL_FORMAT,
    check_format_version,
    check_replaceable,
    folder_format,
    is_ssacli_folder,
    read_meta,
)
from .device_map import save_options
from .guard import (  # noqa: F401 (the guard's names are the format's: importable from here too)
    GUARD_NOTE_KEY,
    GUARDED_TYPE_PREFIX,
    ORIGINAL_TYPE_KEY,
    PLAIN_CONVERSION_KEYS,
    attention_layout,
    guard_config,
    plain_loadable,
    saved_config,
)
from .hub import quiet_progress

SCORER_FILE = "ssacli_scorer.safetensors"
WEIGHTS_FILE = "model.safetensors"  # an ICL folder's weights (transformers names its own the same)
TRAINER_FILE = "trainer.safetensors"
SCORER_KEY = f".{SCORER_ATTR}."  # in the state-dict name of every scorer parameter
OPTIMIZER_PREFIX = "adam."  # trainer-state tensors holding the optimizer's per-parameter state
BEST_DIR = "best"  # in a training run's folder: the checkpoint with the lowest held-out loss so far
# In every temporary folder a writer fills (beside its target, named as tempfile.mkdtemp names it):
# the writer's process, so that a folder a killed writer left can be told from anything else.
TEMP_MARKER = ".ssacli-writing"


# ---- ssacli.json -------------------------------------------------------------------------------------


def read_icl_meta(path: str | Path) -> dict[str, Any]:
    """ssacli.json of an ICL checkpoint; an InputError says what is wrong with any other folder."""
    path = Path(path)
    file = path / META_FILE
    if not file.is_file():
        raise InputError(
            f"{path} is not an ssacli ICL checkpoint (no {META_FILE}); train one with `ssacli icl train`"
        )
    try:
        meta = json.loads(file.read_text())
    except ValueError as err:
        raise InputError(f"{file} is not valid JSON ({err}); re-create the checkpoint") from None
    if not isinstance(meta, dict) or meta.get("format") != ICL_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise InputError(f"{file} is not an ssacli ICL record (format={found!r})")
    check_format_version(meta, path, ICL_FORMAT)
    return meta


def folder_record(path: str | Path) -> dict[str, Any] | None:
    """The record ssacli keeps in the ssacli.json of a folder it wrote: an ICL checkpoint's
    (:func:`read_icl_meta`), else a model folder's (:func:`read_meta`: None for any other folder)."""
    return read_icl_meta(path) if folder_format(path) == ICL_FORMAT else read_meta(path, MODEL_FORMAT)


def training_record(path: str | Path) -> dict[str, Any] | None:
    """The ``training`` record a fine-tuning run left in a folder's ssacli.json, or None.

    Model folders hold it at the top level; ICL folders inside their spec's ``training``."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(meta, dict) and meta.get("format") == ICL_FORMAT:
        meta = meta.get("training")
    return meta.get("training") if isinstance(meta, dict) else None


def _meta_text(format: str, record: dict[str, Any]) -> str:
    meta = {"format": format, "format_version": FORMAT_VERSIONS[format], **record}
    return json.dumps(meta, indent=2) + "\n"


# ---- writing folders ---------------------------------------------------------------------------------


def remove_stale_temps(out: str | Path) -> list[Path]:
    """Remove the temporary folders that writers of ``out`` killed mid-write (SIGKILL, power loss)
    left beside it; returns them. Only folders named as :func:`_write_folder` names them
    (``.{name}.`` and mkdtemp's 8 characters) that hold its TEMP_MARKER, written by a process of
    this host that is gone, are removed: never anything else."""
    out = Path(out)
    pattern = re.compile(re.escape(f".{out.name}.") + r"[a-z0-9_]{8}")
    removed = []
    try:
        entries = list(out.parent.iterdir()) if out.parent.is_dir() else []
    except OSError:
        return removed
    for entry in entries:
        if pattern.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            if writer_gone(entry / TEMP_MARKER):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


Best = str | None  # "this": the folder being written is the new best; "keep": carry out's best over


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    """``source`` (a regular file) at ``target``: hard-linked where the filesystem allows, never
    through a symbolic link."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)


def _place_best(tmp: Path, out: Path, best: Best) -> None:
    """Fill ``tmp/BEST_DIR``: from ``tmp`` itself (without its trainer state) or from ``out``'s
    current one. Files are hard-linked where the filesystem allows (no second copy on disk); an
    entry that is not a regular file (a symbolic link planted in ``out/best/``) is left behind with
    one warning line."""
    source = tmp if best == "this" else out / BEST_DIR
    if best is None or not source.is_dir() or source.is_symlink():
        return
    skip = {TRAINER_FILE, TEMP_MARKER, BEST_DIR}
    (tmp / BEST_DIR).mkdir()
    for file in source.iterdir():
        if file.name in skip:
            continue
        if stat.S_ISREG(file.lstat().st_mode):
            _link_or_copy(file, tmp / BEST_DIR / file.name)
        elif not file.is_dir() or file.is_symlink():
            kind = "a symbolic link" if file.is_symlink() else "not a regular file"
            warn(f"not carrying {file} over: {kind}, which ssacli never writes through")


def _carry_folders(tmp: Path, out: Path, names: tuple[str, ...]) -> None:
    """Put ``out``'s sub-folders ``names`` (those that exist) into ``tmp`` as they are, hard-linked
    where the filesystem allows: what an earlier write of the same job left (a recipe's stages/).
    Symbolic links are copied as links, which publishing drops (:func:`ssacli.files.publish`)."""
    for name in names:
        if (out / name).is_dir() and not (out / name).is_symlink() and not (tmp / name).exists():
            shutil.copytree(out / name, tmp / name, symlinks=True, copy_function=_link_or_copy)


def _write_folder(
    out: Path, fill: Callable[[Path], None], best: Best = None, carry: tuple[str, ...] = ()
) -> None:
    """Fill a temporary sibling of ``out``, then put it in place of ``out``; an OSError or a
    safetensors error becomes an OutputError, and ``out`` is as it was. ``best``: see
    :func:`_place_best`; ``carry``: sub-folders of ``out`` kept (:func:`_carry_folders`)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as err:
        raise output_error(out, err) from err
    try:
        marker = tmp / TEMP_MARKER
        marker.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        fill(tmp)
        _place_best(tmp, out, best)
        _carry_folders(tmp, out, carry)
        marker.unlink()
        replace_folder(tmp, out)
    except (OSError, SafetensorError) as err:  # a full disk, a read-only folder
        raise output_error(out, err) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _save_tensors(tensors: dict[str, torch.Tensor], file: Path, **kwargs: Any) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, file, **kwargs)


def write_model_folder(
    model: nn.Module,
    out: str | Path,
    *,
    scorer: str,
    meta: dict[str, Any] | None = None,
    tokenizer: Any = None,
    trainer: dict[str, torch.Tensor] | None = None,
    best: Best = None,
    carry: tuple[str, ...] = (),
) -> None:
    """Write a transformers model in the ``ssacli-model`` format, atomically: ``save_pretrained``
    without the scorer's tensors, those in SCORER_FILE, ``meta`` (with ``scorer``) in ssacli.json,
    ``trainer`` (see :func:`trainer_state_tensors`) in TRAINER_FILE, ``best`` as
    :func:`_place_best`, ``carry`` as :func:`_carry_folders`. Unless :func:`plain_loadable`,
    config.json is guarded (:func:`guard_config`)."""

    def fill(tmp: Path) -> None:
        state = model.state_dict()
        plain = {k: v for k, v in state.items() if SCORER_KEY not in k}
        params = {k: v for k, v in state.items() if SCORER_KEY in k}
        with quiet_progress(), warnings.catch_warnings():
            # "saving a model with offloaded modules": save_options keeps its shards small
            warnings.filterwarnings("ignore", message=".*offloaded modules", category=UserWarning)
            model.save_pretrained(tmp, state_dict=plain, safe_serialization=True, **save_options(model))
        if params:
            _save_tensors(params, tmp / SCORER_FILE, metadata={"format": MODEL_FORMAT})
        if trainer:
            _save_tensors(trainer, tmp / TRAINER_FILE)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / META_FILE).write_text(_meta_text(MODEL_FORMAT, {"scorer": scorer, **(meta or {})}))
        if not plain_loadable(scorer, meta or {}):
            guard_config(tmp / "config.json", scorer, attention_layout(model))

    _write_folder(Path(out), fill, best, carry)


def write_icl_folder(
    out: str | Path,
    *,
    config: Any,
    state: dict[str, torch.Tensor],
    record: dict[str, Any],
    trainer: dict[str, torch.Tensor] | None = None,
    best: Best = None,
) -> None:
    """Write an ICL checkpoint in the ``ssacli-icl`` format, atomically: the backbone's ``config``
    (a transformers config), every weight in ``state``, ``record`` (the spec) in ssacli.json."""

    def fill(tmp: Path) -> None:
        config.to_json_file(tmp / "config.json")
        _save_tensors(state, tmp / WEIGHTS_FILE, metadata={"format": ICL_FORMAT})
        if trainer:
            _save_tensors(trainer, tmp / TRAINER_FILE)
        (tmp / META_FILE).write_text(_meta_text(ICL_FORMAT, record))

    _write_folder(Path(out), fill, best)


# ---- reading weights -----------------------------------------------------------------------------------


def read_icl_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of an ICL checkpoint's WEIGHTS_FILE (OSError or SafetensorError when corrupt)."""
    file = Path(path) / WEIGHTS_FILE
    if not file.is_file():
        raise InputError(f"{path} has no {WEIGHTS_FILE}; the checkpoint is incomplete")
    return load_file(file)


def attach_saved_scorer(model: nn.Module, path: str | Path, spec: str) -> None:
    """Apply ``spec`` to a freshly loaded transformers model and load its saved parameters."""
    apply_scorer(model, spec, parameters_follow=True)
    file = Path(path) / SCORER_FILE
    expected = {k for k in model.state_dict() if SCORER_KEY in k}
    if not expected:
        return  # a scorer without parameters (softmax, sparsemax, ...)
    if not file.is_file():
        raise InputError(f"{path} has no {SCORER_FILE} for scorer '{spec}'; the folder is incomplete")
    # safetensors raises SafetensorError for a truncated or garbage file ("header too small/large",
    # "incomplete metadata"), the OS an OSError for an unreadable one; anything else is a bug of ours
    # and must not read as the user's corrupt file.
    try:
        saved = load_file(file)
    except (OSError, SafetensorError) as err:
        raise InputError(f"cannot read {file} ({err}); the file is corrupt or truncated") from None
    if set(saved) != expected:
        missing, extra = sorted(expected - set(saved)), sorted(set(saved) - expected)
        raise InputError(
            f"{file} does not match scorer '{spec}' on this model (missing {len(missing)}, unexpected "
            f"{len(extra)} tensors, e.g. {(missing or extra)[0]}); re-create the folder"
        )
    model.load_state_dict(saved, strict=False)


# ---- trainer state ---------------------------------------------------------------------------------------


def trainer_state_tensors(
    optimizer: torch.optim.Optimizer,
    step: int,
    *,
    generator: torch.Generator | None = None,
    extra: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """What TRAINER_FILE holds for a run at ``step``: the optimizer's per-parameter state, the data
    generator's state and ``extra`` (run-specific tensors, e.g. ``world_size``). Passed as
    ``trainer`` to the folder writers; :func:`restore_trainer_state` reads it back."""
    tensors = {"step": torch.tensor(step)}
    if generator is not None:
        tensors["generator"] = generator.get_state()
    tensors.update(extra or {})
    for index, values in optimizer.state_dict()["state"].items():
        tensors.update({f"{OPTIMIZER_PREFIX}{index}.{k}": torch.as_tensor(v) for k, v in values.items()})
    return tensors


def _index_map(optimizer: torch.optim.Optimizer, order: list, file: Path) -> dict[int, int]:
    """The file's index of each parameter (its place in ``order``) → the optimizer's index of it."""
    flat = {id(p): i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
    if any(id(p) not in flat for p in order):
        raise InputError(f"{file} does not match the model's trainable parameters")
    return {saved: flat[id(p)] for saved, p in enumerate(order)}


def restore_trainer_state(
    path: str | Path,
    optimizer: torch.optim.Optimizer,
    *,
    generator: torch.Generator | None = None,
    saved_order: list[torch.Tensor] | None = None,
) -> tuple[int, dict[str, torch.Tensor]]:
    """Load a folder's TRAINER_FILE into ``optimizer`` (and ``generator``); returns the step and the
    run-specific tensors. A missing, corrupt or mismatched file is an InputError. ``saved_order``:
    the parameters in the order the file indexes them, where that differs from ``optimizer``'s (a
    run written by an older layout of groups); the moments are moved to the optimizer's indices."""
    path = Path(path)
    file = path / TRAINER_FILE
    if not file.is_file():
        raise InputError(f"{path} has no {TRAINER_FILE} to resume from; train without --resume")
    try:
        tensors = load_file(file)
    except (OSError, SafetensorError) as err:
        raise InputError(f"cannot read {file} ({err}); the file is corrupt or truncated") from None
    state_dict = optimizer.state_dict()
    remap = None if saved_order is None else _index_map(optimizer, saved_order, file)
    extra = {}
    for name, value in tensors.items():
        if name.startswith(OPTIMIZER_PREFIX):
            index, _, key = name[len(OPTIMIZER_PREFIX) :].partition(".")
            index = int(index)
            if remap is not None:
                if index not in remap:
                    raise InputError(f"{file} does not match the model's trainable parameters")
                index = remap[index]
            state_dict["state"].setdefault(index, {})[key] = value
        elif name not in ("step", "generator"):
            extra[name] = value
    # Parameters that never get a gradient (an ICL model's unused token embedding) have no state.
    shapes = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"]]
    for index, values in state_dict["state"].items():
        moment = values.get("exp_avg")
        if index >= len(shapes) or (moment is not None and tuple(moment.shape) != shapes[index]):
            raise InputError(f"{file} does not match the model's trainable parameters")
    optimizer.load_state_dict(state_dict)
    if generator is not None:
        if "generator" not in tensors:
            raise InputError(f"{file} holds no data-generator state; train without --resume")
        generator.set_state(tensors["generator"])
    return int(tensors["step"]), extra
