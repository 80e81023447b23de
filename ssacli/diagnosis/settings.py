"""The settings of one :func:`ssacli.diagnose` run, as one frozen value checked in one place
(:class:`DiagnoseSettings`): which probes run, on which inputs, how each attention row is reduced,
the scorer, ``strict`` and ``generate``. How the model is loaded is
:class:`~ssacli.models.options.LoadOptions`'. Each field's help is its ``ssacli diagnose`` option's
(:func:`ssacli.setting.setting`): the command's options are built from these fields. Cheap to import
(no torch): the CLI reads the fields to build its options."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import defaults
from ..errors import UsageError
from ..setting import setting

if TYPE_CHECKING:
    from .probe_kinds import Probe

TEXT_HELP = "UTF-8 text file to probe with (default: built-in texts)."  # diagnose, attribute
RANDOM_HELP = "Probe with random token ids (needed for a model without a tokenizer)."
TAU_HELP = "A row has collapsed when its largest weight is >= tau."
STRICT_HELP = (
    "Refuse a family the all-family audit did not cover (docs/models.md)."  # diagnose, convert, check
)


@dataclass(frozen=True)
class DiagnoseSettings:
    """What :func:`ssacli.diagnose` probes with and how it reduces, as its keywords of these names:
    ``probes`` (specs such as ``"outlier:10,100"`` or Probes; None: every probe that applies), a
    ``scorer`` spec to re-score attention with first, the inputs (the built-in texts, ``text``,
    ``random_ids``, or token-id lists ``inputs``; a shifted corpus ``shift``, named ``shift_name``),
    how many and how long (``samples`` sequences per probe level of ``length`` tokens, ICL: points;
    None: the model kind's default), the reduction (``tau``, ``top_k``, ``sink_k``, ``block_size``,
    ``stats``), ``strict`` (refuse an unaudited family) and ``generate`` (decoding steps to measure
    too). On the command line ``text`` and ``shift`` are files, read into these fields. A bad value
    is a UsageError here, before any model loads."""

    probes: Sequence[str | Probe] | None = setting(
        None,
        "NAME or NAME:L1,L2,… (repeatable; default: all that apply), e.g. outlier:10,100.",
        flags=("--probe",),
        type=list[str],
    )
    scorer: str | None = setting(
        None, "Re-score attention with this spec first, e.g. ssa:init=faithful.", type=str
    )
    text: str | None = setting(None, TEXT_HELP, type=Path)
    # a natural shift (the ``shift`` probe, ssacli.diagnosis.shift): the shifted corpus's text, and
    # the name reports call it by (the CLI: the --shift file's name)
    shift: str | None = setting(
        None,
        "A shifted corpus (UTF-8 text: another domain, language, code…): adds the 'shift' probe, "
        "--text's documents against FILE's, matched in length, with per-document loss and collapse.",
        type=Path,
        metavar="FILE",
    )
    shift_name: str = "shift"
    random_ids: bool = setting(False, RANDOM_HELP, flags=("--random",))
    inputs: Sequence[Sequence[int]] | None = None
    samples: int = setting(defaults.SAMPLES, "Sequences per probe level.", min=1)
    length: int | None = setting(
        None,
        f"Base length in tokens (ICL: points); default {defaults.PROBE_LENGTH} ({defaults.ICL_POINTS}).",
        type=int,
        min=2,
    )
    batch_size: int = setting(defaults.BATCH_SIZE, "Sequences per forward pass.", min=1)
    seed: int = setting(defaults.SEED, "Seed of inputs, targets and numbers.")
    tau: float = setting(defaults.TAU, TAU_HELP)
    top_k: int = setting(defaults.TOP_K, "k of the top-k mass metric.", min=1)
    sink_k: int = setting(  # the first k keys of the sink and position metrics
        defaults.SINK_K, "The first k tokens of the sink metrics (sink@k, boost).", min=1
    )
    block_size: int = setting(
        defaults.BLOCK_ROWS, "Query rows scored at a time (memory O(block × keys)).", min=1
    )
    stats: str = setting(
        defaults.STATS,
        "eager: metrics from blocks of weights; fused: from running row statistics of one "
        "blocked pass (softmax, temperature, ssa, ssmax, sink, softmax1); auto: fused where it applies.",
        metavar="MODE",
    )
    strict: bool = setting(False, STRICT_HELP)
    generate: int | None = setting(
        None,
        "Also greedy-generate N tokens after each prompt and measure every decoding step's "
        "attention against the KV cache (checked against a full recomputation).",
        type=int,
        min=1,
        metavar="N",
    )

    def __post_init__(self) -> None:
        sources = {"--text": self.text is not None, "--random": self.random_ids,
                   "inputs": self.inputs is not None}  # fmt: skip
        given = [name for name, chosen in sources.items() if chosen]
        if len(given) > 1:  # each alone decides what the probes read: the others would be dropped unsaid
            raise UsageError(
                f"{' and '.join(given)} each choose the probe inputs (text=, random_ids=, inputs= in the "
                "API); give one"
            )
        for name in ("text", "shift"):  # a path handed as the text would be tokenized as the text
            value = getattr(self, name)
            if isinstance(value, os.PathLike) or (
                isinstance(value, str) and "\n" not in value and len(value) < 4096 and os.path.isfile(value)
            ):
                raise UsageError(
                    f"{name}= takes the text itself, not a file's path ({os.fspath(value)!r}); pass "
                    f"{name}=Path({os.fspath(value)!r}).read_text() (the CLI's --{name} reads the file)"
                )
        if self.shift is not None:
            if self.random_ids or self.inputs is not None:
                raise UsageError(
                    "--shift compares the reference text with the shifted corpus; it cannot run on "
                    f"{'--random ids' if self.random_ids else 'given inputs'} (drop one)"
                )
            if not self.shift.strip():
                raise UsageError("the --shift corpus is empty; give a file with some text")
        for name, low in (("samples", 1), ("batch_size", 1), ("block_size", 1)):
            value = getattr(self, name)
            if value < low:
                raise UsageError(f"{name.replace('_', '-')} must be >= {low}, got {value}")
        from ..kernels.routing import MODEL_BACKENDS  # torch: checked when built, not when imported

        if self.stats not in MODEL_BACKENDS:
            raise UsageError(f"--stats takes {', '.join(MODEL_BACKENDS)}, got {self.stats!r}")
        if not 0 < self.tau <= 1:
            raise UsageError(f"tau must be in (0, 1], got {self.tau}")
        if self.top_k < 1:
            raise UsageError(f"top-k must be >= 1, got {self.top_k}")
        if self.sink_k < 1:
            raise UsageError(f"sink-k must be >= 1, got {self.sink_k}")

    def base_length(self, icl: bool) -> int:
        """``length``, or the default for the model's kind: ICL prompts in points, else tokens."""
        return self.length or (defaults.ICL_POINTS if icl else defaults.PROBE_LENGTH)

    def recorded(self) -> dict[str, Any]:
        """The settings a result records first (``DiagnoseResult.settings``), in its order."""
        names = ("seed", "tau", "top_k", "sink_k", "samples", "batch_size", "block_size")
        return {k: getattr(self, k) for k in names}
