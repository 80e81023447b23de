"""Swap a pretrained model's attention scorer, measure how close it stays, and save it.

A converted folder is an ordinary ``save_pretrained`` folder (plain transformers loads a faithful
conversion as the original architecture, with softmax attention, and refuses any other:
:func:`ssacli.models.checkpoint.plain_loadable`), plus ssacli's part (``ssacli.json`` and the scorer's
parameters; the format is :mod:`ssacli.models.checkpoint`'s, which also reads it back). ICL models
keep their own folder format. The conversion and saving are :mod:`.run`'s; how close the converted
model stays is :mod:`.calibration`'s measure; the per-layer m of ``ssa:init=faithful`` with m=auto is
:mod:`.m_auto`'s choice; what a conversion measures is :mod:`.settings`' (ConvertSettings).

Their public names are importable from here, each loaded on first use (PEP 562): importing the
package, or its torch-free :mod:`.settings` (which the CLI reads to build its options), imports
no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["check_out", "convert", "convert_with", "save_model"]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(".run", __name__), name)
