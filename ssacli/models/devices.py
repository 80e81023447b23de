"""Where a model runs (``--device``): the names it takes, and whether a CUDA device can be there.

:func:`check_device` is the check a front end runs before the model stack loads (issue 54): the
name is checked on the command line alone, and ``cuda`` is refused without torch where the machine
says there can be none. That is known without torch in two cases only: torch is a CPU-only build
(its installed version carries the ``+cpu`` local label, as the CPU wheels are published), or, on
Linux, no GPU device node exists (``/dev/nvidia*`` for NVIDIA's driver, ``/dev/dxg`` for WSL2,
``/dev/kfd`` for ROCm, whose torch answers to ``cuda`` too); macOS has no CUDA torch. Anywhere else
only torch can tell: torch alone is imported then (not transformers), and asked.
:func:`resolve_device` is what loading uses, with the same messages.
"""

from __future__ import annotations

import glob
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    import torch

_CUDA = re.compile(r"cuda(:\d+)?")
GPU_NODES = ("/dev/nvidia*", "/dev/dxg", "/dev/kfd")  # NVIDIA's driver, WSL2's, ROCm's


def parse_device(device: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` as given; anything else is a UsageError."""
    if device in ("auto", "cpu") or _CUDA.fullmatch(device):
        return device
    raise UsageError(f"unknown device '{device}'; use auto, cpu, cuda or cuda:N")


def _no_cuda(device: str) -> UsageError:
    return UsageError(
        f"--device {device} was asked for but no CUDA device is visible; use --device cpu or auto"
    )


def cuda_known_absent() -> bool:
    """Whether this machine has no CUDA device for torch, as far as it can be told without torch:
    a CPU-only torch build, macOS, or Linux without a GPU device node. False means "ask torch"."""
    try:
        if metadata.version("torch").partition("+")[2] == "cpu":
            return True
    except metadata.PackageNotFoundError:
        pass
    if sys.platform == "darwin":
        return True
    if sys.platform.startswith("linux") and Path("/dev").is_dir():
        return not any(glob.glob(pattern) for pattern in GPU_NODES)
    return False


def check_device(device: str) -> None:
    """Refuse, before transformers loads, a ``--device`` that names nothing or a CUDA device that is
    not there: without torch where the machine tells (:func:`cuda_known_absent`), else with torch
    alone (:func:`resolve_device`)."""
    if not _CUDA.fullmatch(parse_device(device)):
        return
    if cuda_known_absent():
        raise _no_cuda(device)
    resolve_device(device)


def resolve_device(device: str) -> torch.device:
    """``auto`` (CUDA when visible, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    import torch

    parse_device(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise _no_cuda(device)
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise UsageError(f"--device {device}: only {count} CUDA device(s); use cuda:0..{count - 1}")
    return torch.device(device)
