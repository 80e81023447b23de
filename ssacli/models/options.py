"""How a MODEL reference is loaded, as one value: :class:`LoadOptions`, the one way these options
travel from the CLI's flags or an API function's keywords to :func:`ssacli.models.loading.load_model`.

Cheap to import (no torch): the CLI builds one from its flags before the model stack is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .. import defaults
from .device_map import MaxMemory


@dataclass(frozen=True)
class LoadOptions:
    """How a MODEL reference is loaded: the keywords of :func:`~ssacli.models.loading.load_model`
    (and of every API function that loads a MODEL), as one value.

    ``device``: auto, cpu, cuda or cuda:N; ``dtype``: auto (float32 on CPU, the checkpoint's own on
    a GPU) or a torch dtype's name. A Hub id is downloaded when not cached, as transformers does,
    unless ``offline`` (or ``HF_HUB_OFFLINE=1``); ``revision`` picks its branch, tag or commit
    (``org/name@REV`` says the same); ``allow_download`` is accepted and has no effect (deprecated:
    downloading is the default). ``allow_pickle`` reads pickle-only weights (with
    ``weights_only=True``). ``trust_remote_code`` runs the Python code a checkpoint ships
    (transformers' option of that name); only for checkpoints whose code you have read. ``device_map`` (one of
    :data:`~ssacli.models.device_map.DEVICE_MAPS`) and ``max_memory`` (``"cpu=200MB"``, a list of
    such, or ``{device: size}``) load through accelerate across GPUs, the CPU and the disk
    (:mod:`ssacli.models.device_map`), instead of onto one ``device``. The values are checked when
    a model loads."""

    device: str = defaults.DEVICE
    dtype: str = defaults.DTYPE
    allow_download: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    device_map: str | None = None
    max_memory: MaxMemory = None
    offline: bool = False
    revision: str | None = None

    def keywords(self) -> dict[str, Any]:
        """These options as the keyword arguments of an API function that loads a MODEL
        (``ssacli.diagnose(model, **options.keywords())``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
