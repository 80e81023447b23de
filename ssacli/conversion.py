"""Swap a pretrained model's attention scorer, measure how close it stays, and save it.

A converted folder is an ordinary ``save_pretrained`` folder, so plain transformers loads it as the
original architecture (with softmax attention), plus ssacli's part (``ssacli.json`` and the scorer's
parameters; the format is :mod:`ssacli.models.checkpoint`'s, which also reads it back). ICL models
keep their own folder format. Folders are written to a temporary sibling and renamed at the end, so
a failure leaves nothing half-written; the input folder is never touched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from .attention.interface import CONFIG_SPEC_ATTR, apply_scorer, supports
from .errors import OutputError, UnsupportedModelError, UsageError
from .models.checkpoint import SCORER_KEY, write_model_folder
from .models.loading import LoadedModel, load_model

# ---- saving --------------------------------------------------------------------------------------------


def save_model(
    loaded: LoadedModel,
    out: str | Path,
    *,
    meta: dict[str, Any] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``loaded`` (with its scorer) to ``out`` atomically; ``extra_tensors`` go to
    trainer.safetensors (optimizer state for resuming, see
    :func:`ssacli.models.checkpoint.trainer_state_tensors`)."""
    out = Path(out).expanduser()
    check_out(out, loaded.path, overwrite)
    if loaded.kind == "icl":
        from .models.icl import save_icl  # transformers' GPT-2 is imported only for ICL models

        if meta:
            loaded.model.spec.training = {**loaded.model.spec.training, **meta}
        loaded.model.spec.scorer = _spec_of(loaded)
        save_icl(loaded.model, out, extra_tensors)
    else:
        write_model_folder(
            loaded.model, out, scorer=_spec_of(loaded), meta=meta, tokenizer=loaded.tokenizer,
            trainer=extra_tensors,
        )  # fmt: skip
    return out


def check_out(out: Path, source: Path | None, overwrite: bool) -> None:
    """Refuse to write over the input folder, over anything without --overwrite, or where nothing
    can be written (checked before any work)."""
    if source is not None and out.exists() and out.resolve() == Path(source).resolve():
        raise UsageError(
            f"--out {out} is the input model's folder; ssacli never modifies its input, choose another --out"
        )
    if out.exists() and not overwrite:
        raise UsageError(
            f"--out {out} already exists; pass --overwrite to replace it, or choose another folder"
        )
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder path")
    parent = out.absolute().parent
    while not parent.exists():  # the nearest folder that exists is where the new ones are made
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"cannot write --out {out}: {parent} is not a writable folder; choose another --out"
        )


def _spec_of(loaded: LoadedModel) -> str:
    return getattr(loaded.attention_root.config, CONFIG_SPEC_ATTR, None) or "softmax"


# ---- conversion -------------------------------------------------------------------------------------


def convert(
    model: str | LoadedModel,
    scorer: str,
    out: str | Path | None = None,
    *,
    overwrite: bool = False,
    samples: int = 8,
    length: int = 64,
    seed: int = 0,
    device: str = "auto",
    dtype: str = "auto",
    allow_download: bool = False,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> tuple[LoadedModel, dict[str, Any]]:
    """Swap every attention layer's scorer for ``scorer``; return the model and its fidelity.

    Fidelity compares the model's outputs before and after the swap on the same probe inputs
    (:func:`fidelity`). With ``out``, the converted model is saved there (never over the input).
    A MODEL reference is loaded with ``device`` … ``trust_remote_code``
    (:class:`~ssacli.models.loading.LoadOptions`).
    """
    if out is not None:  # cheap checks before loading anything
        check_out(Path(out).expanduser(), None, overwrite)
    loaded = model if isinstance(model, LoadedModel) else load_model(
        model, device=device, dtype=dtype, allow_download=allow_download, allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code,
    )  # fmt: skip
    root = loaded.attention_root
    if not supports(root):
        raise UnsupportedModelError(
            f"model family '{loaded.family}' does not route attention through transformers' "
            "AttentionInterface, so its scorer cannot be swapped (docs/models.md lists supported families)"
        )
    if out is not None:
        check_out(Path(out).expanduser(), loaded.path, overwrite)
    loaded.model.eval()
    batches = _fidelity_inputs(loaded, samples, length, seed)
    before_spec = _spec_of(loaded)
    if not any(SCORER_KEY in k for k in loaded.model.state_dict()) and before_spec == "softmax":
        apply_scorer(root, "softmax")  # measure "before" through the same attention function
    before = _outputs(loaded, batches)
    apply_scorer(root, scorer)
    after = _outputs(loaded, batches)
    report = {"from": before_spec, "to": _spec_of(loaded), **fidelity(loaded.kind, before, after, batches)}
    if out is not None:
        source = str(loaded.path or loaded.name)
        save_model(loaded, out, meta={"source": source, "fidelity": report}, overwrite=overwrite)
    return loaded, report


def _fidelity_inputs(loaded: LoadedModel, samples: int, length: int, seed: int) -> list:
    from .diagnosis.probes import TokenSource, icl_batches, icl_tokens, pad_sequences

    if loaded.kind == "icl":
        task = loaded.model.spec.task
        return [
            icl_tokens(task, b.xs, b.coef)[0] for b in icl_batches(task, samples, length // 2 or 1, 8, seed)
        ]
    vocab = getattr(loaded.config, "vocab_size", None) or 2
    if loaded.max_positions:
        length = min(length, loaded.max_positions)
    source = TokenSource(loaded.tokenizer, text=None, random_ids=False, vocab_size=vocab, seed=seed)
    return pad_sequences(source.sequences(samples, length), 0, 8)


@torch.inference_mode()
def _outputs(loaded: LoadedModel, batches: list) -> list[torch.Tensor]:
    device = loaded.device
    outs = []
    for batch in batches:
        if loaded.kind == "icl":
            outs.append(loaded.model(batch.to(device)).float().cpu())
            continue
        kwargs: dict[str, Any] = {"input_ids": batch.input_ids.to(device)}
        if loaded.kind == "seq2seq":
            kwargs["decoder_input_ids"] = kwargs["input_ids"]
        if loaded.kind in ("causal", "seq2seq"):
            kwargs["use_cache"] = False
        result = loaded.model(**kwargs)
        logits = getattr(result, "logits", None)
        out = logits if logits is not None else result.last_hidden_state
        outs.append(out.float().cpu())
    return outs


def fidelity(
    kind: str, before: list[torch.Tensor], after: list[torch.Tensor], batches: list
) -> dict[str, Any]:
    """How far the converted outputs are from the original ones, on the same inputs.

    Language models (outputs are logits over a vocabulary): mean per-token KL(original ‖ converted)
    in nats and top-1 agreement. ICL quantification models (a sign predicted through a logit): the
    same for the two Bernoulli distributions per prediction, plus the relative error. Others
    (encoders' hidden states, ICL regression): the relative error ‖after − before‖ / ‖before‖.
    """
    is_lm = kind in ("causal", "masked", "seq2seq") and before[0].dim() == 3 and before[0].shape[-1] > 1
    if kind == "icl" and task_is_classification(batches):
        return {**_bernoulli_kl(before, after), **_relative_error(before, after)}
    if not is_lm:
        return _relative_error(before, after)
    kl_sum, agree, tokens = 0.0, 0, 0
    for b, a in zip(before, after):
        log_p, log_q = F.log_softmax(b.double(), -1), F.log_softmax(a.double(), -1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        kl_sum += float(kl.sum())
        agree += int((b.argmax(-1) == a.argmax(-1)).sum())
        tokens += kl.numel()
    return {"kl_per_token": max(kl_sum / tokens, 0.0), "top1_agreement": agree / tokens, "tokens": tokens}


def task_is_classification(batches: list) -> bool:
    """ICL prompts of the quantification tasks carry ±1 labels at the odd positions."""
    return all(bool(((t[:, 1::2] == 1) | (t[:, 1::2] == -1)).all()) for t in batches)


def _bernoulli_kl(before: list[torch.Tensor], after: list[torch.Tensor]) -> dict[str, Any]:
    """ICL quantification models predict a sign through a logit: the per-prediction KL between the
    two Bernoulli distributions, and how often the predicted sign agrees."""
    kl_sum, agree, count = 0.0, 0, 0
    for b, a in zip(before, after):
        b, a = b.double(), a.double()
        p, log_p, log_1p = torch.sigmoid(b), F.logsigmoid(b), F.logsigmoid(-b)
        kl = p * (log_p - F.logsigmoid(a)) + (1 - p) * (log_1p - F.logsigmoid(-a))
        kl_sum += float(kl.sum())
        agree += int(((b > 0) == (a > 0)).sum())
        count += kl.numel()
    return {"kl_per_token": max(kl_sum / count, 0.0), "top1_agreement": agree / count, "tokens": count}


def _relative_error(before: list[torch.Tensor], after: list[torch.Tensor]) -> dict[str, Any]:
    num = sum(float((a.double() - b.double()).pow(2).sum()) for a, b in zip(before, after))
    den = sum(float(b.double().pow(2).sum()) for b in before)
    return {"relative_error": (num / den) ** 0.5 if den > 0 else float("nan")}
