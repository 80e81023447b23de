"""ssacli: attention-saturation diagnostics for Hugging Face transformers.

The public API (the CLI is a thin layer over it):

* :func:`make_scorer`, :data:`SCORERS`: build attention scorers (softmax, SSA, …) from spec strings.
* :func:`apply_scorer`, :func:`restore`, :func:`supports`: run a transformers model with any scorer.
"""

__version__ = "0.1.0"

from .attention import apply_scorer, attention_modules, restore, scorers_of, supports  # noqa: E402
from .errors import SpecError, SsacliError, UnsupportedModelError  # noqa: E402
from .scorers import SCORERS, Scorer, make_scorer, parse_spec, register_scorer, scorer_table  # noqa: E402

__all__ = [
    "SCORERS",
    "Scorer",
    "SpecError",
    "SsacliError",
    "UnsupportedModelError",
    "__version__",
    "apply_scorer",
    "attention_modules",
    "make_scorer",
    "parse_spec",
    "register_scorer",
    "restore",
    "scorer_table",
    "scorers_of",
    "supports",
]
