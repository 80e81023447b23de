"""The settings of one before/after report (:func:`ssacli.compare_models`, ``ssacli report``): what is
measured on every model and with what inputs, as one frozen value (:class:`ReportSettings`, with
lm-evaluation-harness tasks as an :class:`LMEvalPlan`, run by :mod:`ssacli.quality.harness`). How the
models load is :class:`~ssacli.models.options.LoadOptions`'; the models, the progress callback and an
earlier report to reuse stay arguments of the run. Cheap to import (no torch): the CLI builds one
from its flags before the model stack is imported."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..defaults import (
    BATCH_SIZE,
    ICL_OUTLIERS,
    ICL_OUTLIERS_TEXT,
    ICL_POINTS,
    ICL_PROMPTS,
    ICL_SIGMAS,
    ICL_SIGMAS_TEXT,
    LM_MAX_TOKENS,
    LM_SEQ_LEN,
    PAIRS_LIMIT,
    SAMPLES,
    SEED,
)
from ..diagnosis.settings import RANDOM_HELP
from ..setting import setting


@dataclass(frozen=True)
class LMEvalPlan:
    """Which lm-eval tasks to run and how: ``tasks`` (names or task YAML paths), ``num_fewshot``
    (None: each task's own default), ``limit`` (the first N items per task; None: all),
    ``include_path`` (a folder of task YAMLs, lm-eval's ``--include_path``), ``batch_size``. Each
    field's help is its ``ssacli report`` option's."""

    tasks: tuple[str, ...] = setting(
        help="lm-evaluation-harness tasks (names or task YAML files, comma-separated) on both; "
        'needs pip install "ssacli\\[eval]"; data downloads unless --offline.',
        flags=("--lm-eval",),
        type=str,
        default_text=None,  # ssacli report: no lm-eval
        metavar="TASKS",
    )
    num_fewshot: int | None = setting(
        None, "--lm-eval: few-shot examples (default: each task's own).", flags=("--lm-eval-fewshot",),
        type=int, min=0,
    )  # fmt: skip
    limit: int | None = setting(
        None, "--lm-eval: the first N items of each task (default: all).", flags=("--lm-eval-limit",),
        type=int, min=1,
    )  # fmt: skip
    include_path: str | None = setting(
        None, "--lm-eval: a folder of task YAML files to add.", flags=("--lm-eval-include",), type=Path
    )
    batch_size: int = 8

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tasks": list(self.tasks)}


@dataclass(frozen=True)
class ReportSettings:
    """:func:`ssacli.compare_models`' keywords of these names (its docstring says what each does):
    the texts (``text_id``, ``text_ood`` as strings or file paths, or ``heldout_of`` a training
    ``--data``), the minimal ``pairs`` and how many (``pairs_limit``; None: all), the built-in texts
    and pairs where none are given (``builtin``), lm-evaluation-harness tasks (``lm_eval_plan``), the
    diagnose ``probes`` (specs; None: the defaults) on ``samples`` sequences (on random token ids with
    ``random_ids``), one ``seed`` for all, the LM loss's ``seq_len``, ``max_tokens`` and
    ``batch_size``, and an ICL model's ``sigmas``, ``outliers``, ``icl_length`` and ``prompts``.
    Each option field's help is its ``ssacli report`` option's (the command line gives ``pairs_limit``
    0 for all, ``sigmas`` and ``outliers`` comma-separated)."""

    text_id: str | Path | None = setting(
        None, "UTF-8 text like the training data: LM loss, perplexity.", type=Path
    )
    text_ood: str | Path | None = setting(
        None, "UTF-8 text unlike it: out-of-distribution LM loss.", type=Path
    )
    heldout_of: str | Path | None = setting(
        None,
        "Training --data: its held-out last tenth is the in-distribution text (or --text-id).",
        type=Path,
    )
    pairs: str | Path | Sequence[dict] | dict | None = setting(
        None, "BLiMP-style .jsonl (sentence_good, sentence_bad) or a folder.", type=Path
    )
    pairs_limit: int | None = setting(PAIRS_LIMIT, "Pairs per file (its first N; 0 = all).", min=0)
    builtin: bool = True
    lm_eval_plan: LMEvalPlan | None = None
    probes: Sequence[str] | None = setting(
        None, "Diagnose probe NAME[:L1,L2,…] (repeatable; default all).", flags=("--probe",), type=list[str]
    )
    seed: int = setting(SEED, "One seed for both models: masking, ICL prompts, probe inputs.")
    samples: int = setting(SAMPLES, "Sequences per probe level.", min=1)
    random_ids: bool = setting(False, RANDOM_HELP, flags=("--random",))
    seq_len: int = setting(LM_SEQ_LEN, "LM loss window in tokens (capped at the model's).", min=2)
    max_tokens: int = setting(LM_MAX_TOKENS, "LM loss reads at most this many tokens per text.", min=2)
    batch_size: int = setting(BATCH_SIZE, "Windows per forward pass.", min=1)
    sigmas: Sequence[float] = setting(
        ICL_SIGMAS, "ICL models: σ of the inputs, comma-separated.", flags=("--sigma",), type=str,
        default_text=ICL_SIGMAS_TEXT,
    )  # fmt: skip
    outliers: Sequence[tuple[float, int]] = setting(
        ICL_OUTLIERS, "ICL models: VALUE@POSITION outliers ('' = none).", flags=("--outlier",), type=str,
        default_text=ICL_OUTLIERS_TEXT,
    )  # fmt: skip
    icl_length: int = setting(ICL_POINTS, "ICL models: points per prompt.", min=2)
    prompts: int = setting(ICL_PROMPTS, "ICL models: prompts per cell.", min=1)

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
