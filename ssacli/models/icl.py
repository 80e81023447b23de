"""The ICL model: a plain transformers GPT-2 backbone between a scalar read-in and read-out.

Attention goes through ssacli's integration like any other model (``apply_scorer``), so every
scorer, and later every diagnostic, applies unchanged. A checkpoint is a normal folder:

* ``config.json``: the GPT-2 backbone's config (transformers format);
* ``model.safetensors``: all weights, scorer parameters included;
* ``ssacli.json``: ssacli's own small record: task, scorer spec, sizes, and how it was trained.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import GPT2Config, GPT2Model

from ..attention.interface import apply_scorer
from ..errors import InputError, UsageError
from ..files import output_error, replace_folder

FORMAT = "ssacli-icl"
FORMAT_VERSION = 1
META_FILE = "ssacli.json"
WEIGHTS_FILE = "model.safetensors"



@dataclass
class ICLSpec:
    """Everything needed to rebuild an ICL model (stored in ssacli.json)."""

    task: str
    scorer: str = "softmax"
    layers: int = 3
    heads: int = 4
    width: int = 32
    max_points: int = 200  # longest prompt (in x, y pairs) the position table covers
    training: dict[str, Any] = field(default_factory=dict)  # recipe and history, for the record



class ICLModel(nn.Module):
    def __init__(self, spec: ICLSpec) -> None:
        super().__init__()
        self.spec = spec
        config = GPT2Config(
            vocab_size=1,  # inputs are scalars fed through read_in, never token ids
            n_positions=2 * spec.max_points,
            n_embd=spec.width,
            n_layer=spec.layers,
            n_head=spec.heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
        )
        self.read_in = nn.Linear(1, spec.width)
        self.backbone = GPT2Model(config)
        self.read_out = nn.Linear(spec.width, 1)
        apply_scorer(self.backbone, spec.scorer)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [batch, 2·points] (x_1, y_1, …) -> predictions for y_i at each x_i, [batch, points]."""
        if tokens.shape[1] > 2 * self.spec.max_points:
            raise UsageError(
                f"prompt of {tokens.shape[1] // 2} points is longer than this model's "
                f"{self.spec.max_points}; use shorter --length values"
            )
        hidden = self.backbone(inputs_embeds=self.read_in(tokens.unsqueeze(-1))).last_hidden_state
        return self.read_out(hidden).squeeze(-1)[:, ::2]

    def attention_maps(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The scorer's weights of every layer, each [batch, heads, tokens, tokens]."""
        embeds = self.read_in(tokens.unsqueeze(-1))
        return self.backbone(inputs_embeds=embeds, output_attentions=True).attentions


def save_icl(
    model: ICLModel, directory: str | Path, extra_tensors: dict[str, torch.Tensor] | None = None
) -> None:
    """Write the checkpoint folder atomically: a temp folder beside it, then a rename."""
    directory = Path(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError as err:
        raise output_error(directory, err) from err
    try:
        model.backbone.config.to_json_file(tmp / "config.json")
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, tmp / WEIGHTS_FILE, metadata={"format": FORMAT})
        if extra_tensors:
            save_file(
                {k: v.contiguous().cpu() for k, v in extra_tensors.items()}, tmp / "trainer.safetensors"
            )
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(model.spec)}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        replace_folder(tmp, directory)
    except (OSError, SafetensorError) as err:  # a full disk, a read-only folder: directory is as it was
        raise output_error(directory, err) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_icl_checkpoint(directory: str | Path) -> bool:
    path = Path(directory) / META_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def load_icl(directory: str | Path, device: torch.device | str = "cpu") -> ICLModel:
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise InputError(
            f"{directory} is not an ssacli ICL checkpoint (no {META_FILE}); train one with `ssacli icl train`"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as err:
        raise InputError(f"{meta_path} is not valid JSON ({err}); re-create the checkpoint") from None
    if meta.get("format") != FORMAT:
        raise InputError(f"{meta_path} is not an ssacli ICL record (format={meta.get('format')!r})")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise InputError(
            f"{directory} was written by a newer ssacli (format {meta['format_version']}); upgrade ssacli"
        )
    fields = {k: meta[k] for k in ICLSpec.__dataclass_fields__ if k in meta}
    model = ICLModel(ICLSpec(**fields))
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise InputError(f"{directory} has no {WEIGHTS_FILE}; the checkpoint is incomplete")
    missing, unexpected = model.load_state_dict(load_file(weights), strict=False)
    if missing or unexpected:
        raise InputError(
            f"{weights} does not match its ssacli.json (missing {len(missing)}, unexpected "
            f"{len(unexpected)} tensors, e.g. {(missing or unexpected)[0]}); re-create the checkpoint"
        )
    return model.to(device).eval()
