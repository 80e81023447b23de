"""The settings of one before/after report (:func:`ssacli.compare_models`, ``ssacli report``): what is
measured on every model and with what inputs, as one frozen value (:class:`ReportSettings`). How the
models load is :class:`~ssacli.models.options.LoadOptions`'; the models, the progress callback and an
earlier report to reuse stay arguments of the run. Cheap to import (no torch): the CLI builds one
from its flags before the model stack is imported."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..defaults import (
    BATCH_SIZE,
    ICL_OUTLIERS,
    ICL_POINTS,
    ICL_PROMPTS,
    ICL_SIGMAS,
    LM_MAX_TOKENS,
    LM_SEQ_LEN,
    PAIRS_LIMIT,
    SAMPLES,
    SEED,
)

if TYPE_CHECKING:
    from .harness import LMEvalPlan


@dataclass(frozen=True)
class ReportSettings:
    """:func:`ssacli.compare_models`' keywords of these names (its docstring says what each does):
    the texts (``text_id``, ``text_ood`` as strings or file paths, or ``heldout_of`` a training
    ``--data``), the minimal ``pairs`` and how many (``pairs_limit``), the diagnose ``probes`` (specs;
    None: the defaults) on ``samples`` sequences (on random token ids with ``random_ids``), the LM
    loss's ``seq_len``, ``max_tokens`` and ``batch_size``, an ICL model's ``sigmas``, ``outliers``,
    ``icl_length`` and ``prompts``, one ``seed`` for all, the built-in texts and pairs where none are
    given (``builtin``), and lm-evaluation-harness tasks (``lm_eval_plan``)."""

    text_id: str | Path | None = None
    text_ood: str | Path | None = None
    heldout_of: str | Path | None = None
    pairs: str | Path | Sequence[dict] | dict | None = None
    pairs_limit: int | None = PAIRS_LIMIT
    probes: Sequence[str] | None = None
    seed: int = SEED
    samples: int = SAMPLES
    seq_len: int = LM_SEQ_LEN
    max_tokens: int = LM_MAX_TOKENS
    batch_size: int = BATCH_SIZE
    sigmas: Sequence[float] = ICL_SIGMAS
    outliers: Sequence[tuple[float, int]] = ICL_OUTLIERS
    icl_length: int = ICL_POINTS
    prompts: int = ICL_PROMPTS
    builtin: bool = True
    lm_eval_plan: LMEvalPlan | None = None
    random_ids: bool = False

    def lm_eval_settings(self) -> dict[str, Any] | None:
        """The lm-eval plan as the report records it (None: no lm-eval)."""
        return self.lm_eval_plan.as_dict() if self.lm_eval_plan is not None else None

    def reuse_key(self, probes: list[str] | str, builtin: dict[str, str]) -> dict[str, Any]:
        """The settings an earlier report's BEFORE must have been measured with to be reused
        (``probes``: the probe specs run, or "default"; ``builtin``: the built-in measures chosen)."""
        return dict(seed=self.seed, samples=self.samples, seq_len=self.seq_len, max_tokens=self.max_tokens,
                    pairs_limit=self.pairs_limit, probes=probes, builtin=builtin,
                    lm_eval=self.lm_eval_settings())  # fmt: skip

    def recorded(self, probes: list[str] | str, builtin: dict[str, str], names: dict[str, str | None]):
        """``report.settings``, in its order: what was measured, with the names of the input files."""
        return dict(
            seed=self.seed,
            samples=self.samples,
            seq_len=self.seq_len,
            max_tokens=self.max_tokens,
            pairs_limit=self.pairs_limit,
            probes=probes,
            icl_sigmas=list(self.sigmas),
            icl_outliers=[list(o) for o in self.outliers],
            icl_length=self.icl_length,
            icl_prompts=self.prompts,
            builtin=builtin,
            lm_eval=self.lm_eval_settings(),
            **names,
        )
