"""The settings of one :func:`ssacli.diagnose` run: what it probes with and how it reduces each
attention row, as one frozen value checked in one place (:class:`DiagnoseSettings`). How the model
is loaded is :class:`~ssacli.models.options.LoadOptions`'; which probes run, the scorer and
``strict`` stay arguments of the run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..attention.online import STATS_MODES
from ..errors import UsageError


@dataclass(frozen=True)
class DiagnoseSettings:
    """Inputs (the built-in texts, ``text``, ``random_ids``, or token-id lists ``inputs``), how many
    and how long (``samples`` sequences per probe level of ``length`` tokens, ICL: points; None: the
    model kind's default), and the reduction (``tau``, ``top_k``, ``block_size``, ``stats``, ``sink_k``): as
    :func:`ssacli.diagnose`'s keywords of those names. A bad value is a UsageError here, before any
    model loads."""

    text: str | None = None
    random_ids: bool = False
    inputs: Sequence[Sequence[int]] | None = None
    samples: int = defaults.SAMPLES
    length: int | None = None
    batch_size: int = defaults.BATCH_SIZE
    seed: int = defaults.SEED
    tau: float = defaults.TAU
    top_k: int = defaults.TOP_K
    block_size: int = defaults.BLOCK_ROWS
    stats: str = defaults.STATS
    sink_k: int = defaults.SINK_K  # the first k keys of the sink and position metrics
    # a natural shift (the ``shift`` probe, ssacli.diagnosis.shift): the shifted corpus's text, and
    # the name reports call it by (the CLI: the --shift file's name)
    shift: str | None = None
    shift_name: str = "shift"

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
        if self.stats not in STATS_MODES:
            raise UsageError(f"--stats takes {', '.join(STATS_MODES)}, got {self.stats!r}")
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
