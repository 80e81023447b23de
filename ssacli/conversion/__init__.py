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
from torch import nn
from torch.nn import functional as F

from ..attention.interface import (
    CONFIG_SPEC_ATTR,
    apply_scorer,
    attention_modules,
    observing,
    scorers_of,
    supports,
)
from ..defaults import CALIBRATION_LENGTH, CALIBRATION_SAMPLES, MAX_KL_PER_TOKEN, MAX_RELATIVE_ERROR
from ..errors import JobFailedError, OutputError, UnsupportedModelError, UsageError
from ..models.checkpoint import SCORER_KEY, write_model_folder
from ..models.loading import LoadedModel, load_model
from ..scorers import make_scorer
from ..scorers.base import positive_raw

# m=auto searches powers of two: 1 … 2^20 (b = 1/m stays far above the positive floor of 1e-9).
M_GRID = tuple(2.0**k for k in range(21))

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
        from ..models.icl import save_icl  # transformers' GPT-2 is imported only for ICL models

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
    samples: int = CALIBRATION_SAMPLES,
    length: int = CALIBRATION_LENGTH,
    seed: int = 0,
    text: str | None = None,
    max_error: float | None = None,
    device: str = "auto",
    dtype: str = "auto",
    allow_download: bool = False,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> tuple[LoadedModel, dict[str, Any]]:
    """Swap every attention layer's scorer for ``scorer``; return the model and its fidelity.

    Fidelity compares the model's outputs before and after the swap on the same inputs
    (:func:`fidelity`): ``samples`` windows of ``length`` tokens from ``text`` (the calibration
    text; None: the built-in probe texts). ``max_error`` is the target (None: 1e-3 nats/token for
    models with a vocabulary, 1e-2 relative error otherwise, :func:`target_of`). With
    ``ssa:init=faithful`` and ``m=auto`` (its default) m is chosen per layer so the measured error
    meets the target (:func:`choose_m`); if no m on the grid does, JobFailedError (exit 5) and
    nothing is written. With ``out``, the converted model is saved there (never over the input).
    A MODEL reference is loaded with ``device`` … ``trust_remote_code``
    (:class:`~ssacli.models.loading.LoadOptions`).
    """
    if max_error is not None and not (0 < max_error < float("inf")):
        raise UsageError(f"--max-error must be a positive number, got {max_error}")
    auto = _is_auto(make_scorer(scorer))  # a bad spec fails before loading
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
    batches = _fidelity_inputs(loaded, samples, length, seed, text)
    before_spec = _spec_of(loaded)
    if not any(SCORER_KEY in k for k in loaded.model.state_dict()) and before_spec == "softmax":
        apply_scorer(root, "softmax")  # measure "before" through the same attention function
    before = _outputs(loaded, batches)
    grid = attention_row_kl(loaded, batches) if auto else None
    apply_scorer(root, scorer)
    if grid is not None:
        after, report = choose_m(loaded, batches, before, grid, max_error)
    else:
        after = _outputs(loaded, batches)
        report = fidelity(loaded.kind, before, after, batches)
        metric, target = target_of(report, max_error)
        report["target"] = {"metric": metric, "max": target, "met": bool(report[metric] <= target)}
    report = {"from": before_spec, "to": _spec_of(loaded), **report}
    report["calibration"] = {
        "text": "--text file" if text is not None else "built-in probe texts",
        "samples": samples,
        "length": length,
        "seed": seed,
    }
    if out is not None:
        source = str(loaded.path or loaded.name)
        save_model(loaded, out, meta={"source": source, "fidelity": report}, overwrite=overwrite)
    return loaded, report


# ---- m=auto: the smallest faithful m that meets the fidelity target ----------------------------------


def _is_auto(scorer) -> bool:
    """``ssa:init=faithful`` with m=auto (its default) and no explicit b or n."""
    given = scorer.given
    return (
        scorer.name == "ssa"
        and scorer.opts["init"] == "faithful"
        and given.get("m", "auto") == "auto"
        and not {"b", "n"} & set(given)
    )


def target_of(report: dict[str, Any], max_error: float | None = None) -> tuple[str, float]:
    """(metric, target): KL per token (per prediction for ICL sign models) where the output is a
    distribution, else the relative error; the target is ``max_error`` or the default for it."""
    if "kl_per_token" in report:
        return "kl_per_token", MAX_KL_PER_TOKEN if max_error is None else max_error
    return "relative_error", MAX_RELATIVE_ERROR if max_error is None else max_error


def faithful_transform(x: torch.Tensor, m: float) -> torch.Tensor:
    """t(x) of SSA with b = 1/m, n = m: m·sgn(x)·log1p(|x|/m) ≈ x − sgn(x)·x²/2m."""
    return m * torch.sign(x) * torch.log1p(x.abs() / m)


class _RowKL:
    """An observer (ssacli.attention.interface.Observer) that, while the model runs with softmax,
    measures for every layer and every m of the grid the mean KL(softmax ‖ faithful SSA) of its
    attention rows, and the largest |logit| it sees."""

    block_size = 1 << 30  # one block: the whole row set of a call

    def __init__(self, modules: list[nn.Module], grid: tuple[float, ...]) -> None:
        self.index = {id(m): i for i, m in enumerate(modules)}
        self.grid = grid
        self.kl = torch.zeros(len(modules), len(grid), dtype=torch.float64)
        self.rows = torch.zeros(len(modules), dtype=torch.float64)
        self.max_abs = torch.zeros(len(modules), dtype=torch.float64)
        self.logits: torch.Tensor | None = None

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        self.logits = logits
        return logits

    def record(self, module, weights, visible, query_positions) -> None:
        layer = self.index.get(id(module))
        if layer is None or self.logits is None:
            return
        x = self.logits.double()
        seen = torch.ones_like(x, dtype=torch.bool) if visible is None else visible.expand_as(x)
        live = seen.any(-1)  # rows with at least one visible key
        x = x.masked_fill(~seen, 0.0)
        log_p = torch.log_softmax(x.masked_fill(~seen, float("-inf")), -1)
        p = log_p.exp()
        for g, m in enumerate(self.grid):
            log_q = torch.log_softmax(faithful_transform(x, m).masked_fill(~seen, float("-inf")), -1)
            row = torch.where(seen, p * (log_p - log_q), 0.0).sum(-1)
            self.kl[layer, g] += float(row[live].sum())
        self.rows[layer] += float(live.sum())
        self.max_abs[layer] = max(float(self.max_abs[layer]), float(x.abs().max()))
        self.logits = None

    def mean_kl(self) -> torch.Tensor:
        """[layers, grid]: mean row KL per layer at each m."""
        return (self.kl / self.rows.clamp_min(1).unsqueeze(1)).clamp_min(0.0)


@torch.inference_mode()
def attention_row_kl(loaded: LoadedModel, batches: list, grid: tuple[float, ...] = M_GRID) -> _RowKL:
    """Run the model (with its softmax scorer attached) on ``batches`` and measure, per attention
    layer, the mean attention-row KL(softmax ‖ SSA faithful with m) for every m of ``grid``."""
    modules = [m for _, m in attention_modules(loaded.attention_root)]
    observer = _RowKL(modules, grid)
    with observing(observer):
        _outputs(loaded, batches)
    return observer


@torch.no_grad()
def set_faithful_m(root: nn.Module, ms: list[float]) -> None:
    """b = 1/m, n = m in every head of layer i's SSA scorer, for m = ms[i]."""
    scorers = list(scorers_of(root).values())
    for scorer, m in zip(scorers, ms, strict=True):
        scorer.b_raw.fill_(positive_raw(1.0 / m, "ssa", "b"))
        scorer.n_raw.fill_(positive_raw(m, "ssa", "n"))


def choose_m(
    loaded: LoadedModel, batches: list, before: list[torch.Tensor], rows: _RowKL, max_error: float | None
) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """Per layer, the smallest m on the grid that keeps the model's measured error within target.

    The attention-row KL of each layer at each m (``rows``) ranks the layers: for a budget β, layer
    i gets the smallest m whose row KL is ≤ β / layers. The end-to-end error (:func:`fidelity` on
    the model's outputs) is then measured for β = β0·4^k, and the largest β that meets the target is
    kept (k goes up from 0 while the target holds, down until it does). β0 is the target itself
    (KL) or its square (relative error, which grows like the square root of a KL). If even m =
    2^20 in every layer misses the target, JobFailedError (exit 5).
    """
    root = loaded.attention_root
    layer_kl = rows.mean_kl()
    layers, grid = layer_kl.shape[0], rows.grid
    cache: dict[tuple[float, ...], tuple[list[torch.Tensor], dict[str, Any]]] = {}

    def evaluate(ms: tuple[float, ...]):
        if ms not in cache:
            set_faithful_m(root, list(ms))
            after = _outputs(loaded, batches)
            cache[ms] = (after, fidelity(loaded.kind, before, after, batches))
        return cache[ms]

    def ms_for(beta: float) -> tuple[float, ...]:
        chosen = []
        for i in range(layers):
            ok = [g for g in range(len(grid)) if float(layer_kl[i, g]) <= beta / layers]
            chosen.append(grid[ok[0]] if ok else grid[-1])
        return tuple(chosen)

    first = evaluate(ms_for(float("inf")))[1]  # m = 1 everywhere: only to learn the metric
    metric, target = target_of(first, max_error)
    base = target if metric == "kl_per_token" else target**2

    def passes(ms):
        return evaluate(ms)[1][metric] <= target

    best, k, evaluations = None, 0, []
    ms = ms_for(base)
    evaluations.append(ms)
    if passes(ms):
        best = ms
        while k < 40:
            k += 1
            candidate = ms_for(base * 4.0**k)
            if candidate == best:
                continue
            if all(m == grid[0] for m in best):
                break
            evaluations.append(candidate)
            if not passes(candidate):
                break
            best = candidate
            if all(m == grid[0] for m in best):
                break
    else:
        while k > -60:
            k -= 1
            candidate = ms_for(base * 4.0**k)
            if candidate not in cache:
                evaluations.append(candidate)
            if passes(candidate):
                best = candidate
                break
            if all(m == grid[-1] for m in candidate):
                break
        if best is None:
            top = tuple(grid[-1] for _ in range(layers))
            error = evaluate(top)[1][metric]
            dtype = next(loaded.model.parameters()).dtype
            why = (
                f"the model runs in {str(dtype).removeprefix('torch.')}, whose rounding alone exceeds it; "
                "convert with --dtype float32, "
                if dtype != torch.float32
                else ""
            )
            raise JobFailedError(
                f"m=auto cannot meet the fidelity target: {metric.replace('_', ' ')} {error:.3g} > "
                f"{target:g} even with m = {grid[-1]:g} in every layer; {why}raise --max-error, or give "
                "an explicit m= and --finetune to recover the rest; nothing was written"
            )
    after, report = evaluate(best)
    set_faithful_m(root, list(best))
    grid_index = {m: g for g, m in enumerate(grid)}
    per_layer = []
    for i, (name, _) in enumerate(attention_modules(root)):
        m, peak = best[i], float(rows.max_abs[i])
        per_layer.append({
            "layer": i,
            "module": name,
            "m": m,
            "attention_kl": float(layer_kl[i, grid_index[m]]),
            "max_abs_logit": round(peak, 4),
            # how far SSA moves the largest logit seen: x − t(x) ≈ x²/2m
            "shift_at_max": round(peak - float(faithful_transform(torch.tensor(peak).double(), m)), 6),
        })  # fmt: skip
    report = {
        **report,
        "target": {"metric": metric, "max": target, "met": True},
        "m_auto": {"grid": [grid[0], grid[-1]], "evaluations": len(evaluations), "budget_scale": 4.0**k},
        "layers": per_layer,
    }
    return after, report


def _fidelity_inputs(
    loaded: LoadedModel, samples: int, length: int, seed: int, text: str | None = None
) -> list:
    from ..diagnosis.probes import TokenSource, icl_batches, icl_tokens, pad_sequences

    if loaded.kind == "icl":
        task = loaded.model.spec.task
        return [
            icl_tokens(task, b.xs, b.coef)[0] for b in icl_batches(task, samples, length // 2 or 1, 8, seed)
        ]
    vocab = getattr(loaded.config, "vocab_size", None) or 2
    if loaded.max_positions:
        length = min(length, loaded.max_positions)
    source = TokenSource(loaded.tokenizer, text=text, random_ids=False, vocab_size=vocab, seed=seed)
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
