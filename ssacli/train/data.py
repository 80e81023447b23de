"""Training data for fine-tuning (``--data``) and the objective each model kind is trained with.

``--data`` is one of:

* a UTF-8 text file, or a folder: every ``*.txt`` and ``*.jsonl`` below it, in sorted path order;
* a ``.jsonl`` file: one JSON object per line with a string field ``text`` (blank lines skipped);
* ``icl:TASK`` or ``icl:TASK:points=N`` (``every``, ``some``, ``linear``): prompts drawn fresh at every
  step, for ssacli's ICL models only. TASK must be the model's own task: the read-out, the loss
  (sign vs. regression) and what ``ssacli icl eval`` measures all follow the model's task, so
  training one on another would leave a checkpoint that says one task and does another.

Text is held out by characters: documents are joined with a blank line, and the last 10 % of the
characters (from the first whitespace at or after the 90 % mark, so no word is cut) are the
in-distribution evaluation slice, ``TextData.heldout_text``. Splitting by characters rather than by
documents works for a single file as well as for a corpus of many. Both parts are tokenized once;
training batches are random windows of ``seq_len`` tokens of the training part, drawn from a seeded
generator, and evaluation uses fixed, non-overlapping windows of the held-out part.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from ..defaults import ICL_POINTS
from ..errors import InputError, UsageError
from ..models.icl_task import task_loss
from ..models.kinds import ModelKind
from . import (  # noqa: F401 (check_data: here too)
    check_data,
    check_data_path,
    icl_data_parts,
    icl_for_text,
    text_for_icl,
)

HELDOUT_FRACTION = 0.1
MASK_PROB = 0.15  # BERT's masking: 15 % of tokens, of which 80 % [MASK], 10 % random, 10 % kept
EVAL_WINDOWS = 8  # held-out windows (text) per evaluation
EVAL_PROMPTS = 256  # held-out prompts (ICL) per evaluation
EVAL_SEED = 20_260_000  # fixed, so held-out losses compare across runs and seeds
_TOKENIZE_PIECE = 1 << 20  # characters per tokenizer call, so huge files do not need one giant call


# ---- reading text ------------------------------------------------------------------------------------


def read_documents(path: str | Path) -> list[str]:
    """The documents under ``path``: one per .txt file, one per .jsonl line."""
    path = check_data_path(path)
    files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
    if path.is_file():
        files = [path]
    elif not files:
        raise InputError(f"--data {path} holds no .txt or .jsonl files")
    documents = []
    for file in files:
        text = _read_utf8(file)
        documents += _jsonl_texts(file, text) if file.suffix == ".jsonl" else [text]
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise InputError(f"--data {path} holds no text (only empty or whitespace documents)")
    return documents


def _read_utf8(file: Path) -> str:
    try:
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{file} is not UTF-8 (byte {err.start}); re-encode it as UTF-8") from None
    except OSError as err:
        raise InputError(f"cannot read {file}: {err.strerror}") from None


def _jsonl_texts(file: Path, text: str) -> list[str]:
    texts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise InputError(f"{file}:{number}: not valid JSON ({err.msg}); one object per line") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f'{file}:{number}: expected an object with a string field "text"')
        texts.append(record["text"])
    return texts


def split_heldout(text: str, fraction: float = HELDOUT_FRACTION) -> tuple[str, str]:
    """(training part, held-out part): the held-out part is the last ``fraction`` of the characters,
    starting at the first whitespace at or after the cut so that no word is split."""
    cut = int(len(text) * (1 - fraction))
    boundary = re.compile(r"\s").search(text, cut)
    cut = boundary.start() if boundary else cut
    return text[:cut], text[cut:]


def heldout_text(path: str | Path) -> str:
    """The held-out slice of a text ``--data`` (what fine-tuning evaluates on), without tokenizing."""
    return split_heldout("\n\n".join(read_documents(path)))[1]


def _tokenize(tokenizer: Any, text: str) -> torch.Tensor:
    """Token ids of ``text``, no special tokens, in pieces cut after a newline (int32 to halve memory)."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + _TOKENIZE_PIECE)
        if end < len(text):
            newline = text.rfind("\n", start, end)
            end = newline + 1 if newline > start else end
        pieces.append(text[start:end])
        start = end
    if not pieces:
        return torch.zeros(0, dtype=torch.int32)
    ids = tokenizer(pieces, add_special_tokens=False, verbose=False)["input_ids"]
    return torch.tensor([i for piece in ids for i in piece], dtype=torch.int32)


# ---- data sources ------------------------------------------------------------------------------------


@dataclass
class TextData:
    """A tokenized corpus: the training stream and the held-out slice (text and tokens)."""

    source: str
    train_stream: torch.Tensor  # int32 [tokens]
    heldout_stream: torch.Tensor  # int32 [tokens]
    heldout_text: str
    documents: int

    @classmethod
    def load(cls, path: str | Path, tokenizer: Any) -> TextData:
        documents = read_documents(path)
        train_text, held_text = split_heldout("\n\n".join(documents))
        train, held = _tokenize(tokenizer, train_text), _tokenize(tokenizer, held_text)
        return cls(str(path), train, held, held_text, len(documents))

    def check(self, seq_len: int) -> None:
        if len(self.train_stream) < seq_len:
            raise InputError(
                f"--data {self.source} has {len(self.train_stream)} training tokens, fewer than "
                f"--seq-len {seq_len}; give more text or a smaller --seq-len"
            )

    def windows(self, count: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` random windows [count, seq_len] of the training stream."""
        starts = torch.randint(0, len(self.train_stream) - seq_len + 1, (count,), generator=generator)
        return self.train_stream[starts[:, None] + torch.arange(seq_len)].long()

    def heldout_windows(self, seq_len: int, limit: int = EVAL_WINDOWS) -> torch.Tensor | None:
        """Fixed, non-overlapping windows of the held-out slice; None when it is under 2 tokens."""
        stream = self.heldout_stream
        seq_len = min(seq_len, len(stream))
        if seq_len < 2:
            return None
        count = min(limit, len(stream) // seq_len)
        return stream[: count * seq_len].reshape(count, seq_len).long()


@dataclass
class ICLData:
    """Prompts of an ICL task, drawn fresh at every step, all of ``points`` points."""

    task: str
    points: int = ICL_POINTS


def parse_icl(spec: str, model_task: str, max_points: int) -> ICLData:
    task, points = icl_data_parts(spec, max_points)
    if task != model_task:
        raise UsageError(
            f"--data {spec} does not match the model's task '{model_task}'; fine-tune on icl:{model_task}, "
            f"or train an {task} model with `ssacli icl train --task {task}`"
        )
    return ICLData(task, points)


# ---- objectives ----------------------------------------------------------------------------------------

OBJECTIVES = ("causal", "masked", "icl")  # named after the model kinds they train


class Objective:
    """Draws a training batch and computes its loss; one per model kind."""

    def __init__(self, name: str, loaded: Any, data: TextData | ICLData, seq_len: int) -> None:
        self.name, self.data, self.seq_len = name, data, seq_len
        self.tokenizer = loaded.tokenizer
        self.vocab_size = getattr(loaded.config, "vocab_size", None)
        self.special = sorted(set(getattr(loaded.tokenizer, "all_special_ids", None) or []))

    def tokens_per_sample(self) -> int:
        return 2 * self.data.points if isinstance(self.data, ICLData) else self.seq_len

    def sample(self, count: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        if isinstance(self.data, ICLData):
            from ..models.icl_task import sample_batch

            batch = sample_batch(self.data.task, count, self.data.points, generator=generator)
            return {"tokens": batch.tokens, "ys": batch.ys}
        ids = self.data.windows(count, self.seq_len, generator)
        return self._masked(ids, generator) if self.name == ModelKind.MASKED else {"input_ids": ids}

    def _masked(self, ids: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        inputs, labels = mask_tokens(
            ids, self.tokenizer.mask_token_id, self.vocab_size, generator, self.special
        )
        return {"input_ids": inputs, "labels": labels}

    def heldout(self) -> list[dict[str, torch.Tensor]]:
        """The fixed evaluation batches (seeded with EVAL_SEED, independent of the run's seed)."""
        generator = torch.Generator().manual_seed(EVAL_SEED)
        if isinstance(self.data, ICLData):
            return [self.sample(EVAL_PROMPTS, generator)]
        ids = self.data.heldout_windows(self.seq_len)
        if ids is None:
            return []
        return [self._masked(ids, generator) if self.name == ModelKind.MASKED else {"input_ids": ids}]

    def loss(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device
    ) -> torch.Tensor:
        """The batch's loss, computed on ``device`` (under bf16 autocast on CUDA; the loss in fp32)."""
        batch = {k: v.to(device) for k, v in batch.items()}
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
        with autocast:
            if self.name == ModelKind.ICL:
                return task_loss(self.data.task, model(batch["tokens"]).float(), batch["ys"])
            kwargs = {"use_cache": False} if self.name == ModelKind.CAUSAL else {}
            logits = model(input_ids=batch["input_ids"], **kwargs).logits.float()
        if self.name == ModelKind.CAUSAL:
            return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["input_ids"][:, 1:].flatten())
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    @torch.no_grad()
    def heldout_loss(self, model: torch.nn.Module, device: torch.device) -> float | None:
        """Mean loss on the fixed held-out batches, in eval mode (None without a held-out slice)."""
        batches = self.heldout()
        if not batches:
            return None
        was_training = model.training
        model.eval()
        try:
            with seeded_rng(device, EVAL_SEED):  # masked LMs' random tokens, and dropout if any
                losses = [float(self.loss(model, batch, device)) for batch in batches]
        finally:
            model.train(was_training)
        return sum(losses) / len(losses)


def mask_tokens(
    ids: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator,
    special: list[int] | tuple[int, ...] = (),
    prob: float = MASK_PROB,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: each non-special token is selected with ``prob``; a selected token becomes
    ``mask_id`` (80 %), a random token (10 %) or stays (10 %). Labels are -100 where not selected.
    At least one token per batch is selected, so the loss is never an empty mean (NaN)."""
    selectable = ~torch.isin(ids, torch.tensor(list(special), dtype=ids.dtype))
    selected = (torch.rand(ids.shape, generator=generator) < prob) & selectable
    action = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(0, vocab_size, ids.shape, generator=generator)
    if not selected.any() and selectable.any():
        selected.view(-1)[selectable.view(-1).nonzero()[0]] = True
    inputs = torch.where(selected & (action < 0.8), mask_id, ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, torch.where(selected, ids, -100)


def make_objective(loaded: Any, data_spec: str, objective: str, seq_len: int) -> Objective:
    """The objective for ``loaded`` (by its kind) and its data; UsageError for what cannot be trained."""
    name = loaded.kind
    if name not in OBJECTIVES:
        raise UsageError(
            f"fine-tuning trains causal LMs, masked LMs and ICL models; '{loaded.name}' is a "
            f"{loaded.kind} model ({loaded.family}) with no training objective in ssacli"
        )
    if objective not in ("auto", name):
        raise UsageError(f"objective '{objective}' does not fit a {loaded.kind} model; use auto ({name})")
    if name == ModelKind.ICL:
        if not data_spec.startswith("icl:"):
            raise text_for_icl(loaded.model.spec.task)
        spec = loaded.model.spec
        return Objective(name, loaded, parse_icl(data_spec, spec.task, spec.max_points), seq_len)
    if data_spec.startswith("icl:"):
        raise icl_for_text(data_spec, loaded.kind)
    if loaded.tokenizer is None:
        raise UsageError(f"'{loaded.name}' has no tokenizer to read --data with; save one into its folder")
    if name == ModelKind.MASKED and getattr(loaded.tokenizer, "mask_token_id", None) is None:
        raise UsageError(
            f"the tokenizer of '{loaded.name}' has no mask token, which masked-LM training needs"
        )
    if loaded.max_positions and seq_len > loaded.max_positions:
        raise UsageError(f"--seq-len {seq_len} is longer than the model's {loaded.max_positions} positions")
    data = TextData.load(data_spec, loaded.tokenizer)
    data.check(seq_len)
    return Objective(name, loaded, data, seq_len)


# ---- randomness of a training step ---------------------------------------------------------------------


def step_seeds(seed: int, rank: int, step: int) -> tuple[int, int]:
    """(data seed, torch seed) of one step of one rank: a function of the step, so a resumed run
    draws what the uninterrupted run drew, with no generator state to save; well mixed, so no two
    (seed, rank, step) share a stream."""
    state = np.random.SeedSequence([seed, rank, step]).generate_state(2, np.uint64)
    return int(state[0] >> np.uint64(1)), int(state[1] >> np.uint64(1))


@contextmanager
def seeded_rng(device: torch.device, seed: int) -> Iterator[None]:
    """Seed the global RNGs (dropout) for one step without changing the caller's RNG state."""
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.random.default_generator.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(seed)
        yield
