"""The settings of one conversion (:func:`ssacli.convert`, ``ssacli convert``): what fidelity and m=auto
are measured on and against which target, as one frozen value (:class:`ConvertSettings`). How the
model loads is :class:`~ssacli.models.options.LoadOptions`'; the model, the scorer spec, where the
result is written and an in-memory model's tokenizer stay arguments of the run. A fine-tuning run's
settings are :class:`~ssacli.train.finetune_config.FinetuneConfig`'s and the recipe's
:class:`~ssacli.train.recipe_config.RecipeConfig`'s; this holds only what the conversion measures.
Importing it loads the conversion package (torch among it): the commands build one once their fast
checks have passed, when they are about to convert."""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import CALIBRATION_LENGTH, CALIBRATION_SAMPLES
from ..errors import UsageError


@dataclass(frozen=True)
class ConvertSettings:
    """:func:`ssacli.convert`'s keywords of these names (its docstring says what each does): the
    calibration (``samples`` windows of ``length`` tokens of ``text``, None: the built-in probe texts,
    cut at ``seed``), the fidelity target ``max_error`` (None: the model kind's default) and
    ``strict`` (refuse a family the all-family audit does not cover). A bad target is a UsageError
    here, before any model loads."""

    text: str | None = None
    samples: int = CALIBRATION_SAMPLES
    length: int = CALIBRATION_LENGTH
    seed: int = 0
    max_error: float | None = None
    strict: bool = False

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
