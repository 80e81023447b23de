"""The ICL model: a transformers GPT-2 backbone between a scalar read-in and read-out.

Two backbones (:data:`ARCHS`, ``ICLSpec.arch``):

* ``gpt2`` (the default, and what a checkpoint without the field is): transformers' ``GPT2Model``
  as it is, pre-LayerNorm blocks with an MLP, and a final LayerNorm.
* ``attn-only``: the same ``GPT2Model`` with every block's MLP and both LayerNorms, and the final
  LayerNorm, removed (the MLP returns 0, the norms are the identity), so a block is
  ``h + attention(h)``. Without the LayerNorms the scale of the inputs reaches q·k, which is the
  setting where softmax can saturate (the authors' attention-only models). It is the GPT-2 model
  with modules taken out rather than a stack of our own because the attention modules, their
  weights' names and transformers' attention dispatch stay exactly those of ``gpt2``: the scorer is
  swapped by ``apply_scorer`` like in any model, so every scorer and backend applies unchanged.

Attention goes through ssacli's integration like any other model (``apply_scorer``), so every
scorer, and later every diagnostic, applies unchanged. A checkpoint is a normal folder in the
``ssacli-icl`` format (:mod:`ssacli.models.checkpoint` reads and writes it):

* ``config.json``: the GPT-2 backbone's config (transformers format);
* ``model.safetensors``: all weights, scorer parameters included;
* ``ssacli.json``: ssacli's own small record: task, scorer spec, sizes, and how it was trained.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GPT2Config, GPT2Model

from ..attention.interface import apply_scorer
from ..errors import InputError, UsageError
from .checkpoint import (
    ICL_FORMAT,
    META_FILE,
    WEIGHTS_FILE,
    folder_format,
    read_icl_meta,
    read_icl_weights,
    write_icl_folder,
)
from .icl_settings import ARCHS, check_arch  # noqa: F401 (ARCHS: importable here too)
from .icl_task import TOKENS_PER_POINT
from .integrity import require_finite_weights


@dataclass
class ICLSpec:
    """Everything needed to rebuild an ICL model (stored in ssacli.json)."""

    task: str
    scorer: str = "softmax"
    layers: int = 3
    heads: int = 4
    width: int = 32
    max_points: int = 200  # longest prompt (in x, y pairs) the position table covers
    arch: str = "gpt2"  # backbone (ARCHS); checkpoints written before the field existed are gpt2
    training: dict[str, Any] = field(default_factory=dict)  # recipe and history, for the record


class NoMLP(nn.Module):
    """A block's MLP that adds nothing to the residual stream (attn-only backbones)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden)


def strip_to_attention(backbone: GPT2Model) -> None:
    """Remove the MLPs and LayerNorms of a GPT2Model in place: each block becomes h + attn(h)."""
    for block in backbone.h:
        block.ln_1 = nn.Identity()
        block.ln_2 = nn.Identity()
        block.mlp = NoMLP()
    backbone.ln_f = nn.Identity()


class ICLModel(nn.Module):
    def __init__(self, spec: ICLSpec, *, parameters_follow: bool = False) -> None:
        """A fresh model of ``spec`` (``parameters_follow``: its weights, scorer included, are loaded
        next, so a scorer start that needs calibration is accepted, see ``apply_scorer``)."""
        super().__init__()
        self.spec = spec
        check_arch(spec.arch)
        config = GPT2Config(
            vocab_size=1,  # inputs are scalars fed through read_in, never token ids
            n_positions=TOKENS_PER_POINT * spec.max_points,
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
        if spec.arch == "attn-only":
            strip_to_attention(self.backbone)
        self.read_out = nn.Linear(spec.width, 1)
        apply_scorer(self.backbone, spec.scorer, parameters_follow=parameters_follow)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [batch, 2·points] (x_1, y_1, …) -> predictions for y_i at each x_i, [batch, points]."""
        if tokens.shape[1] > TOKENS_PER_POINT * self.spec.max_points:
            raise UsageError(
                f"prompt of {tokens.shape[1] // TOKENS_PER_POINT} points is longer than this model's "
                f"{self.spec.max_points}; use shorter --length values"
            )
        hidden = self.backbone(inputs_embeds=self.read_in(tokens.unsqueeze(-1))).last_hidden_state
        return self.read_out(hidden).squeeze(-1)[:, ::2]

    def attention_maps(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The scorer's weights of every layer, each [batch, heads, tokens, tokens]."""
        embeds = self.read_in(tokens.unsqueeze(-1))
        return self.backbone(inputs_embeds=embeds, output_attentions=True).attentions


def save_icl(
    model: ICLModel,
    directory: str | Path,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    *,
    best: str | None = None,
) -> None:
    """Write the checkpoint folder atomically (a temp folder beside it, then a rename);
    ``extra_tensors`` go to trainer.safetensors (:func:`~ssacli.models.checkpoint.trainer_state_tensors`);
    ``best``: a training run's best/ folder (:func:`~ssacli.models.checkpoint.write_icl_folder`)."""
    write_icl_folder(
        directory,
        config=model.backbone.config,
        state=model.state_dict(),
        record=asdict(model.spec),
        trainer=extra_tensors,
        best=best,
    )


def is_icl_checkpoint(directory: str | Path) -> bool:
    return folder_format(directory) == ICL_FORMAT


def load_icl(directory: str | Path, device: torch.device | str = "cpu") -> ICLModel:
    directory = Path(directory)
    meta = read_icl_meta(directory)
    fields = {k: meta[k] for k in ICLSpec.__dataclass_fields__ if k in meta}
    model = ICLModel(ICLSpec(**fields), parameters_follow=True)
    missing, unexpected = model.load_state_dict(read_icl_weights(directory), strict=False)
    if missing or unexpected:
        raise InputError(
            f"{directory / WEIGHTS_FILE} does not match its {META_FILE} (missing {len(missing)}, unexpected "
            f"{len(unexpected)} tensors, e.g. {(missing or unexpected)[0]}); re-create the checkpoint"
        )
    require_finite_weights(model, str(directory))  # every ICL load (eval, sweep, resume) comes here
    return model.to(device).eval()
