"""Whole training runs as the commands start them, so the Python API can start them the same way.

* :func:`train_from_scratch` (``ssacli train``): a fresh language model and its BPE tokenizer
  (:func:`ssacli.train.scratch.new_model`), then the fine-tuning loop with ``train="all"``, so
  softmax and SSA runs of the same call see the same batches, steps and tokens. ``resume``
  reloads the model saved in ``out`` and refuses build settings that differ from the recorded ones.
* :func:`convert_and_finetune` (``ssacli convert --finetune``): swap the scorer, measure fidelity
  (on the start of the training text unless a calibration text is given), fine-tune, and save.
* :func:`finetune_config` (``ssacli finetune``): the :class:`FinetuneConfig` of a call that may
  continue a recorded run: settings not given are the run's, so a larger ``steps`` extends it.

The first two are keyword wrappers for users; the commands call their ``_with`` forms, which take the
settings as values (:class:`FinetuneConfig`, with :class:`~ssacli.train.settings.ScratchSettings`, or
:class:`~ssacli.conversion.settings.ConvertSettings` and :class:`~ssacli.models.options.LoadOptions`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..conversion import check_out, convert_with
from ..conversion.settings import ConvertSettings
from ..defaults import DEVICE
from ..errors import UsageError
from ..files import check_writable_folder, writer_lock
from ..models.checkpoint import check_replaceable, read_meta, training_record
from ..models.loading import LoadedModel, local_model_path
from ..models.options import LoadOptions
from ..scorers import make_scorer
from ..setting import settings_from
from . import require_data
from .data import read_documents
from .finetune import finetune
from .finetune_config import FinetuneConfig
from .folders import check_new_run, run_exists, training_folder
from .scratch import SIZES, new_model, training_texts
from .settings import ScratchSettings

SCRATCH_RECORD = "scratch"  # key in ssacli.json: how a from-scratch model was built
CALIBRATION_CHARS = 200_000  # of text training data, when it is the calibration text

OnStep = Callable[[int, float, float, float], None]  # (step, loss, lr, tokens_per_s), see finetune


def finetune_config(
    model: str | LoadedModel | None = None,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    in_place: bool = False,
    **options: Any,
) -> FinetuneConfig:
    """The validated :class:`FinetuneConfig` of ``finetune(model, config, out, resume=resume,
    in_place=in_place)``: ``options`` (its fields; None means not given), then, when the call
    continues a run (``resume``, or ``in_place`` on a folder holding one), the settings recorded in
    that folder, then the defaults. ``data`` is required unless the recorded run has it."""
    names = {f.name for f in fields(FinetuneConfig)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"finetune_config() got unknown settings {unknown}; valid: {sorted(names)}")
    recorded: dict[str, Any] = {}
    hint = ""
    if model is not None or out is not None:
        folder, resume, _ = training_folder(model, out, resume, in_place)
        recorded = (training_record(folder) or {}).get("config", {}) if resume else {}
        source = model if isinstance(model, str) else None
        if not resume and source and (training_record(Path(source).expanduser()) or {}).get("config"):
            hint = f"; to continue the run recorded in {source}, pass --resume"
    given = {k: v for k, v in options.items() if v is not None}
    values = {k: v for k, v in recorded.items() if k in names} | given
    require_data(values.get("data"), hint)
    config = FinetuneConfig(**values)
    config.validate()
    return config


def calibration_text(data: str) -> str | None:
    """The text that fidelity and m=auto are measured on when fine-tuning on ``data``: its start
    for text data; None (the built-in probe texts) for ICL data."""
    if data.startswith("icl:"):
        return None
    return "\n\n".join(read_documents(data))[:CALIBRATION_CHARS]


def convert_and_finetune(
    model: str | LoadedModel,
    scorer: str,
    out: str | Path,
    config: FinetuneConfig,
    *,
    overwrite: bool = False,
    resume: bool = False,
    on_converted: Callable[[dict[str, Any]], None] | None = None,
    on_step: OnStep | None = None,
    **settings: Any,
) -> tuple[LoadedModel, dict[str, Any]]:
    """:func:`ssacli.convert` MODEL to ``scorer``, then :func:`finetune` it into ``out``; return the
    trained model and the fidelity report (also recorded in ``out``'s ssacli.json).

    Everything cheap is checked before loading: the spec, ``config``, and ``out`` (never the input
    folder, an existing one only with ``overwrite``). ``settings``: ConvertSettings' and LoadOptions'
    by name, as for :func:`ssacli.convert` (``text`` is the calibration text, None: the start of
    ``config.data`` for text data, else the built-in probe texts; ``dtype="auto"`` loads float32; one
    device: no ``device_map`` or ``max_memory``). ``on_converted(report)`` is called between the two
    stages. ``resume``: continue the fine-tuning run stopped in ``out`` (a missing ``out`` starts
    afresh). :func:`convert_and_finetune_with` is the same with its settings as values."""
    conversion, load = settings_from("convert_and_finetune", settings, ConvertSettings, LoadOptions)
    return convert_and_finetune_with(model, scorer, out, config, conversion, load, overwrite=overwrite,
                                     resume=resume, on_converted=on_converted, on_step=on_step)  # fmt: skip


def convert_and_finetune_with(
    model: str | LoadedModel,
    scorer: str,
    out: str | Path,
    config: FinetuneConfig,
    conversion: ConvertSettings,
    load: LoadOptions,
    *,
    overwrite: bool = False,
    resume: bool = False,
    on_converted: Callable[[dict[str, Any]], None] | None = None,
    on_step: OnStep | None = None,
) -> tuple[LoadedModel, dict[str, Any]]:
    """:func:`convert_and_finetune` with its settings as values: the loop's (``config``), the
    conversion's (:class:`~ssacli.conversion.settings.ConvertSettings`; its ``text`` None: the start
    of ``config.data``, as there) and how MODEL loads (:class:`~ssacli.models.options.LoadOptions`,
    on one device: fine-tuning takes no ``device_map`` or ``max_memory``); ``ssacli convert
    --finetune`` builds them from its flags."""
    make_scorer(scorer)  # a bad spec fails before loading
    config.validate()
    placed = [name for name in ("device_map", "max_memory") if getattr(load, name) is not None]
    if placed:
        raise UsageError(f"{placed[0]} applies to convert without fine-tuning (fine-tuning trains on one "
                         "device per process; use torchrun or accelerate launch for several)")  # fmt: skip
    out = Path(out).expanduser()
    if resume and out.exists():  # the conversion is done: its fine-tuning run continues
        trained = finetune(str(out), config, out, resume=True, device=load.device, on_step=on_step,
                           trust_remote_code=load.trust_remote_code)  # fmt: skip
        return trained, (read_meta(out) or {}).get("fidelity") or {}
    check_out(out, model.path if isinstance(model, LoadedModel) else local_model_path(model), overwrite)
    if load.dtype == "auto":  # float32: AdamW on bf16/fp16 weights loses small updates; autocast covers speed
        load = replace(load, dtype="float32")
    with writer_lock(out):  # one writer of out, from the conversion on
        if conversion.text is None:
            conversion = replace(conversion, text=calibration_text(config.data))
        loaded, report = convert_with(model, scorer, conversion, load, None, overwrite=overwrite)
        if on_converted is not None:
            on_converted(report)
        meta = {
            "source": str(loaded.path or loaded.name),
            "source_weights": loaded.weights,
            "fidelity": report,
        }
        trained = finetune(
            loaded, config, out, overwrite=overwrite, device=load.device, meta=meta, on_step=on_step
        )
    return trained, report


def train_from_scratch(
    data: str | Path,
    out: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    device: str = DEVICE,
    on_built: Callable[[LoadedModel], None] | None = None,
    on_step: OnStep | None = None,
    **settings: Any,
) -> LoadedModel:
    """Train a language model from scratch on ``data`` and write it to ``out``.

    The keywords are :func:`train_from_scratch_with`'s two values, by name: :class:`ScratchSettings`'
    (``arch``, ``size`` (tiny when None), ``scorer``, ``vocab_size`` and ``seq_len`` (None: the
    size's) build the model: :func:`ssacli.train.scratch.new_model`) and the loop's
    :class:`FinetuneConfig` (``steps``, ``lr``, ``batch_size``, ``seed`` — it seeds the weights and
    the batches —, …; every layer trains). The held-out loss (last tenth of ``data``) is measured
    before the first step and at every checkpoint. ``resume`` continues the run in ``out``: build
    settings left None are the recorded ones, others must match them. ``on_built(model)`` is
    called once a new model is built."""
    keywords = {"data": str(data), **settings, "train": "all"}
    build, config = settings_from("train_from_scratch", keywords, ScratchSettings, FinetuneConfig)
    return train_from_scratch_with(build, config, out, resume=resume, overwrite=overwrite, device=device,
                                   on_built=on_built, on_step=on_step)  # fmt: skip


def train_from_scratch_with(
    build: ScratchSettings,
    config: FinetuneConfig,
    out: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    device: str = DEVICE,
    on_built: Callable[[LoadedModel], None] | None = None,
    on_step: OnStep | None = None,
) -> LoadedModel:
    """:func:`train_from_scratch` with its settings as values: how the model is built
    (:class:`~ssacli.train.settings.ScratchSettings`) and the loop (``config``: its ``data`` also
    trains the tokenizer, its ``seed`` also seeds the weights; its ``seq_len`` is the model's
    positions, ``build.seq_len`` or the size's, and it trains every weight, ``train="all"``);
    ``ssacli train`` builds both from its flags."""
    spec = make_scorer(build.scorer).spec  # a bad spec fails before the tokenizer is trained
    if config.train != "all":
        raise UsageError(f"a model from scratch trains all its weights (train='all'), got {config.train!r}")
    check_new_run(out, resume, overwrite)
    out = Path(out)
    recorded = _recorded(out) if resume else None
    if recorded is None and out.exists() and not overwrite:
        raise run_exists(out, "it holds no run to resume")
    if recorded is None:
        check_replaceable(out)  # --overwrite replaces only a folder ssacli wrote, or an empty one
    build = replace(build, scorer=spec)
    if recorded is not None:
        _check_same_build(out, recorded, arch=build.arch, size=build.size, scorer=build.scorer,
                          vocab_size=build.vocab_size, seed=config.seed)  # fmt: skip
        build = replace(build, seq_len=build.seq_len or recorded["seq_len"])
    # seq_len: the model's positions, known once it is built (2 passes validation until then)
    config = replace(config, seq_len=build.seq_len or 2)
    config.validate()  # before the tokenizer is trained
    check_writable_folder(out, "--out")
    with writer_lock(out):  # one writer of out, from the tokenizer on
        return _train_into(out, build, config, recorded, resume, overwrite, device, on_built, on_step)


def _train_into(
    out: Path,
    build: ScratchSettings,
    config: FinetuneConfig,
    recorded: dict[str, Any] | None,
    resume: bool,
    overwrite: bool,
    device: str,
    on_built: Callable[[LoadedModel], None] | None,
    on_step: OnStep | None,
) -> LoadedModel:
    """The run itself: the recorded model reloaded (``recorded``), or a new one built, then the loop."""
    if recorded is not None:
        model: str | LoadedModel = str(out)  # finetune reloads the model, tokenizer and optimizer
        meta = None
    else:
        model, meta = _build(build, config.data, config.seed)
        if on_built is not None:
            on_built(model)
        config = replace(config, seq_len=model.max_positions)
    return finetune(
        model, config, out, resume=resume, overwrite=overwrite, device=device, meta=meta, on_step=on_step
    )


def _recorded(out: Path) -> dict[str, Any] | None:
    """The build record of a from-scratch run saved in ``out`` (None when there is none)."""
    meta = read_meta(out) if out.is_dir() else None
    if meta is None or training_record(out) is None:
        return None
    if SCRATCH_RECORD not in meta:
        raise UsageError(
            f"{out} holds a fine-tuning run, not one of `ssacli train`; continue it with ssacli finetune"
        )
    return {**meta[SCRATCH_RECORD], "scorer": meta.get("scorer")}


def _check_same_build(out: Path, recorded: dict[str, Any], **given: Any) -> None:
    """Resuming with build settings that differ from the saved run's would silently ignore them;
    refuse instead (settings left None are taken from the run)."""
    changed = [
        f"--{k.replace('_', '-')} {recorded.get(k)} -> {v}"
        for k, v in given.items()
        if v is not None and recorded.get(k) != v and not (k == "size" and recorded.get("size_path") == v)
    ]
    if changed:
        raise UsageError(
            f"{out} holds a run built with other settings ({', '.join(changed)}); resume it with "
            "the same ones or pick a new --out"
        )


def _build(build: ScratchSettings, data: str, seed: int) -> tuple[LoadedModel, dict[str, Any]]:
    size = build.size or "tiny"
    texts = training_texts(data)
    loaded = new_model(build.arch, size, build.scorer, texts=texts, vocab_size=build.vocab_size,
                       seq_len=build.seq_len, seed=seed)  # fmt: skip
    record = {
        "arch": loaded.family,
        "size": size if size in SIZES else "config",
        "size_path": None if size in SIZES else size,
        "vocab_size": build.vocab_size,
        "tokenizer_vocab": len(loaded.tokenizer),
        "seq_len": loaded.max_positions,
        "seed": seed,
    }
    return loaded, {"source": loaded.name, SCRATCH_RECORD: record}
