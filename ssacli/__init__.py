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

__version__ = "0.1.0"

_LAZY = {
    "apply_scorer": "attention",
    "restore": "attention",
    "supports": "attention",
    "scorers_of": "attention",
    "attention_modules": "attention",
    "attention_backend": "attention",
    "ssa_attention": "fused",
    "diagnose": "diagnosis",
    "load_model": "loading",
    "load": "loading",
    "convert": "conversion",
    "save_model": "conversion",
    "DiagnoseResult": "results",
    "ProbeResult": "results",
    "compare_results": "results",
    "parse_probe": "probes",
    "run_check": "check",
    "parse_requirement": "check",
    "compare_models": "comparison",
    "language_model_loss": "evaluation",
    "minimal_pairs": "evaluation",
    "icl_error_by_sigma": "evaluation",
}

if TYPE_CHECKING:
    from .attention import apply_scorer, attention_backend, attention_modules, restore, scorers_of, supports
    from .check import parse_requirement, run_check
    from .comparison import compare_models
    from .conversion import convert, save_model
    from .diagnosis import diagnose
    from .evaluation import icl_error_by_sigma, language_model_loss, minimal_pairs
    from .fused import ssa_attention
    from .loading import load, load_model
    from .probes import parse_probe
    from .results import DiagnoseResult, ProbeResult, compare_results


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
