"""Probe inputs: the token sequences, ICL prompts and targets every probe runs on (what each probe is
and its levels: :mod:`ssacli.diagnosis.probe_kinds`, re-exported here).

Inputs are seeded: the same seed gives the same token ids, target positions and numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..errors import UsageError
from ..models.icl_task import TOKENS_PER_POINT, check_task, x_positions
from .probe_kinds import (  # noqa: F401 (re-exported: what a probe is, beside its inputs)
    PROBES,
    ActsOn,
    Probe,
    ProbeKind,
    Shift,
    default_probes,
    parse_probe,
)
from .texts import NUMERIC_TEMPLATES, TEXTS, numeric_number


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


def special_prefix(tokenizer) -> list[int]:
    """The ids the tokenizer puts before any text by default (Gemma's and Llama's ``<bos>``; none for
    GPT-2-style tokenizers): every window cut from a tokenized stream starts with them, as the model
    saw its inputs in training. Without it Gemma 3 270M's loss on the built-in texts was 5.9-7.1
    nats per token instead of 2.5-3.4 (docs/diagnose.md, worked example), so the probes measured a
    model shifted by its own missing ``<bos>``."""
    if tokenizer is None:
        return []
    marked = tokenizer("a")["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    for start in range(len(marked) - len(plain) + 1):
        if plain and marked[start : start + len(plain)] == plain:
            return list(marked[:start])
    return []


class TokenSource:
    """Fixed-length token sequences from a text (built-in or the user's) or random ids; each text
    window starts with the tokenizer's :func:`special_prefix`."""

    def __init__(self, tokenizer, *, text: str | None, random_ids: bool, vocab_size: int, seed: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.stream: list[int] | None = None
        self.prefix: list[int] = []
        if tokenizer is not None and not random_ids:
            self.prefix = special_prefix(tokenizer)
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
        stream, out, prefix = self.stream, [], self.prefix[: max(0, length - 1)]
        offset = random.Random(self.seed).randrange(len(stream))
        for _ in range(samples):
            window = [stream[(offset + i) % len(stream)] for i in range(length - len(prefix))]
            offset = (offset + length - len(prefix)) % len(stream)
            out.append(prefix + window)
        return out


def numeric_sequences(tokenizer, digits: int, samples: int, seed: int) -> list[list[int]]:
    """The templates with ``digits``-digit numbers; the same seed picks the same templates."""
    rng = random.Random(seed * 1000 + digits)
    out, prefix = [], special_prefix(tokenizer)
    for i in range(samples):
        template = NUMERIC_TEMPLATES[(seed + i) % len(NUMERIC_TEMPLATES)]
        text = template.replace("{n}", numeric_number(digits, rng))
        out.append(prefix + tokenizer(text, add_special_tokens=False)["input_ids"])
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
