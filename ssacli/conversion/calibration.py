"""Fidelity: how close a converted model's outputs stay to the original's, on the same calibration
inputs.

:func:`calibration_inputs` draws the inputs (token windows of the calibration text, or ICL prompts),
:func:`model_outputs` runs the model on them, :func:`fidelity` compares two sets of outputs, and
:func:`target_of` says which of its measures the target applies to.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from ..defaults import MAX_KL_PER_TOKEN, MAX_RELATIVE_ERROR
from ..models.icl_task import TOKENS_PER_POINT, interleave, labels
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel


def calibration_inputs(
    loaded: LoadedModel, samples: int, length: int, seed: int, text: str | None = None
) -> list:
    """The calibration batches: ``samples`` windows of ``length`` tokens from ``text`` (None: the
    built-in probe texts), padded into batches of 8; ICL models get ``samples`` prompts of their task."""
    from ..diagnosis.plan import TokenSource, icl_batches, pad_sequences

    if loaded.kind == ModelKind.ICL:
        task = loaded.model.spec.task
        points = length // TOKENS_PER_POINT or 1
        return [
            interleave(b.xs, labels(task, b.xs, b.coef)) for b in icl_batches(task, samples, points, 8, seed)
        ]
    vocab = getattr(loaded.config, "vocab_size", None) or 2
    if loaded.max_positions:
        length = min(length, loaded.max_positions)
    source = TokenSource(loaded.tokenizer, text=text, random_ids=False, vocab_size=vocab, seed=seed)
    return pad_sequences(source.sequences(samples, length), loaded.pad_id, 8)


@torch.inference_mode()
def model_outputs(loaded: LoadedModel, batches: list) -> list[torch.Tensor]:
    """The model's outputs on each batch (logits, else the last hidden state), as float32 on the CPU."""
    device = loaded.device
    outs = []
    for batch in batches:
        if loaded.kind == ModelKind.ICL:
            outs.append(loaded.model(batch.to(device)).float().cpu())
            continue
        kwargs: dict[str, Any] = {"input_ids": batch.input_ids.to(device)}
        if loaded.kind == ModelKind.SEQ2SEQ:
            kwargs["decoder_input_ids"] = kwargs["input_ids"]
        if loaded.kind in (ModelKind.CAUSAL, ModelKind.SEQ2SEQ):
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
    is_lm = (
        kind in (ModelKind.CAUSAL, ModelKind.MASKED, ModelKind.SEQ2SEQ)
        and before[0].dim() == 3
        and before[0].shape[-1] > 1
    )
    if kind == ModelKind.ICL and task_is_classification(batches):
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


def target_of(report: dict[str, Any], max_error: float | None = None) -> tuple[str, float]:
    """(metric, target): KL per token (per prediction for ICL sign models) where the output is a
    distribution, else the relative error; the target is ``max_error`` or the default for it."""
    if "kl_per_token" in report:
        return "kl_per_token", MAX_KL_PER_TOKEN if max_error is None else max_error
    return "relative_error", MAX_RELATIVE_ERROR if max_error is None else max_error
