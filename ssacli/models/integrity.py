"""Whether a loaded model is the checkpoint, whole, before any command works on it
(:func:`require_whole`, called where every model loads: :mod:`ssacli.models.loading`, and for ICL
checkpoints :func:`ssacli.models.icl.load_icl`).

* Every tensor the architecture builds came from the checkpoint: transformers initializes a missing
  one at random and only logs it, so measurements, conversions and fine-tunes would be of a partly
  random model. A checkpoint tensor for a part the model has but the config does not build (a layer
  beyond ``num_hidden_layers``, a bias the module lacks) means config and weights disagree. Tensors
  of whole parts the class does not build (a pretraining head, a pooler) are left: the model is whole.
* The tokenizer's ids fit the input embedding: an id past its rows fails inside the first forward.
* No weight is NaN or ±inf: every forward would be non-finite, so every probe would read "overflow
  at the first level" and name an attention layer, and every conversion or fine-tune would fail as
  if its own settings were wrong.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..errors import BrokenModelError
from .loaded import LoadedModel

SHOWN = 3  # tensors named in the message; the rest are counted
# how transformers' loading report gives a mismatched tensor's shapes
_SHAPES = re.compile(r"ckpt:\s*torch\.Size\((\[.*?\])\)\s*vs model:\s*torch\.Size\((\[.*?\])\)")
# the files a tokenizer loads from, the one named first when it does not fit
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model")


def require_whole(loaded: LoadedModel, report: dict[str, Any] | None = None) -> None:
    """Raise BrokenModelError, naming the tensors or the file, unless ``loaded`` is its checkpoint whole:
    ``report`` is transformers' loading report (``from_pretrained(..., output_loading_info=True)``;
    None for a model built in memory)."""
    if report is not None:
        require_complete(loaded.model, loaded.name, report)
    require_tokenizer_fits(loaded)
    require_finite_weights(loaded.model, loaded.name)


def require_complete(model: nn.Module, name: str, report: dict[str, Any]) -> None:
    """Refuse tensors the checkpoint lacks (transformers initialized them at random) and tensors for
    parts of ``model`` its config does not build (:func:`unbuilt`)."""
    missing = sorted(report.get("missing_keys") or ())
    if missing:
        raise BrokenModelError(
            f"'{name}' is not whole: its weights lack {_named(missing)}, which would be initialized at "
            "random; re-save or re-download the complete checkpoint"
        )
    extra = sorted(k for k in report.get("unexpected_keys") or () if unbuilt(model, k))
    if extra:
        raise BrokenModelError(
            f"'{name}': its weights hold {_named(extra)}, which its config.json does not build (config "
            "and weights disagree); use the config.json saved with these weights"
        )


class HeldLoadReport(logging.Filter):
    """transformers logs its loading report (missing, unexpected, mismatched tensors) as a table;
    ssacli reads the same report (require_whole) and refuses in one line what makes the model not its
    checkpoint, so the table is held back (``text``) instead of printed."""

    def __init__(self) -> None:
        super().__init__()
        self.text = ""
        self.floor = logging.WARNING  # the level below which a record would not have been printed

    def filter(self, record: logging.LogRecord) -> bool:
        if "LOAD REPORT" not in str(record.msg):
            return record.levelno >= self.floor
        self.text = record.getMessage()
        return False

    @contextmanager
    def held(self) -> Iterator[None]:
        """The report is read whatever transformers' verbosity: it is a warning, so the logger is let
        down to WARNING for the load where a quieter verbosity would drop it before any filter (the
        other records are still dropped below that verbosity). Not lower: at INFO transformers walks
        the whole model for its report."""
        logger = logging.getLogger("transformers.modeling_utils")
        level, self.floor = logger.level, logger.getEffectiveLevel()
        if self.floor > logging.WARNING:
            logger.setLevel(logging.WARNING)
        logger.addFilter(self)  # a filter: the table is held back, not printed
        try:
            yield
        finally:
            logger.removeFilter(self)
            logger.setLevel(level)


def mismatched_shapes(name: str, report: str) -> BrokenModelError:
    """The error for weights whose shapes are not those the config builds, naming the tensors from
    transformers' loading report (``report``, its text: "KEY | MISMATCH | … ckpt: … vs model: …")."""
    found = []
    for line in report.splitlines():
        if "| MISMATCH" in line:
            key, _, detail = line.partition("|")
            shapes = _SHAPES.search(detail)
            sizes = f" ({shapes[1]} in the weights, {shapes[2]} built)" if shapes else ""
            found.append(key.strip() + sizes)
    named = _named(found) if found else "some tensors"
    return BrokenModelError(
        f"'{name}': its weights do not have the shapes its config.json builds: {named}; use the "
        "config.json saved with these weights"
    )


def unbuilt(model: nn.Module, key: str) -> bool:
    """Whether a checkpoint tensor the model did not load belongs to a part the model has: an entry
    past the end of one of its module lists (``layers.4`` of 4 layers), or a tensor of one of its
    modules that the module does not have. A whole part it does not build (``cls.seq_relationship``,
    ``pooler``) is not."""
    modules = dict(model.named_modules())
    parts = key.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        module = modules.get(".".join(parts[:depth]))
        if module is not None:
            return depth == len(parts) - 1 or isinstance(module, nn.ModuleList | nn.ModuleDict)
    return False


def require_tokenizer_fits(loaded: LoadedModel) -> None:
    """Refuse a tokenizer with more ids than the model's input embedding has rows."""
    if loaded.tokenizer is None:
        return
    try:
        rows = loaded.attention_root.get_input_embeddings().num_embeddings
        ids = len(loaded.tokenizer)
    except (AttributeError, NotImplementedError, TypeError):  # no embedding table, no length to compare
        return
    if ids > rows:
        vocab = getattr(loaded.config, "vocab_size", rows)
        files = [f for f in TOKENIZER_FILES if loaded.path is not None and (loaded.path / f).is_file()]
        where = f" ({loaded.path / files[0]})" if files else ""
        raise BrokenModelError(
            f"'{loaded.name}': its tokenizer{where} has {ids:,} ids but the model's embedding has {rows:,} "
            f"rows (vocab_size {vocab}), so ids ≥ {rows:,} cannot be read; use the tokenizer saved with "
            "this model, or resize its embeddings and save both"
        )


def _named(keys: Iterable[str]) -> str:
    keys = list(keys)
    more = f" and {len(keys) - SHOWN} more tensors" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value of a floating tensor is finite, in one reading pass: aminmax is NaN where
    any value is NaN and ±inf where one is (isfinite(...).all() writes and reads a boolean copy)."""
    if values.numel() == 0:
        return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def nonfinite_weights(model: nn.Module) -> list[tuple[str, int, int]]:
    """(name, non-finite values, values) of every parameter and buffer holding a NaN or ±inf, in
    ``named_parameters`` then ``named_buffers`` order. Tensors on the meta device (offloaded to disk
    by a device map) are not read."""
    found = []
    # (named_parameters and named_buffers list a tied tensor once)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.device.type == "meta" or not tensor.is_floating_point():
            continue
        with torch.no_grad():  # one reading pass per tensor; counted only where one is not finite
            bad = 0 if all_finite(tensor) else int(tensor.numel() - torch.isfinite(tensor).sum().item())
        if bad:
            found.append((name, bad, tensor.numel()))
    return found


def require_finite_weights(model: nn.Module, name: str) -> None:
    """Raise BrokenModelError naming the non-finite tensors of ``model`` (called ``name``), if any."""
    found = nonfinite_weights(model)
    if not found:
        return
    shown = ", ".join(f"{tensor} ({bad:,} of {total:,} values)" for tensor, bad, total in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more tensors" if len(found) > SHOWN else ""
    raise BrokenModelError(
        f"'{name}' has non-finite weights (NaN or inf): {shown}{more}; every forward would be "
        "non-finite, so nothing can be measured: repair or re-export the checkpoint"
    )
