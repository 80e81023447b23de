"""Import a module of ssacli's Triton kernels for the Triton interpreter (TRITON_INTERPRET=1, CPU tensors).

triton.jit reads TRITON_INTERPRET when a kernel is defined, i.e. when its module is first imported; the
variable is set for that import only, so the worker's other tests and subprocesses do not inherit it.
A module imported earlier in the process for a GPU stays compiled: the caller checks its INTERPRETED.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def import_interpreted(name: str) -> ModuleType:
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return importlib.import_module(name)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
