"""The conversion: swap a model's attention scorer (:func:`convert`, :func:`convert_with`), measure
how close it stays, and save it (:func:`save_model`). Folders are written to a temporary sibling and
renamed at the end, so a failure leaves nothing half-written; the input folder is never touched.
The package's docstring (:mod:`ssacli.conversion`) says what a converted folder is.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..attention.interface import CONFIG_SPEC_ATTR, apply_scorer, supports, unaudited_reason
from ..errors import OutputError, UnsupportedModelError, UsageError
from ..files import writer_lock
from ..models.checkpoint import SCORER_KEY, check_replaceable, write_model_folder
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel, as_loaded, local_model_path
from ..models.options import LoadOptions
from ..scorers import make_scorer
from ..setting import settings_from
from .calibration import calibration_inputs, fidelity, model_outputs, target_of
from .m_auto import attention_row_kl, choose_m, wants_m_auto
from .settings import ConvertSettings

__all__ = ["check_out", "convert", "convert_with", "save_model"]

# ---- saving --------------------------------------------------------------------------------------------


def save_model(
    loaded: LoadedModel | nn.Module,
    out: str | Path,
    *,
    meta: dict[str, Any] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    overwrite: bool = False,
    best: str | None = None,
    carry: tuple[str, ...] = (),
) -> Path:
    """Write ``loaded`` (with its scorer) to ``out`` atomically; ``extra_tensors`` go to
    trainer.safetensors (optimizer state for resuming, see
    :func:`ssacli.models.checkpoint.trainer_state_tensors`); ``best`` ("this" or "keep") fills the
    run's best/ folder (:data:`ssacli.models.checkpoint.BEST_DIR`); ``carry`` names sub-folders of
    the current ``out`` the new one keeps (a recipe's stages/). ICL models take neither. A model in
    memory is saved as it is (one that plain transformers built from a converted folder with its
    scorers attached first, in ssacli's format: ``model.save_pretrained`` writes transformers' own,
    which only plain transformers reloads, :func:`ssacli.models.guard.keep_guard`)."""
    loaded = as_loaded(loaded)
    out = Path(out).expanduser()
    check_out(out, loaded.path, overwrite)
    if loaded.kind == ModelKind.ICL:
        from ..models.icl import save_icl  # transformers' GPT-2 is imported only for ICL models

        if meta:
            loaded.model.spec.training = {**loaded.model.spec.training, **meta}
        loaded.model.spec.scorer = _spec_of(loaded)
        save_icl(loaded.model, out, extra_tensors, best=best)
    else:
        write_model_folder(
            loaded.model, out, scorer=_spec_of(loaded), meta=meta, tokenizer=loaded.tokenizer,
            trainer=extra_tensors, best=best, carry=carry,
        )  # fmt: skip
    return out


def check_out(out: Path, source: Path | None, overwrite: bool) -> None:
    """Refuse to write over the input folder, over anything without --overwrite, over a folder
    ssacli did not write even with it (:func:`~ssacli.models.checkpoint.check_replaceable`: only
    an ssacli folder or an empty one is replaced), or where nothing can be written (checked
    before any work)."""
    if source is not None and out.exists() and out.resolve() == Path(source).resolve():
        raise UsageError(
            f"--out {out} is the input model's folder; ssacli never modifies its input, choose another --out"
        )
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder path")
    if out.exists() and not overwrite:
        raise UsageError(
            f"--out {out} already exists; pass --overwrite to replace it, or choose another folder"
        )
    check_replaceable(out)
    parent = out.absolute().parent
    while not parent.exists():  # the nearest folder that exists is where the new ones are made
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"cannot write --out {out}: {parent} is not a writable folder; choose another --out"
        )


def _spec_of(loaded: LoadedModel) -> str:
    return getattr(loaded.attention_root.config, CONFIG_SPEC_ATTR, None) or "softmax"


# ---- conversion -------------------------------------------------------------------------------------


def convert(
    model: str | Path | nn.Module | LoadedModel,
    scorer: str,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    tokenizer: Any = None,
    **settings: Any,
) -> tuple[LoadedModel, dict[str, Any]]:
    """Swap every attention layer's scorer for ``scorer``; return the model and its fidelity.

    Fidelity compares the model's outputs before and after the swap on the same inputs
    (:func:`fidelity`): ``samples`` windows of ``length`` tokens from ``text`` (the calibration
    text; None: the built-in probe texts), tokenized by the model's tokenizer (``tokenizer`` for an
    in-memory model; without one, random token ids). ``model`` may be a reference, a
    :class:`LoadedModel` or a transformers / ICL model in memory (converted in place).
    ``max_error`` is the target (None: 1e-3 nats/token for models with a vocabulary, 1e-2 relative
    error otherwise, :func:`target_of`). With ``ssa:init=faithful`` and ``m=auto`` (its default) m is
    chosen per layer so the measured error meets the target (:func:`choose_m`); if no m on the grid
    does, JobFailedError (exit 5) and nothing is written. With ``out``, the converted model is saved
    there (never over the input).
    A MODEL reference is loaded with ``device`` … ``max_memory``
    (:class:`~ssacli.models.options.LoadOptions`; ``device_map``: across devices and the disk). A
    family the all-family audit does not cover is converted with ``report["unaudited"]`` saying why;
    with ``strict`` it is refused (UnsupportedModelError) before anything is measured or written.
    ``settings`` are :func:`convert_with`'s two values by name, ConvertSettings' (``samples``,
    ``length``, ``seed``, ``text``, ``max_error``, ``strict``) and LoadOptions'.
    """
    conversion, load = settings_from("convert", settings, ConvertSettings, LoadOptions)
    return convert_with(model, scorer, conversion, load, out, overwrite=overwrite, tokenizer=tokenizer)


def convert_with(
    model: str | Path | nn.Module | LoadedModel,
    scorer: str,
    settings: ConvertSettings,
    load: LoadOptions,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    tokenizer: Any = None,
) -> tuple[LoadedModel, dict[str, Any]]:
    """:func:`convert` with its settings as values: what fidelity is measured on and against which
    target (:class:`~ssacli.conversion.settings.ConvertSettings`) and how a MODEL reference loads
    (:class:`~ssacli.models.options.LoadOptions`); ``ssacli convert`` builds both from its flags."""
    auto = wants_m_auto(make_scorer(scorer))  # a bad spec fails before loading
    if out is not None:  # cheap checks before loading anything
        reference = isinstance(model, str | Path)
        source = local_model_path(str(model)) if reference else getattr(model, "path", None)
        check_out(Path(out).expanduser(), source, overwrite)
    with writer_lock(Path(out).expanduser()) if out is not None else nullcontext():  # one writer of out
        loaded = as_loaded(model, tokenizer, load)
        root = loaded.attention_root
        if not supports(root):
            raise UnsupportedModelError(
                f"model family '{loaded.family}' does not route attention through transformers' "
                "AttentionInterface, so its scorer cannot be swapped "
                "(docs/models.md lists supported families)"
            )
        unaudited = unaudited_reason(getattr(root.config, "model_type", loaded.family))
        if unaudited is not None and settings.strict:
            raise UnsupportedModelError(
                f"{unaudited}; --strict refuses it (drop --strict to convert it, marked)"
            )
        if out is not None:
            check_out(Path(out).expanduser(), loaded.path, overwrite)
        loaded.model.eval()
        batches = calibration_inputs(loaded, settings.samples, settings.length, settings.seed, settings.text)
        before_spec = _spec_of(loaded)
        if not any(SCORER_KEY in k for k in loaded.model.state_dict()) and before_spec == "softmax":
            apply_scorer(root, "softmax")  # measure "before" through the same attention function
        before = model_outputs(loaded, batches)
        grid = attention_row_kl(loaded, batches) if auto else None
        apply_scorer(root, scorer, parameters_follow=grid is not None)  # choose_m sets m next
        if grid is not None:
            after, report = choose_m(loaded, batches, before, grid, settings.max_error)
        else:
            after = model_outputs(loaded, batches)
            report = fidelity(loaded.kind, before, after, batches)
            metric, target = target_of(report, settings.max_error)
            report["target"] = {"metric": metric, "max": target, "met": bool(report[metric] <= target)}
        report = {"from": before_spec, "to": _spec_of(loaded), **report, "unaudited": unaudited}
        report["calibration"] = settings.recorded()
        if out is not None:
            source = str(loaded.path or loaded.name)
            meta = {"source": source, "source_weights": loaded.weights, "fidelity": report}
            save_model(loaded, out, meta=meta, overwrite=overwrite)
        return loaded, report
