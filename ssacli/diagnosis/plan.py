"""What one :func:`ssacli.diagnose` run will do, decided before any forward: the attention layers and
their heads, the base length (capped at the model's positions), where the tokens come from, and per
probe level the batches it runs on or why it cannot run.

:func:`plan_run` builds the :class:`RunPlan`; :mod:`ssacli.diagnosis.run` executes it level by level
and aggregates what the forwards measured into a :class:`~ssacli.diagnosis.result.DiagnoseResult`.
Nothing here runs the model. The inputs themselves (:class:`ProbeBatch`: token sequences, ICL prompts
and targets, the end of this file) are seeded: the same seed gives the same token ids, target
positions and numbers. What each probe is and its levels: :mod:`ssacli.diagnosis.probe_kinds`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..attention.interface import scorers_of
from ..errors import UsageError
from ..models.icl_task import TOKENS_PER_POINT, check_task, x_positions
from ..models.kinds import ModelKind, text_of_no_use
from ..models.loading import LoadedModel
from .generation import check_generate
from .probe_kinds import PROBES, ActsOn, Probe
from .routes import Route, attention_layers, layer_heads
from .settings import DiagnoseSettings
from .shift import ShiftCorpus
from .texts import NUMERIC_TEMPLATES, TEXTS, numeric_number, special_prefix


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


# level -> (batches, note): the inputs a probe level runs on (None: it cannot run, the note says why)
LevelPlan = dict[float, tuple[list[ProbeBatch] | None, str | None]]


@dataclass
class RunPlan:
    """Everything the loop over probe levels needs, fixed before the first forward."""

    layers: list[tuple[str, nn.Module]]  # the attention modules, in forward order, with their names
    layer_of: dict[int, int]  # id(module) -> layer index
    heads: list[int]  # heads per layer
    icl: bool
    length: int  # the base length (ICL: points), capped at the model's positions
    length_asked: int | None  # the length asked for when the cap shortened it, else None
    source: TokenSource | None  # where text probes' tokens come from (None: ICL prompts or given inputs)
    shift: ShiftCorpus | None  # the shift probe's documents (None: no --shift)
    prompt_length: int | None  # generate's prompt length (None: no generation)
    probes: list[tuple[Probe, LevelPlan]]
    scorers: list  # the scorers of ssacli's route (which probes they make insensitive)

    @property
    def total_batches(self) -> int:
        """The forwards the probes will run (what progress counts to)."""
        return sum(len(batches) for _, levels in self.probes for batches, _ in levels.values() if batches)


def plan_run(
    loaded: LoadedModel, probes: list[Probe], route: Route, settings: DiagnoseSettings, steps: int | None
) -> RunPlan:
    """The plan of a run over ``probes``; ``steps``: tokens to generate afterwards (None: none)."""
    root = loaded.attention_root
    layers = attention_layers(root, route)
    icl = loaded.kind == ModelKind.ICL
    if icl and settings.text is not None:  # it would be silently unused
        raise text_of_no_use(loaded.name)
    length = settings.base_length(icl)
    cap = position_cap(loaded)
    asked = None
    if cap and length > cap:  # said in one line of every report (settings.length_asked), not a title
        asked, length = length, cap
    source = None
    if not icl and settings.inputs is None:
        vocab = getattr(root.config, "vocab_size", None) or 2
        source = TokenSource(
            loaded.tokenizer,
            text=settings.text,
            random_ids=settings.random_ids,
            vocab_size=vocab,
            seed=settings.seed,
        )
    prompt_length = None if steps is None else check_generate(loaded, route, steps, length)
    fitted = [_fit_length_levels(p, loaded, length, settings) for p in probes]
    probes, dropped = [p for p, _ in fitted], {p.name: why for p, why in fitted}
    shift = None
    if settings.shift is not None:  # the documents of both corpora, or a UsageError before any forward
        if icl or loaded.tokenizer is None:
            raise UsageError(f"--shift needs a language model with a tokenizer; '{loaded.name}' has none")
        shift = ShiftCorpus(
            loaded.tokenizer, settings.text, settings.shift, settings.shift_name, length, settings.samples
        )
    return RunPlan(
        layers=layers,
        layer_of={id(m): i for i, (_, m) in enumerate(layers)},
        heads=[layer_heads(m, root, route) for _, m in layers],
        icl=icl,
        length=length,
        length_asked=asked,
        source=source,
        shift=shift,
        prompt_length=prompt_length,
        probes=[
            (p, _plan_levels(p, loaded, route, _source(p, source, shift), length, settings, dropped[p.name]))
            for p in probes
        ],
        scorers=list(scorers_of(root).values()) if route is Route.SSACLI else [],
    )


def _source(probe: Probe, source: TokenSource | None, shift: ShiftCorpus | None):
    """Where a probe's tokens come from: the shift probe's corpora, every other's text source."""
    return shift if probe.kind.acts_on is ActsOn.INPUT_CORPUS else source


def _fit_length_levels(
    probe: Probe, loaded: LoadedModel, length: int, settings: DiagnoseSettings
) -> tuple[Probe, str | None]:
    """The length probe's default levels double the base length up to the model's maximum
    positions (ICL: points) and up to what this machine's memory holds (:func:`level_memory`): keep
    those that fit, and the largest that fits as the last level. Levels asked for run as asked: one
    beyond the maximum, or beyond the memory, is refused (UsageError) before any forward, since its
    inputs would be capped (its verdict naming a length that never ran) or its forward would fail
    after every earlier level had run."""
    kind = probe.kind
    cap = position_cap(loaded)
    if kind.acts_on is not ActsOn.INPUT_LENGTH:
        return probe, None
    memory = level_memory(loaded, length, settings)
    if probe.levels != PROBES[probe.name].defaults:  # asked for: each level runs as asked, or is refused
        beyond = [m for m in probe.levels if cap and length * m > cap]
        if beyond:
            unit = "points" if loaded.kind == ModelKind.ICL else "tokens"
            raise UsageError(
                f"probe 'length': level ×{beyond[0]:g} asks for {int(length * beyond[0]):,} {unit} "
                f"(×{beyond[0]:g} the base length {length}), but '{loaded.name}' takes at most {cap:,}; give "
                f"levels up to ×{cap // length}"
            )
        too_big = [m for m in probe.levels if memory and memory(m)[0] > memory(m)[1]]
        if too_big:
            need, free = memory(too_big[0])
            fits = too_big[0] / 2
            while fits > 1 and memory(fits)[0] > free:
                fits /= 2
            raise UsageError(
                f"probe 'length': level ×{too_big[0]:g} ({int(length * too_big[0]):,} tokens) needs about "
                f"{need / 2**30:.1f} GiB for its logits and loss, and {free / 2**30:.1f} GiB of memory is "
                f"free; give levels up to ×{max(fits, 1):g} (e.g. --probe length:1,{max(fits, 1):g})"
            )
        return probe, None
    top = cap // length if cap else max(probe.levels)
    levels = [m for m in probe.levels if m <= top]
    if top > (levels[-1] if levels else 0) and top >= 1:
        levels.append(float(top))
    note = None
    if memory:  # the default levels stop where the memory does, and the probe's note says so
        kept = [m for m in levels if m == 1 or memory(m)[0] <= memory(m)[1]]
        if len(kept) < len(levels):
            first = levels[len(kept)]
            need, free = memory(first)
            note = (
                f"default levels from ×{first:g} not run: ×{first:g} ({int(length * first):,} tokens) "
                f"needs about {need / 2**30:.1f} GiB for its logits, {free / 2**30:.1f} GiB free"
            )
        levels = kept
    return Probe(probe.name, tuple(levels or (1.0,))), note


# A length level's peak above the model's weights, in copies of one forward's float32 logits: the
# logits, their log-softmax and the loss's gathered terms. Measured on Gemma 3 270M (vocabulary
# 262,144): 4.78 GiB peak at 1,024 tokens with 1.0 GiB of weights and 1.0 GiB of logits
# (docs/performance.md, "Real checkpoints"); 3 copies leaves room above the measured 2.8.
LOGIT_COPIES = 3


def level_memory(loaded: LoadedModel, length: int, settings: DiagnoseSettings):
    """For a causal LM, a function level -> (bytes a length level's forward needs for its logits,
    bytes free on the model's device now); None where that cannot be known (no vocabulary, ICL
    models, an unknown amount of free memory). The logits of one forward are rows × tokens ×
    vocabulary float32 numbers, the batch's rows fewer as the level is longer (about the same tokens
    per level, :func:`_plan_levels`)."""
    vocab = getattr(loaded.attention_root.config, "vocab_size", None)
    free = free_memory(loaded.device)
    if loaded.kind != ModelKind.CAUSAL or not vocab or not free:
        return None

    def need(level: float) -> tuple[int, int]:
        size = int(length * level)
        rows = min(settings.batch_size, max(1, math.ceil(settings.samples * length / max(size, 1))))
        return LOGIT_COPIES * rows * size * vocab * 4, free

    return need


def free_memory(device) -> int | None:
    """Bytes free on ``device`` now: the GPU's free memory, or the host's MemAvailable (Linux);
    None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _plan_levels(
    probe: Probe, loaded: LoadedModel, route: Route, source, length: int, settings: DiagnoseSettings,
    dropped: str | None = None,
) -> LevelPlan:  # fmt: skip
    """level -> (batches or None, note): the inputs each level runs on, or why it cannot run
    (``dropped``: the default levels left out, said beside the probe)."""
    kind = probe.kind
    skip = None
    if kind.needs_route and route is not Route.SSACLI:
        skip = f"needs ssacli's attention function; family '{loaded.family}' runs on the eager fallback"
    elif kind.needs_tokenizer and loaded.tokenizer is None:
        skip = (
            "needs a tokenizer (the model folder has none)"
            if loaded.kind != ModelKind.ICL
            else "not for ICL models"
        )
    elif kind.acts_on is ActsOn.INPUT_LENGTH and settings.inputs is not None:
        skip = "not run on explicit inputs (their lengths are given)"
    if skip:
        return {level: (None, skip) for level in probe.levels}
    cap = position_cap(loaded)
    unit = "points" if loaded.kind == ModelKind.ICL else "positions"
    plan, note = {}, dropped
    for level in probe.levels:
        size = int(length * level) if kind.acts_on is ActsOn.INPUT_LENGTH else length
        if cap and size > cap:
            size, note = cap, f"inputs capped at the model's {cap} {unit}"
        level_settings = settings
        if kind.acts_on is ActsOn.INPUT_LENGTH and size > length:  # about the same tokens per level
            level_settings = replace(settings, samples=max(1, math.ceil(settings.samples * length / size)))
        batches = _inputs(probe, level, loaded, source, size, level_settings)
        if cap and any(b.input_ids is not None and b.input_ids.shape[1] > cap for b in batches):
            batches = [_truncate(b, cap) for b in batches]
            note = f"inputs truncated to the model's {cap} {unit}"
        if kind.has_target:
            pick_targets(batches, settings.seed)
        if kind.acts_on is ActsOn.INPUT_CORPUS:
            note = source.note  # fewer documents than samples, where a corpus is short
        plan[level] = (batches, note)
    return plan


def position_cap(loaded: LoadedModel) -> int | None:
    """The longest input the model's position table covers (ICL: in points); None: no limit known."""
    cap = loaded.max_positions
    if cap and loaded.kind == ModelKind.ICL:
        cap //= TOKENS_PER_POINT
    return cap


def _truncate(batch: ProbeBatch, cap: int) -> ProbeBatch:
    """Keep the first ``cap`` tokens (batches are right-padded, so real tokens come first)."""
    return ProbeBatch(input_ids=batch.input_ids[:, :cap], attention_mask=batch.attention_mask[:, :cap])


def _inputs(
    probe: Probe, level: float, loaded: LoadedModel, source, size: int, settings: DiagnoseSettings
) -> list[ProbeBatch]:
    samples, batch_size, seed = settings.samples, settings.batch_size, settings.seed
    if loaded.kind == ModelKind.ICL:
        return icl_batches(loaded.model.spec.task, samples, size, batch_size, seed)
    pad = loaded.pad_id
    side = "right"  # one forward, no generation: real tokens keep positions 0..n-1 and key 0 (the sink)
    if probe.kind.acts_on is ActsOn.INPUT_CORPUS:  # source: the ShiftCorpus
        return pad_sequences(source.sequences(level), pad, batch_size, side)
    if probe.kind.acts_on is ActsOn.INPUT_TEXT:
        return pad_sequences(
            numeric_sequences(loaded.tokenizer, int(level), samples, seed), pad, batch_size, side
        )
    if settings.inputs is not None:
        return pad_sequences([list(s) for s in settings.inputs], pad, batch_size, side)
    return pad_sequences(source.sequences(samples, size), pad, batch_size, side)


def describe_inputs(loaded: LoadedModel, source, settings: DiagnoseSettings) -> str:
    """What the probes ran on, as the result's settings record it."""
    if loaded.kind == ModelKind.ICL:
        return f"icl:{loaded.model.spec.task} prompts (seed {settings.seed})"
    if settings.inputs is not None:
        return f"{len(settings.inputs)} given sequences"
    return source.description


# ---- the inputs: token sequences, ICL prompts and targets, seeded ---------------------------------


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
    """Fixed-length token sequences from a text (built-in or the user's) or random ids; each text
    window starts with the tokenizer's :func:`~ssacli.diagnosis.texts.special_prefix`."""

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
