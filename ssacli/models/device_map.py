"""Models larger than one device: ``--device-map`` and ``--max-memory`` through accelerate's
big-model loading (transformers' ``from_pretrained(device_map=…, max_memory=…, offload_folder=…)``).

accelerate places each block on a GPU, the CPU or the disk and hooks every module so its weights
and inputs are on its execution device when it runs; :func:`ssacli.attention.interface.execution_device`
reads that device, so scorers sit where their layer computes. Disk offload writes to a folder ssacli
makes in the system temp folder (``$TMPDIR``) and removes when the model is freed or the process
exits; one left by a killed process is removed by the next load. accelerate is an optional extra
(:data:`BIG_EXTRA`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError

# What --device-map takes: accelerate's strategies, and "cpu" (the CPU, then the disk: no GPU).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential", "cpu")
BIG_EXTRA = 'pip install "ssacli[big]"'
OFFLOAD_PREFIX = "ssacli-offload-"  # then the owner's pid, "-", a random suffix
MaxMemory = Mapping[int | str, int | str] | str | Iterable[str] | None
OFFLOADED_SHARD = "1GB"  # the most of an offloaded model written at once (gathered in RAM first)
_SIZE_HINT = "a size such as 200MB, 1.5GB or 2GiB (an integer alone is bytes)"


def check_accelerate(option: str = "--device-map") -> None:
    """A UsageError naming the extra when accelerate is not installed."""
    if importlib.util.find_spec("accelerate") is None:
        raise UsageError(f"{option} loads through accelerate, which is not installed: {BIG_EXTRA}")


def parse_max_memory(value: MaxMemory) -> dict[int | str, int] | None:
    """``--max-memory`` as accelerate's ``max_memory``: device -> bytes. Takes a mapping, or strings
    ``DEVICE=SIZE`` (several per string, comma-separated; the option may be repeated), where DEVICE
    is ``cpu``, a GPU index ``N`` or ``cuda:N``. Sizes are read by accelerate
    (``convert_file_size_to_int``: 200MB, 2GiB, …; a lowercase ``b`` means bits)."""
    limits = memory_limits(value)
    return {key: _bytes(device, size) for key, (device, size) in limits.items()} if limits else None


def memory_limits(value: MaxMemory) -> dict[int | str, tuple[str, int | str]]:
    """``--max-memory`` in ssacli's own grammar, torch-free: device key (``cpu`` or a GPU index) ->
    (the device as given, its size unread: accelerate reads sizes, :func:`_bytes`). Refuses an item
    that is not DEVICE=SIZE, a device that is none of cpu, N, cuda:N, a device given twice, and an
    integer size (bytes) of 0."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    else:
        texts = [value] if isinstance(value, str) else list(value)
        items = []
        for part in (p.strip() for text in texts for p in str(text).split(",")):
            if not part:
                continue
            device, sep, size = part.partition("=")
            if not sep or not device.strip() or not size.strip():
                raise UsageError(f"--max-memory takes DEVICE=SIZE (e.g. cpu=200MB or 0=10GiB), got {part!r}")
            items.append((device.strip(), size.strip()))
    limits: dict[int | str, tuple[str, int | str]] = {}
    for device, size in items:
        key = _memory_device(device)
        if key in limits:
            raise UsageError(f"--max-memory gives {device} twice; give each device once")
        if isinstance(size, bool):
            raise UsageError(f"--max-memory {device}: the size must be {_SIZE_HINT}, got {size!r}")
        if re.fullmatch(r"\d+", str(size).strip()) and int(str(size)) <= 0:
            raise UsageError(f"--max-memory {device}={size}: the size must be more than 0 bytes")
        limits[key] = (device, size)
    return limits


def _memory_device(device: str) -> int | str:
    text = device.lower()
    if text == "cpu":
        return "cpu"
    match = re.fullmatch(r"(?:cuda:)?(\d+)", text)
    if match is None:
        raise UsageError(
            f"--max-memory: unknown device {device!r}; use cpu, a GPU index N or cuda:N "
            "(the disk needs no limit: what fits nowhere else goes there)"
        )
    return int(match.group(1))


def _bytes(device: str, size: int | str) -> int:
    """A size as accelerate reads it (it imports torch): ssacli's grammar (:func:`memory_limits`)
    has no rule for the units, so that none can disagree with accelerate's."""
    from accelerate.utils import convert_file_size_to_int

    text = str(size).strip()
    try:
        count = int(text) if re.fullmatch(r"\d+", text) else convert_file_size_to_int(text)
    except (ValueError, TypeError):
        raise UsageError(f"--max-memory {device}={size}: not {_SIZE_HINT}") from None
    if count <= 0:
        raise UsageError(f"--max-memory {device}={size}: the size must be more than 0 bytes")
    return count


def check_placement(device_map: str | None, max_memory: MaxMemory = None, device: str = "auto") -> None:
    """Refuse, torch-free, what :func:`placement` cannot place: ``max_memory`` without a
    ``device_map``, a ``device_map`` not in :data:`DEVICE_MAPS`, one beside a ``device`` other than
    "auto" (one device and a device map are two answers to one question), accelerate not installed,
    ``max_memory`` outside ssacli's grammar (:func:`memory_limits`), a GPU it names under
    ``device_map`` "cpu" or where the machine has none (:func:`~ssacli.models.devices.cuda_known_absent`).
    The sizes are :func:`placement`'s to read (accelerate reads them, and imports torch), as are the
    GPUs where only torch can count them. An empty ``max_memory`` is none, as in LoadOptions."""
    if device_map is None:
        if max_memory:
            raise UsageError("--max-memory limits a --device-map placement; give --device-map auto with it")
        return
    if device_map not in DEVICE_MAPS:
        raise UsageError(f"unknown --device-map '{device_map}'; use {', '.join(DEVICE_MAPS)}")
    if device != "auto":
        raise UsageError(
            f"--device {device} and --device-map {device_map} both say where the model goes; give one"
        )
    gpus = [key for key in memory_limits(max_memory) if isinstance(key, int)]
    if gpus:
        from .devices import cuda_known_absent

        _check_gpus(gpus, device_map, 0 if cuda_known_absent() else None)
    check_accelerate()


def _check_gpus(gpus: Iterable[int], device_map: str, visible: int | None) -> None:
    """Refuse a GPU index of ``--max-memory`` under ``--device-map cpu``, or beyond the ``visible``
    CUDA devices (None: not known here)."""
    for key in gpus:
        if device_map == "cpu":
            raise UsageError(f"--max-memory {key}=… names a GPU, but --device-map cpu uses none")
        if visible is not None and key >= visible:
            raise UsageError(
                f"--max-memory {key}=…: {visible} CUDA device(s) visible"
                + (f"; use 0..{visible - 1} or cpu" if visible else "; give only cpu=SIZE")
            )


def placement(device_map: str, max_memory: MaxMemory) -> dict[str, Any]:
    """The keywords of ``from_pretrained`` for ``device_map`` and ``max_memory``
    (:func:`parse_max_memory`), once :func:`check_placement` passed them, checked against the
    visible GPUs; the offload folder is made later, by :func:`offload_folder`."""
    memory = parse_max_memory(max_memory)
    import torch

    _check_gpus([key for key in memory or {} if isinstance(key, int)], device_map, torch.cuda.device_count())
    if device_map == "cpu":
        # accelerate places over the devices max_memory names (then the disk): only the CPU here.
        from accelerate.utils import get_max_memory

        memory = {"cpu": (memory or {}).get("cpu") or get_max_memory()["cpu"]}
        return {"device_map": "auto", "max_memory": memory}
    return {"device_map": device_map, "max_memory": memory}


def compute_device(device_map: str):
    """Where a model placed by ``device_map`` mostly computes, for the default dtype: the first GPU
    unless the map is "cpu" or none is visible."""
    import torch

    if device_map != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def from_pretrained_placed(cls: Any, source: Any, kwargs: dict[str, Any], placed: dict | None) -> Any:
    """``cls.from_pretrained(source, **kwargs)``, placed by accelerate unless ``placed`` is None
    (:func:`placement`'s keywords), offloading to a folder of its own (:func:`offload_folder`),
    removed with the model (:func:`own_offload_folder`) or at once when the load fails."""
    if placed is None:
        return cls.from_pretrained(source, **kwargs)
    folder = offload_folder()
    try:
        loaded = cls.from_pretrained(source, **kwargs, **placed, offload_folder=str(folder))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    own_offload_folder(loaded[0] if isinstance(loaded, tuple) else loaded, folder)  # output_loading_info
    return loaded


def offload_folder() -> Path:
    """A fresh folder for disk-offloaded weights, owned by this process (its pid in the name);
    folders of processes that are gone are removed first: real folders (not links) of the current
    user only, since anyone can plant that name in a shared temp folder."""
    root = Path(tempfile.gettempdir())
    for stale in root.glob(OFFLOAD_PREFIX + "*"):
        owner = stale.name[len(OFFLOAD_PREFIX) :].partition("-")[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)) and _ours(stale):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{OFFLOAD_PREFIX}{os.getpid()}-"))


def _ours(folder: Path) -> bool:
    """Whether ``folder`` is a real folder (not a symbolic link) of the current user."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (not hasattr(os, "geteuid") or st.st_uid == os.geteuid())


def own_offload_folder(model: Any, folder: Path) -> None:
    """Remove ``folder`` when ``model`` is freed or the process exits; at once when it is empty
    (safetensors weights are read from the checkpoint in place, nothing was copied)."""
    if not any(folder.iterdir()):
        shutil.rmtree(folder, ignore_errors=True)
        return
    weakref.finalize(model, shutil.rmtree, str(folder), ignore_errors=True)


def save_options(model: Any) -> dict[str, Any]:
    """Extra keywords of ``save_pretrained`` for ``model``: with weights offloaded to the CPU or the
    disk, transformers gathers each shard in RAM before writing it (50GB shards by default), so the
    shards are kept to :data:`OFFLOADED_SHARD`."""
    placed = (getattr(model, "hf_device_map", None) or {}).values()
    return {"max_shard_size": OFFLOADED_SHARD} if "cpu" in placed or "disk" in placed else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
