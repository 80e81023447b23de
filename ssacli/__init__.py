"""ssacli: attention-saturation diagnostics for Hugging Face transformers.

The public API (the CLI is a thin layer over it):

* :func:`make_scorer`, :func:`describe_scorer`, :data:`SCORERS`: attention scorers (softmax, SSA, …)
  built from spec strings such as ``"ssa:init=faithful,m=256"``.
* :func:`apply_scorer`, :func:`restore`, :func:`supports`, :func:`scorers_of`: run a transformers
  model with any scorer in every attention layer, and go back; :func:`attention_backend` picks the
  fused kernels (the default where no weights are needed) or the eager scorer.
* :func:`ssa_attention`: fused SSA attention (blocked on CPU, flex_attention on CUDA), no [q, k]
  weight matrix, forward and backward.
* :func:`diagnose` -> :class:`DiagnoseResult`: probe a model with magnitude shifts and measure
  per-layer, per-head saturation; :func:`load_model` resolves MODEL references;
  :func:`compare_results` puts two results side by side.

The model-facing half imports transformers (seconds), so it is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import SpecError, SsacliError, UnsupportedModelError
from .scorers import SCORERS, Scorer, describe_scorer, make_scorer, parse_spec, register_scorer, scorer_table
from .version import __version__

_LAZY = {
    "apply_scorer": "attention.interface",
    "restore": "attention.interface",
    "supports": "attention.interface",
    "scorers_of": "attention.interface",
    "attention_modules": "attention.interface",
    "attention_backend": "attention.interface",
    "ssa_attention": "kernels.fused",
    "diagnose": "diagnosis.run",
    "load_model": "models.loading",
    "load": "models.loading",
    "convert": "conversion",
    "save_model": "conversion",
    "DiagnoseResult": "diagnosis.result",
    "ProbeResult": "diagnosis.result",
    "compare_results": "diagnosis.comparison",
    "parse_probe": "diagnosis.probes",
    "run_check": "check.requirements",
    "parse_requirement": "check.requirements",
    "compare_models": "quality.compare",
    "language_model_loss": "quality.measures",
    "minimal_pairs": "quality.measures",
    "icl_error_by_sigma": "quality.measures",
}

if TYPE_CHECKING:
    from .attention.interface import (
        apply_scorer,
        attention_backend,
        attention_modules,
        restore,
        scorers_of,
        supports,
    )
    from .check.requirements import parse_requirement, run_check
    from .conversion import convert, save_model
    from .diagnosis.comparison import compare_results
    from .diagnosis.probes import parse_probe
    from .diagnosis.result import DiagnoseResult, ProbeResult
    from .diagnosis.run import diagnose
    from .kernels.fused import ssa_attention
    from .models.loading import load, load_model
    from .quality.compare import compare_models
    from .quality.measures import icl_error_by_sigma, language_model_loss, minimal_pairs


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'ssacli' has no attribute {name!r}")


__all__ = [
    "DiagnoseResult",
    "ProbeResult",
    "SCORERS",
    "Scorer",
    "SpecError",
    "SsacliError",
    "UnsupportedModelError",
    "__version__",
    "apply_scorer",
    "attention_backend",
    "attention_modules",
    "compare_models",
    "compare_results",
    "diagnose",
    "icl_error_by_sigma",
    "language_model_loss",
    "minimal_pairs",
    "convert",
    "load",
    "load_model",
    "save_model",
    "parse_probe",
    "parse_requirement",
    "run_check",
    "describe_scorer",
    "make_scorer",
    "parse_spec",
    "register_scorer",
    "restore",
    "scorer_table",
    "scorers_of",
    "ssa_attention",
    "supports",
]
