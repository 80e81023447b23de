"""Magnitude-shift probes, what each one changes and its levels: torch-free, so ``--probe`` is
checked before torch is imported (:mod:`ssacli.diagnosis.plan` makes the inputs).

A probe is a name and ascending levels (``embed-scale:1,4,16``); higher levels are harsher. Each
kind declares where it acts (:class:`ActsOn`) and, for embeddings, keys and logits, its ``effect``
(:class:`Shift`); the
forward pass (:mod:`ssacli.diagnosis.forward`) and the input plan (:mod:`ssacli.diagnosis.plan`)
dispatch on those, never on a probe's name.

* ``embed-scale`` σ: the input-embedding module's output times σ (ICL models: the x values).
* ``outlier`` σ: one token's embedding times σ (ICL: one x value); its captured mass is measured.
* ``key-scale`` σ: one token's key vectors times σ in every layer and head, as the attention function
  receives them (after projection, norm and rotary): the magnitude outlier as attention sees it.
* ``logit-scale`` α: every attention logit times α, inside the attention function (Theorem 1).
* ``dominant-key`` M: M added to one key's logit for every query (Theorem 2); M = 0 is no change.
* ``length`` ×m: inputs m times the base length, up to the model's maximum positions (a level
  given beyond them is refused).
* ``numeric`` d: sentence templates holding d-digit numbers (models with a tokenizer).
* ``shift``: a natural shift, level 0 the user's reference text and level 1 a shifted corpus
  (``--shift FILE``), matched in length (:mod:`ssacli.diagnosis.shift`); run only when a shifted
  corpus is given, never among the defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..errors import UsageError


class ActsOn(Enum):
    """Where a probe acts."""

    INPUT_LENGTH = "input length"  # the inputs are level × the base length
    INPUT_TEXT = "input text"  # the inputs are the numeric templates with level-digit numbers
    INPUT_CORPUS = "input corpus"  # level 0: documents of the reference text, 1: of the shifted corpus
    EMBEDDINGS = "embeddings"  # the input embeddings' output (ICL: the x values) go through ``effect``
    KEYS = "attention keys"  # every attention call's key vectors go through ``effect`` (ssacli's function)
    LOGITS = "attention logits"  # every attention call's logits go through ``effect`` (ssacli's function)


class Shift(Enum):
    """What a magnitude probe does to the tensor it acts on (``ActsOn`` says which tensor);
    :mod:`ssacli.diagnosis.forward`, which runs every forward under a probe, applies it. A target is
    each sample's target token: along dim 1 of the embeddings, dim 2 of the keys, the last dim of the
    logits."""

    SCALE = "× level"  # everything (embed-scale σ, logit-scale α)
    SCALE_TARGET = "target entry × level"  # each sample's target embedding (outlier σ)
    SCALE_TARGET_KEY = "target key vector × level"  # in every head (key-scale σ)
    RAISE_TARGET_KEY = "target key's logit + level"  # for every query and head (dominant-key M)


@dataclass(frozen=True)
class ProbeKind:
    name: str
    defaults: tuple[float, ...]
    symbol: str  # how a level is written in tables: σ=4, α=8, M=16, ×2, 5 digits
    help: str
    acts_on: ActsOn
    effect: Shift | None = None  # what it does to the embeddings, keys or logits (acts_on says which)
    neutral: float | None = None  # the level that changes nothing (its effect is skipped there)
    integer: bool = False
    allow_zero: bool = False
    needs_tokenizer: bool = False
    has_target: bool = False  # one target token per sample (its captured mass is measured)
    magnitude: bool = False  # shifts a magnitude: its reach is measured (ProbeResult.reached)
    additive: bool = False  # the level is added (M), not a factor: its reach is the target logits' mean shift
    axis: str = "level"  # a level's variable and unit, as plot axes name it: "σ (embeddings × σ)"

    @property
    def needs_route(self) -> bool:
        """Changes keys or logits: needs ssacli's attention function."""
        return self.acts_on in (ActsOn.KEYS, ActsOn.LOGITS)

    def changes(self, level: float) -> bool:
        """Whether ``level`` changes anything (False at the neutral level)."""
        return level != self.neutral


PROBES: dict[str, ProbeKind] = {
    k.name: k
    for k in (
        ProbeKind("embed-scale", (1, 2, 4, 8, 16, 32), "σ", "input embeddings × σ", ActsOn.EMBEDDINGS,
                  Shift.SCALE, neutral=1, magnitude=True, axis="σ (input embeddings × σ)"),
        ProbeKind("outlier", (1, 10, 100, 1000), "σ", "one token's embedding × σ", ActsOn.EMBEDDINGS,
                  Shift.SCALE_TARGET, neutral=1, has_target=True, magnitude=True,
                  axis="σ (one token's embedding × σ)"),
        ProbeKind("key-scale", (1, 2, 4, 8, 16, 32), "σ", "one token's keys × σ", ActsOn.KEYS,
                  Shift.SCALE_TARGET_KEY, neutral=1, has_target=True, magnitude=True,
                  axis="σ (one token's keys × σ)"),
        ProbeKind("logit-scale", (1, 2, 4, 8, 16, 32), "α", "attention logits × α", ActsOn.LOGITS,
                  Shift.SCALE, neutral=1, magnitude=True, axis="α (attention logits × α)"),
        ProbeKind("dominant-key", (0, 2, 4, 8, 16, 32), "M", "one key's logit + M", ActsOn.LOGITS,
                  Shift.RAISE_TARGET_KEY, neutral=0, allow_zero=True, has_target=True, magnitude=True,
                  additive=True, axis="M (added to one key's logit)"),
        ProbeKind("length", (1, 2, 4, 8, 16, 32, 64, 128), "×", "inputs × m longer, up to the model's "
                  "maximum positions", ActsOn.INPUT_LENGTH, integer=True,
                  axis="input length (× the base length in tokens)"),
        ProbeKind("numeric", (2, 3, 4, 5, 6, 7, 8, 9), "digits", "numbers of d digits", ActsOn.INPUT_TEXT,
                  integer=True, needs_tokenizer=True, axis="digits per number"),
        ProbeKind("shift", (0, 1), "corpus", "the reference text (0) against a shifted corpus (1)",
                  ActsOn.INPUT_CORPUS, neutral=0, allow_zero=True, needs_tokenizer=True,
                  axis="corpus (0: reference, 1: shifted)"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Probe:
    name: str
    levels: tuple[float, ...]

    @property
    def kind(self) -> ProbeKind:
        return PROBES[self.name]

    def __str__(self) -> str:
        return f"{self.name}:{','.join(f'{v:g}' for v in self.levels)}"


def parse_probe(text: str) -> Probe:
    """``NAME`` (default levels) or ``NAME:L1,L2,…``; levels are sorted and de-duplicated."""
    name, colon, raw = text.strip().partition(":")
    kind = PROBES.get(name.strip())
    if kind is None:
        raise UsageError(f"unknown probe '{name}'; choose from: {', '.join(PROBES)}")
    if kind.acts_on is ActsOn.INPUT_CORPUS and colon:  # its two levels are the two corpora
        raise UsageError(
            f"probe '{kind.name}' takes no levels (0: the reference text, 1: the --shift corpus); give "
            f"'{kind.name}' alone, with --shift FILE"
        )
    if not colon:
        return Probe(kind.name, kind.defaults)
    if not raw.strip():  # a list cut short, not a request for the defaults
        raise UsageError(
            f"probe '{kind.name}:' has no levels after ':'; give them ({_example(kind)}), or '{kind.name}' "
            "alone for the defaults"
        )
    levels = []
    for item in raw.split(","):
        try:
            value = float(item)
        except ValueError:
            raise UsageError(
                f"probe '{kind.name}': level {item.strip()!r} is not a number ({_example(kind)})"
            ) from None
        lowest = "≥ 0" if kind.allow_zero else "> 0"
        if not math.isfinite(value) or value < 0 or (value == 0 and not kind.allow_zero):
            raise UsageError(f"probe '{kind.name}': level {item.strip()} must be finite and {lowest}")
        if kind.integer and not value.is_integer():
            raise UsageError(f"probe '{kind.name}': level {item.strip()} must be a whole number")
        if kind.integer and value < 1:
            raise UsageError(f"probe '{kind.name}': level {item.strip()} must be >= 1")
        levels.append(value)
    return Probe(kind.name, tuple(sorted(set(levels))))


def _example(kind: ProbeKind) -> str:
    return f"e.g. {kind.name}:{','.join(f'{v:g}' for v in kind.defaults[:3])}"


def default_probes() -> list[Probe]:
    """Every probe that needs nothing more than the model (``shift`` needs a shifted corpus)."""
    return [Probe(k.name, k.defaults) for k in PROBES.values() if k.acts_on is not ActsOn.INPUT_CORPUS]


def scorer_insensitivity(kind: ProbeKind, scorers: list) -> str | None:
    """Why every scorer in ``scorers`` (one per attention layer) cannot respond to ``kind`` by
    construction, or None. Such a probe reads "n/a", never "no collapse"."""
    if not scorers or kind.acts_on is not ActsOn.LOGITS:
        return None
    if all(getattr(s, "uses_qk", False) for s in scorers):
        names = sorted({s.name for s in scorers})
        return f"{'/'.join(names)} scores q and k directly and ignores the attention logits"
    # Not SSA under logit-scale: (1+b·α|x|)^(±n) tends, as α grows, to weights ∝ x^n over the
    # positive logits with the negative ones' mass going to 0, so SSA's weights move (and may
    # concentrate) until b·α·|x| >> 1 and then settle: a bounded response, measured, not an n/a.
    return None
