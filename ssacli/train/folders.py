"""Where a fine-tuning run writes, and whether it may: the input is written over only when asked.

* :func:`training_folder`: ``--out``; or without it, a new folder beside the input
  (``<folder>-ft``), or the input's own folder with ``--in-place`` (or ``--resume``: the run
  recorded there continues).
* :func:`plan_output`: "fresh" or "resume" for that folder, or the UsageError that says why it must
  not be written: an existing folder is replaced only when asked, and only if ssacli wrote it or it
  is empty (:func:`ssacli.models.builtins.check_replaceable`). Temporary folders that a run killed
  mid-checkpoint left beside it are removed first.
* :func:`check_new_run`: a fresh model's or ICL model's ``--out`` (``ssacli train``, ``ssacli icl
  train``) that holds a run already, refused without --resume or --overwrite, torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError, UsageError
from ..models.builtins import BUILTIN_DIR, check_replaceable

if TYPE_CHECKING:  # training_folder is torch-free: `ssacli finetune` asks it before the model stack
    from ..models.loaded import LoadedModel

DEFAULT_OUT_SUFFIX = "-ft"  # finetune without --out writes <folder>-ft beside the input


def training_folder(
    model: LoadedModel | str | None, out: str | Path | None, resume: bool, in_place: bool = False
) -> tuple[Path, bool, bool]:
    """(folder, resume, in_place): where a fine-tuning call writes, whether it continues a run
    there, and whether that folder is MODEL's own (written over because it was asked: ``in_place``,
    ``resume`` without ``out``, or ``out`` naming MODEL's folder). Otherwise, for ``out=None``, a
    new folder beside MODEL's: ``<folder>-ft``."""
    loaded = model is not None and not isinstance(model, str)  # a LoadedModel (not imported: torch)
    path = model.path if loaded else None
    if isinstance(model, str) and not model.startswith("builtin:"):
        path = Path(model).expanduser()
    own = path is not None and path.is_dir()
    if out is not None:
        out = Path(out).expanduser()
        same = own and out.exists() and out.resolve() == path.resolve()
        if in_place and not same:
            raise UsageError(f"--in-place trains DIR itself, --out {out} is another folder; give one of them")
        if in_place and not resume:
            check_replaceable(out, "DIR")  # as plan_output does, before the model stack
        return out, resume or same, same
    if not own:
        name = model.name if loaded else model
        if path is not None and not path.exists():  # a MODEL that names nothing, as every command reads it
            raise InputError(
                f"'{name}' does not exist; give the model folder to fine-tune (or --out DIR with a "
                "builtin:NAME or a Hub id)"
            )
        raise UsageError(f"{name} is not a folder to train in place or beside; give --out DIR")
    if in_place and not resume:
        check_replaceable(path, "DIR")  # as plan_output does, before the model stack
    if in_place or resume:
        return path, True, in_place
    return path.with_name(path.name + DEFAULT_OUT_SUFFIX), False, False


def plan_output(out: Path, source: Path | None, resume: bool, overwrite: bool, in_place: bool) -> str:
    """ "fresh" or "resume", or a UsageError for an output that must not be written."""
    from ..models.checkpoint import TRAINER_FILE, remove_stale_temps, training_record

    if out.resolve() == BUILTIN_DIR or BUILTIN_DIR in out.resolve().parents:
        raise UsageError(f"--out {out} is inside ssacli's bundled checkpoints; choose another folder")
    remove_stale_temps(out)  # what a run killed mid-checkpoint left beside its folder
    if not out.exists():
        return "fresh"
    if not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder path")
    if resume and (out / TRAINER_FILE).is_file() and training_record(out) is not None:
        return "resume"
    if in_place:  # asked for; still only a folder ssacli wrote (the run replaces it whole)
        check_replaceable(out, "DIR")
        return "fresh"
    if resume and source is not None and Path(source).resolve() == out.resolve():
        raise UsageError(
            f"{out} holds no fine-tuning run to resume; to train it in place (over its weights) "
            "pass --in-place, or leave out --resume to write a new folder"
        )
    if overwrite:
        check_replaceable(out)
        return "fresh"
    if resume:
        raise UsageError(f"--out {out} holds no fine-tuning run to resume; pass --overwrite to replace it")
    raise UsageError(f"--out {out} already exists; pass --resume to continue the run in it or --overwrite")


def check_new_run(out: str | Path, resume: bool, overwrite: bool, *, icl: bool = False) -> None:
    """Refuse, before the model stack, a fresh run (``resume`` False) into an ``out`` that exists
    without ``overwrite`` (``ssacli train``; ``icl``, ``ssacli icl train``: one that holds a
    checkpoint, and one that holds files ssacli did not write even with ``overwrite``), and
    ``resume`` with ``overwrite``; whether a resumed run is there is checked where it starts."""
    out = Path(out)
    if icl:
        from ..models.builtins import META_FILE

        check_replaceable(out)  # a folder ssacli did not write is never replaced, --overwrite or not
        if (out / META_FILE).is_file() and not (resume or overwrite):
            raise UsageError(f"{out} already holds a checkpoint; pass --resume to continue it or --overwrite")
        return
    if resume and overwrite:
        raise UsageError("--resume continues the run in --out and --overwrite replaces it; give one of them")
    if not resume and out.exists() and not overwrite:
        raise run_exists(out, "pass --resume to continue it")


def run_exists(out: Path, hint: str) -> UsageError:
    """A fresh model's ``--out`` that exists (``hint``: what to pass instead)."""
    return UsageError(f"--out {out} already exists ({hint}); pass --overwrite to replace it")
