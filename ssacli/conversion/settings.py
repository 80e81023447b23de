"""The settings of one conversion (:func:`ssacli.convert`, ``ssacli convert``): what fidelity and m=auto
are measured on and against which target, as one frozen value (:class:`ConvertSettings`). How the
model loads is :class:`~ssacli.models.options.LoadOptions`'; the model, the scorer spec, where the
result is written and an in-memory model's tokenizer stay arguments of the run. A fine-tuning run's
settings are :class:`~ssacli.train.finetune_config.FinetuneConfig`'s and the recipe's
:class:`~ssacli.train.recipe_config.RecipeConfig`'s; this holds only what the conversion measures.
Each option field's help is its ``ssacli convert`` option's (:func:`ssacli.setting.setting`): the
command's options are built from these fields. Cheap to import (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..defaults import CALIBRATION_LENGTH, CALIBRATION_SAMPLES, MAX_KL_PER_TOKEN, MAX_RELATIVE_ERROR
from ..diagnosis.settings import STRICT_HELP
from ..errors import UsageError
from ..setting import setting


@dataclass(frozen=True)
class ConvertSettings:
    """:func:`ssacli.convert`'s keywords of these names (its docstring says what each does): the
    calibration (``samples`` windows of ``length`` tokens of ``text``, None: the built-in probe texts,
    cut at ``seed``), the fidelity target ``max_error`` (None: the model kind's default) and
    ``strict`` (refuse a family the all-family audit does not cover). On the command line ``text``
    is a file, read into the field. A bad target is a UsageError here, before any model loads."""

    text: str | None = setting(
        None,
        "Calibration text file: fidelity and m=auto are measured on windows of it (default: the "
        "start of --data when fine-tuning a text, else the built-in probe texts).",
        type=Path,
    )
    samples: int = CALIBRATION_SAMPLES
    length: int = CALIBRATION_LENGTH
    seed: int = 0
    max_error: float | None = setting(
        None,
        f"Fidelity target: KL nats/token for models with a vocabulary (default "
        f"{MAX_KL_PER_TOKEN:g}), relative error of the output otherwise (default "
        f"{MAX_RELATIVE_ERROR:g}). m=auto meets it or exits 5.",
        type=float,
    )
    strict: bool = setting(False, STRICT_HELP)

    def __post_init__(self) -> None:
        if self.max_error is not None and not (0 < self.max_error < float("inf")):
            raise UsageError(f"--max-error must be a positive number, got {self.max_error}")

    def recorded(self) -> dict[str, object]:
        """The calibration as a fidelity report records it (``report["calibration"]``)."""
        return {
            "text": "--text file" if self.text is not None else "built-in probe texts",
            "samples": self.samples,
            "length": self.length,
            "seed": self.seed,
        }


__all__ = ["ConvertSettings"]
