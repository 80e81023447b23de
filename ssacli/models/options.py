"""How a MODEL reference is loaded, as one value: :class:`LoadOptions`, the one way these options
travel from the CLI's flags or an API function's keywords to :func:`ssacli.models.loading.load_model`.

Cheap to import (no torch): the CLI builds one from its flags before the model stack is imported.
"""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass, fields
from typing import Any

from .. import defaults
from ..errors import UsageError
from ..setting import setting
from .device_map import DEVICE_MAPS, MaxMemory

# the dtypes a model loads in besides "auto" (ssacli.models.loading maps each to torch's; float64:
# reference measurements, a float32 sum over a long text is exact only to ~1 ulp of its size)
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")


def check_dtype(dtype: str) -> None:
    """Refuse a ``dtype`` that is neither "auto" nor one of :data:`DTYPE_NAMES` (torch-free: before
    the model stack loads, with the message loading gives)."""
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise UsageError(f"unknown dtype '{dtype}'; use auto, {', '.join(DTYPE_NAMES)}")


TRUST_HELP = "Run the Python code the checkpoint ships (auto_map); only for code you have read."
DEVICE_MAP_HELP = (
    f"Place MODEL over GPUs, CPU and disk with accelerate: {', '.join(DEVICE_MAPS)} (cpu: the CPU, "
    r'then the disk). Needs pip install "ssacli\[big]".'  # \[: rich markup would eat "[big]"
)
MAX_MEMORY_HELP = (
    "With --device-map: DEVICE=SIZE (cpu=200MB, 0=10GiB), repeated or comma-separated; what fits "
    "nowhere goes to a temporary folder on disk."
)
ALLOW_DOWNLOAD_HELP = "Deprecated, no effect: Hub ids download unless --offline."


@dataclass(frozen=True)
class LoadOptions:
    """How a MODEL reference is loaded: the keywords of :func:`~ssacli.models.loading.load_model`
    (and of every API function that loads a MODEL), as one value.

    ``device``: auto, cpu, cuda or cuda:N; ``dtype``: auto (float32 on CPU, the checkpoint's own on
    a GPU) or a torch dtype's name. A Hub id is downloaded when not cached, as transformers does,
    unless ``offline`` (or ``HF_HUB_OFFLINE=1``); ``revision`` picks its branch, tag or commit
    (``org/name@REV`` says the same). ``allow_pickle`` reads pickle-only weights (with
    ``weights_only=True``). ``trust_remote_code`` runs the Python code a checkpoint ships
    (transformers' option of that name); only for checkpoints whose code you have read. ``device_map`` (one of
    :data:`~ssacli.models.device_map.DEVICE_MAPS`) and ``max_memory`` (``"cpu=200MB"``, a list of
    such, or ``{device: size}``; empty: none) load through accelerate across GPUs, the CPU and the
    disk (:mod:`ssacli.models.device_map`), instead of onto one ``device``. The values are checked
    when a model loads. ``allow_download`` is deprecated: it has done nothing since downloading
    became the default; it is still accepted, with a DeprecationWarning, until the next release.
    Each field's help is its option's (``ssacli diagnose --help``)."""

    device: str = setting(defaults.DEVICE, "auto, cpu, cuda or cuda:N.")
    dtype: str = setting(
        defaults.DTYPE, "auto (float32 on CPU), float32, bfloat16, float16 or float64 (reference)."
    )
    offline: bool = setting(
        False, "Never download: Hub ids from the Hugging Face cache only (as HF_HUB_OFFLINE=1)."
    )
    revision: str | None = setting(
        None,
        "Branch, tag or commit of a Hub id MODEL (as MODEL@REV); the commit is recorded.",
        type=str,
        metavar="REV",
    )
    # deprecated (issue 42: downloads are the default; issue 53: no longer carried): accepted, not kept
    allow_download: InitVar[bool] = setting(False, ALLOW_DOWNLOAD_HELP, hidden=True)
    allow_pickle: bool = setting(False, "Load .bin weights (weights_only=True).")
    trust_remote_code: bool = setting(False, TRUST_HELP)
    device_map: str | None = setting(None, DEVICE_MAP_HELP, type=str)
    max_memory: MaxMemory = setting(None, MAX_MEMORY_HELP, type=list[str])

    def __post_init__(self, allow_download: bool) -> None:
        if allow_download:
            warnings.warn(
                "allow_download is deprecated and has no effect (Hub ids download unless offline); "
                "it will be removed in the next release",
                DeprecationWarning,
                stacklevel=3,
            )
        if not self.max_memory and self.max_memory is not None:  # an empty list (no --max-memory): none
            object.__setattr__(self, "max_memory", None)

    def keywords(self) -> dict[str, Any]:
        """These options as the keyword arguments of an API function that loads a MODEL
        (``ssacli.diagnose(model, **options.keywords())``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
