"""Magnitude-shift probes: what each one changes, its levels, and the inputs it runs on.

A probe is a name and ascending levels (``embed-scale:1,4,16``); higher levels are harsher. Each
kind declares where it acts (:class:`ActsOn`) and, for embeddings, keys and logits, its ``effect``
(:class:`Shift`); the
forward pass (:mod:`ssacli.diagnosis.forward`) and the input plan (:mod:`ssacli.diagnosis.run`)
dispatch on those, never on a probe's name.

* ``embed-scale`` σ: the input-embedding module's output times σ (ICL models: the x values).
* ``outlier`` σ: one token's embedding times σ (ICL: one x value); its captured mass is measured.
* ``key-scale`` σ: one token's key vectors times σ in every layer and head, as the attention function
  receives them (after projection, norm and rotary): the magnitude outlier as attention sees it.
* ``logit-scale`` α: every attention logit times α, inside the attention function (Theorem 1).
* ``dominant-key`` M: M added to one key's logit for every query (Theorem 2); M = 0 is no change.
* ``length`` ×m: inputs m times the base length, capped by the model's maximum positions.
* ``numeric`` d: sentence templates holding d-digit numbers (models with a tokenizer).

Inputs are seeded: the same seed gives the same token ids, target positions and numbers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum

import torch

from ..errors import UsageError
from ..models.icl_task import TOKENS_PER_POINT, check_task, x_positions
from .texts import NUMERIC_TEMPLATES, TEXTS, numeric_number


class ActsOn(Enum):
    """Where a probe acts."""

    INPUT_LENGTH = "input length"  # the inputs are level × the base length
    INPUT_TEXT = "input text"  # the inputs are the numeric templates with level-digit numbers
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


def parse_probe(text: str) -> Probe:
    """``NAME`` (default levels) or ``NAME:L1,L2,…``; levels are sorted and de-duplicated."""
    name, _, raw = text.strip().partition(":")
    kind = PROBES.get(name.strip())
    if kind is None:
        raise UsageError(f"unknown probe '{name}'; choose from: {', '.join(PROBES)}")
    if not raw.strip():
        return Probe(kind.name, kind.defaults)
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
    return [Probe(k.name, k.defaults) for k in PROBES.values()]


# ---- inputs ---------------------------------------------------------------------------------------


@dataclass
class ProbeBatch:
    """One forward's worth of probe input. Exactly one of ``input_ids`` / ``xs`` is set.
    (Not :class:`ssacli.models.icl_task.Batch`, the ICL training batch: a probe rescales ``xs`` before
    the labels are drawn, :func:`ssacli.models.icl_task.labels`.)"""

    input_ids: torch.Tensor | None = None  # [b, t] token ids (transformers models)
    attention_mask: torch.Tensor | None = None  # [b, t] 1 = real token
    xs: torch.Tensor | None = None  # [b, points] ICL x values (before any probe)
    coef: torch.Tensor | None = None  # [b, 2] ICL linear task a, b
    task: str | None = None  # the ICL task the labels follow
    target: torch.Tensor | None = None  # [b] token index of the probe's target

    @property
    def size(self) -> int:
        return (self.input_ids if self.input_ids is not None else self.xs).shape[0]

    @property
    def valid(self) -> torch.Tensor:
        """[b, t] bool: real (non-padding) tokens."""
        if self.attention_mask is not None:
            return self.attention_mask.bool()
        if self.input_ids is not None:
            return torch.ones_like(self.input_ids, dtype=torch.bool)
        return torch.ones(self.xs.shape[0], TOKENS_PER_POINT * self.xs.shape[1], dtype=torch.bool)


def pad_sequences(
    sequences: list[list[int]], pad_id: int, batch_size: int, side: str = "right"
) -> list[ProbeBatch]:
    """Token-id lists -> padded batches with attention masks (padding queries are not counted)."""
    batches = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, seq in enumerate(chunk):
            cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
            ids[row, cols] = torch.tensor(seq, dtype=torch.long)
            mask[row, cols] = 1
        batches.append(ProbeBatch(input_ids=ids, attention_mask=mask))
    return batches


def pick_targets(batches: list[ProbeBatch], seed: int) -> None:
    """One target token per sample, uniform over the first half of its real tokens (never token 0,
    so most queries of a causal model can see it and it is not the sink)."""
    generator = torch.Generator().manual_seed(seed + 7919)
    for batch in batches:
        valid = batch.valid
        targets = []
        for row in range(valid.shape[0]):
            positions = valid[row].nonzero().flatten()
            if batch.xs is not None:  # ICL: only x tokens carry an input value
                positions = positions[x_positions(len(positions))]
            half = max(2, (len(positions) + 1) // 2)
            choices = positions[1:half] if len(positions) > 1 else positions
            targets.append(choices[torch.randint(len(choices), (1,), generator=generator)].item())
        batch.target = torch.tensor(targets, dtype=torch.long)


RANDOM_INPUTS = "random token ids"  # how a result's settings name them (no text: no loss baseline)


class TokenSource:
    """Fixed-length token sequences from a text (built-in or the user's) or random ids."""

    def __init__(self, tokenizer, *, text: str | None, random_ids: bool, vocab_size: int, seed: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.stream: list[int] | None = None
        if tokenizer is not None and not random_ids:
            source = text if text is not None else "\n\n".join(TEXTS)
            self.stream = tokenizer(source, add_special_tokens=False, verbose=False)["input_ids"]
            if len(self.stream) < 2:
                raise UsageError("the probe text is shorter than two tokens; give a longer --text file")
        self.description = (
            RANDOM_INPUTS
            if self.stream is None
            else ("--text file" if text is not None else "built-in texts")
        )

    def sequences(self, samples: int, length: int) -> list[list[int]]:
        if self.stream is None:
            generator = torch.Generator().manual_seed(self.seed)
            low = min(3, self.vocab_size - 1)  # skip the usual pad/bos/eos ids
            return torch.randint(low, self.vocab_size, (samples, length), generator=generator).tolist()
        # Consecutive windows through the text, wrapping around when it runs out.
        stream, out = self.stream, []
        offset = random.Random(self.seed).randrange(len(stream))
        for _ in range(samples):
            window = [stream[(offset + i) % len(stream)] for i in range(length)]
            offset = (offset + length) % len(stream)
            out.append(window)
        return out


def numeric_sequences(tokenizer, digits: int, samples: int, seed: int) -> list[list[int]]:
    """The templates with ``digits``-digit numbers; the same seed picks the same templates."""
    rng = random.Random(seed * 1000 + digits)
    out = []
    for i in range(samples):
        template = NUMERIC_TEMPLATES[(seed + i) % len(NUMERIC_TEMPLATES)]
        text = template.replace("{n}", numeric_number(digits, rng))
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def icl_batches(task: str, samples: int, points: int, batch_size: int, seed: int) -> list[ProbeBatch]:
    """Prompts of ``task`` at σ = 1 (probes rescale the x values later; the labels are drawn then).
    The coefficients a, b are drawn for every task, so one seed gives the same x values whatever the
    task (paired across tasks); only ``linear`` reads them."""
    check_task(task)
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for start in range(0, samples, batch_size):
        n = min(batch_size, samples - start)
        xs = torch.randn(n, points, generator=generator)
        coef = torch.randn(n, 2, generator=generator)
        batches.append(ProbeBatch(xs=xs, coef=coef, task=task))
    return batches
