"""Model quality before and after a change: LM loss, minimal pairs and ICL error.

Attention diagnostics say whether heads collapse; these measures say whether the model still does
its job. They are pure functions of a :class:`~ssacli.models.loading.LoadedModel`.
:func:`ssacli.quality.compare.compare_models` runs all that apply on two models into one report; the
files they read (``--text``, ``--pairs``) are read by :mod:`ssacli.quality.inputs`.

Conventions (documented because they change the numbers):

* causal LM loss: the text's tokens in non-overlapping windows of ``seq_len`` (BOS first when the
  tokenizer has one); every text token is predicted from the tokens before it in its window, except
  a window's first when there is no BOS to predict it from.
* masked LM loss: windows wrapped in the tokenizer's CLS/SEP tokens; in each window a seeded
  ``round(mask_prob · n)`` (at least one) of the n text tokens are all replaced by the mask token at
  once (no 80/10/10 mix: evaluation, not training) and the loss is the NLL of the true tokens there.
* minimal pairs: causal LMs score a sentence by the summed log-prob of its tokens after BOS (when
  the tokenizer has one; without it the first token is context only); masked LMs by the
  pseudo-log-likelihood, each text token masked in turn inside CLS … SEP. A pair is correct when
  the good sentence scores strictly higher (ties count as wrong).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from ..defaults import (
    BATCH_SIZE,
    ICL_OUTLIERS,
    ICL_POINTS,
    ICL_PROMPTS,
    ICL_SIGMAS,
    LM_MAX_TOKENS,
    LM_SEQ_LEN,
    SEED,
)
from ..errors import InputError, UsageError
from ..models.kinds import ModelKind
from ..models.loading import LoadedModel
from .inputs import LM_KINDS, check_pair_record, read_pairs

# ---- language-model loss ----------------------------------------------------------------------------


def language_model_loss(
    loaded: LoadedModel, text: str, *, seq_len: int = LM_SEQ_LEN, max_tokens: int = LM_MAX_TOKENS,
    batch_size: int = BATCH_SIZE, mask_prob: float = 0.15, seed: int = SEED,
) -> dict[str, Any]:  # fmt: skip
    """Mean NLL per scored token and its exp (perplexity) on ``text``; see the module docstring for
    how causal and masked LMs are scored. Only the first ``max_tokens`` tokens of the text are used."""
    tokenizer = _lm_tokenizer(loaded, "LM loss")
    if seq_len < 2 or max_tokens < 2 or batch_size < 1:
        raise UsageError("seq-len and max-tokens must be >= 2, batch-size >= 1")
    if not 0 < mask_prob <= 1:
        raise UsageError(f"mask-prob must be in (0, 1], got {mask_prob}")
    masked = loaded.kind == ModelKind.MASKED
    ids, truncated, prefix, suffix, chunks = _windows(loaded, tokenizer, text, seq_len, max_tokens)
    body = len(chunks[0])
    generator = torch.Generator().manual_seed(seed)
    window_nll: list[float] = []  # per window, in batch order: the same windows on every model
    window_tokens: list[int] = []
    for batch in _same_length_batches(chunks, batch_size):
        rows = torch.tensor([prefix + c + suffix for c in batch])
        if masked:
            inputs, scored = _mask_windows(rows, len(prefix), len(batch[0]), mask_prob, tokenizer, generator)
            logprobs = _log_probs(loaded, inputs, torch.ones_like(inputs))
            nll = -logprobs.gather(-1, rows.unsqueeze(-1)).squeeze(-1) * scored
        else:
            logprobs = _log_probs(loaded, rows, torch.ones_like(rows))[:, :-1]
            nll = -logprobs.gather(-1, rows[:, 1:].unsqueeze(-1)).squeeze(-1)
            scored = torch.ones_like(nll, dtype=torch.bool)
        window_nll += [float(v) for v in nll.double().sum(1)]
        window_tokens += [int(v) for v in scored.sum(1)]
    total, count = math.fsum(window_nll), sum(window_tokens)
    mean = total / count
    return {
        "kind": loaded.kind,
        "objective": f"masked-LM, {mask_prob:g} of tokens masked" if masked else "next-token",
        "nll": mean,
        "perplexity": math.exp(mean) if mean < 700 else None,  # None: too large for JSON
        "tokens": count,
        "text_tokens": len(ids),
        "windows": len(chunks),
        "truncated": truncated,
        "seq_len": body + len(prefix) + len(suffix),  # the first window is a full one
        # per window: summed NLL and scored tokens, so that two models on the same text pair up
        # window by window (the intervals of ssacli.quality.tradeoff)
        "window_nll": window_nll,
        "window_tokens": window_tokens,
    }


def _windows(
    loaded: LoadedModel, tokenizer, text: str, seq_len: int, max_tokens: int
) -> tuple[list[int], bool, list[int], list[int], list[list[int]]]:
    """The text's first ``max_tokens`` tokens cut into windows of ``seq_len`` (capped at the
    model's positions) with room for the special tokens: (ids, truncated, prefix, suffix, windows)."""
    ids, truncated = _tokenize_prefix(tokenizer, text, max_tokens)
    masked = loaded.kind == ModelKind.MASKED
    prefix, suffix = _wrap_ids(tokenizer, masked)
    body = min(seq_len, loaded.max_positions or seq_len) - len(prefix) - len(suffix)
    shortest = 1 if masked or prefix else 2  # a window must hold a token to score
    if body < shortest:
        raise UsageError(f"seq-len {seq_len} leaves no room for text tokens in a window")
    chunks = [ids[i : i + body] for i in range(0, len(ids), body)]
    chunks = [c for c in chunks if len(c) >= shortest]
    if not chunks:
        raise InputError("the text has too few tokens to score; give a longer text")
    return ids, truncated, prefix, suffix, chunks


def output_kl(
    reference: LoadedModel, loaded: LoadedModel, text: str, *, seq_len: int = LM_SEQ_LEN,
    max_tokens: int = LM_MAX_TOKENS, batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:  # fmt: skip
    """KL(reference ‖ loaded) of the next-token distributions per token on ``text`` (causal LMs, the
    windows of :func:`language_model_loss`), in float64 as a small KL is a difference of nearly equal
    log-probabilities: how far a conversion moved the outputs, measured now on this text."""
    tokenizer = _lm_tokenizer(loaded, "output KL")
    if loaded.kind != ModelKind.CAUSAL or reference.kind != ModelKind.CAUSAL:
        raise UsageError("output KL to the original is measured on causal language models")
    _, _, prefix, suffix, chunks = _windows(loaded, tokenizer, text, seq_len, max_tokens)
    total, count = 0.0, 0
    for batch in _same_length_batches(chunks, batch_size):
        rows = torch.tensor([prefix + c + suffix for c in batch])
        ones = torch.ones_like(rows)
        ref, now = _log_probs(reference, rows, ones).double(), _log_probs(loaded, rows, ones).double()
        p = ref.exp()
        kl = torch.where(p > 0, p * (ref - now), torch.zeros_like(p)).sum(-1)[:, :-1]  # they predict text
        total += float(kl.sum())
        count += kl.numel()
    return {"kl_per_token": total / count, "tokens": count}


def _lm_tokenizer(loaded: LoadedModel, what: str):
    if loaded.kind not in LM_KINDS:
        raise UsageError(f"{what} needs a causal or masked language model; '{loaded.name}' is {loaded.kind}")
    if loaded.tokenizer is None:
        raise InputError(f"{what} needs a tokenizer, and '{loaded.name}' has none; save one in the folder")
    if loaded.kind == ModelKind.MASKED and loaded.tokenizer.mask_token_id is None:
        raise InputError(f"'{loaded.name}' is a masked LM but its tokenizer has no mask token")
    return loaded.tokenizer


def _tokenize_prefix(tokenizer, text: str, max_tokens: int) -> tuple[list[int], bool]:
    """The first ``max_tokens`` tokens of ``text``. A long text is cut (at whitespace, so the kept
    tokens are the same as the full text's) to a prefix ample for that many tokens: tokenizing a
    whole corpus only to keep its start would cost seconds per MB."""
    cut = max_tokens * 32
    if len(text) > cut:
        space = max(text.rfind(" ", 0, cut), text.rfind("\n", 0, cut))
        ids = _encode(tokenizer, text[: space if space > 0 else cut])
        if len(ids) > max_tokens:
            return ids[:max_tokens], True
    ids = _encode(tokenizer, text)
    return ids[:max_tokens], len(ids) > max_tokens


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _wrap_ids(tokenizer, masked: bool) -> tuple[list[int], list[int]]:
    """Special tokens around a window: CLS … SEP for masked LMs, BOS in front for causal ones."""
    if masked:
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        return ([cls] if cls is not None else []), ([sep] if sep is not None else [])
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None else []), []


def _same_length_batches(chunks: list[list[int]], batch_size: int) -> Iterable[list[list[int]]]:
    """Batches of equal-length windows (no padding, so no padding convention can leak in)."""
    by_length: dict[int, list[list[int]]] = {}
    for chunk in chunks:
        by_length.setdefault(len(chunk), []).append(chunk)
    for group in by_length.values():
        for start in range(0, len(group), batch_size):
            yield group[start : start + batch_size]


def _mask_windows(rows, offset, width, mask_prob, tokenizer, generator) -> tuple[torch.Tensor, torch.Tensor]:
    scored = torch.zeros_like(rows, dtype=torch.bool)
    k = max(1, round(mask_prob * width))
    for row in range(rows.shape[0]):
        scored[row, offset + torch.randperm(width, generator=generator)[:k]] = True
    return rows.masked_fill(scored, tokenizer.mask_token_id), scored


def _log_probs(loaded: LoadedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """float32 log-softmax of the model's logits. The mask is always passed, even when all ones:
    without it transformers warns whenever a real token (e.g. BOS) shares the pad id."""
    kwargs: dict[str, Any] = {"input_ids": ids.to(loaded.device), "attention_mask": mask.to(loaded.device)}
    if loaded.kind == ModelKind.CAUSAL:
        kwargs["use_cache"] = False
    with torch.inference_mode():
        logits = loaded.model(**kwargs).logits
    return F.log_softmax(logits.float(), dim=-1).cpu()


# ---- minimal pairs ----------------------------------------------------------------------------------


def minimal_pairs(
    loaded: LoadedModel, source: str | Path | Sequence[dict] | dict[str, Sequence[dict]], *,
    limit: int | None = None, batch_size: int = 32, scores: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Share of pairs whose good sentence outscores the bad one, per file and overall.

    ``source``: a ``.jsonl`` file, a folder of them, a list of records, or {name: records}.
    ``scores``: also return each pair's (good, bad) log-likelihoods, per file.
    """
    tokenizer = _lm_tokenizer(loaded, "minimal pairs")
    if isinstance(source, str | Path):
        groups = read_pairs(source, limit)
    else:
        groups = dict(source) if isinstance(source, dict) else {"records": list(source)}
        for name, records in groups.items():
            for index, record in enumerate(records):
                check_pair_record(record, f"pair {index} of '{name}'")
            groups[name] = list(records)[:limit] if limit else list(records)
    files, correct_all, total_all = {}, 0, 0
    for name, records in groups.items():
        sentences = [r[key] for r in records for key in ("sentence_good", "sentence_bad")]
        values = sentence_log_likelihoods(loaded, sentences, batch_size=batch_size, tokenizer=tokenizer)
        pairs = list(zip(values[0::2], values[1::2]))
        correct = sum(good > bad for good, bad in pairs)
        files[name] = {"pairs": len(pairs), "correct": correct, "accuracy": correct / len(pairs)}
        if scores:
            files[name]["scores"] = [list(p) for p in pairs]
        correct_all += correct
        total_all += len(pairs)
    return {
        "method": "pseudo-log-likelihood" if loaded.kind == ModelKind.MASKED else "sum of token log-probs",
        "files": files,
        "pairs": total_all,
        "correct": correct_all,
        "accuracy": correct_all / total_all if total_all else None,
        "mean_file_accuracy": sum(f["accuracy"] for f in files.values()) / len(files) if files else None,
        "limit": limit,
    }


def sentence_log_likelihoods(
    loaded: LoadedModel, sentences: Sequence[str], *, batch_size: int = 32, tokenizer=None
) -> list[float]:
    """log P(sentence) for causal LMs (after BOS), pseudo-log-likelihood for masked LMs."""
    tokenizer = tokenizer or _lm_tokenizer(loaded, "sentence scoring")
    masked = loaded.kind == ModelKind.MASKED
    prefix, suffix = _wrap_ids(tokenizer, masked)
    rows, targets = [], []  # one row per forward; targets: (sentence, position, true id)
    for index, sentence in enumerate(sentences):
        ids = prefix + _encode(tokenizer, sentence) + suffix
        if masked:
            for pos in range(len(prefix), len(ids) - len(suffix)):
                rows.append(ids[:pos] + [tokenizer.mask_token_id] + ids[pos + 1 :])
                targets.append([(index, pos, ids[pos])])
        else:
            rows.append(ids)
            targets.append([(index, pos, ids[pos]) for pos in range(1, len(ids))])
    totals = [0.0] * len(sentences)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        width = max(len(r) for r in batch)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in batch])  # right padding
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in batch])
        logprobs = _log_probs(loaded, ids, mask)
        for row, wanted in enumerate(targets[start : start + batch_size]):
            for index, pos, token in wanted:
                # causal: the token at pos is predicted at pos - 1; masked: at the masked pos itself
                totals[index] += float(logprobs[row, pos if masked else pos - 1, token])
    return totals


# ---- ICL models -------------------------------------------------------------------------------------


def icl_error_by_sigma(
    loaded: LoadedModel | Any, *, sigmas: Sequence[float] = ICL_SIGMAS,
    outliers: Sequence[tuple[float, int]] = ICL_OUTLIERS, length: int = ICL_POINTS,
    prompts: int = ICL_PROMPTS, seed: int = SEED,
) -> dict[str, Any]:  # fmt: skip
    """ICL error in distribution (σ = 1), under σ shift, and with one planted outlier (at σ = 1),
    at one prompt ``length`` (points), via :func:`ssacli.icl.evaluate`."""
    from ..icl.evaluate import evaluate
    from ..models.icl_task import CLASSIFICATION

    model = loaded.model if isinstance(loaded, LoadedModel) else loaded
    if not hasattr(model, "spec"):
        raise UsageError("ICL error needs an ssacli ICL model (e.g. builtin:every-softmax)")
    sigmas = tuple(dict.fromkeys((1.0, *(float(s) for s in sigmas))))  # σ = 1 is the reference
    common = dict(lengths=(length,), prompts=prompts, seed=seed)
    plain = evaluate(model, sigmas=sigmas, **common)
    planted = evaluate(model, sigmas=(1.0,), outliers=tuple(outliers), **common) if outliers else []
    classify = model.spec.task in CLASSIFICATION

    def cell(c) -> dict[str, Any]:
        out = {"sigma": c.sigma, "error": c.error}
        out["position_error" if classify else "normalized_error"] = (
            c.position_error if classify else c.normalized_error
        )
        if c.outlier is not None:
            out.update(outlier=c.outlier, position=c.outlier_position)
        return out

    return {
        "task": model.spec.task,
        "scorer": model.spec.scorer,
        "metric": "sequence error rate" if classify else "mse",
        "headline": "error" if classify else "normalized_error",  # the number that compares across σ
        "length": length,
        "prompts": prompts,
        "seed": seed,
        "in_distribution": cell(plain[0]),
        "sigma": [cell(c) for c in plain],
        "outliers": [cell(c) for c in planted],
    }


__all__ = [
    "icl_error_by_sigma",
    "language_model_loss",
    "minimal_pairs",
    "output_kl",
    "sentence_log_likelihoods",
]
