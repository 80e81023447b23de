"""``ssacli.diagnose``: run the probes over a model and reduce every attention row as it passes.

(This module is named ``diagnosis`` so that importing it does not shadow the function.)

Two routes to the weights, one reduction (ssacli.metrics):

* ``ssacli``: models on transformers' attention registry run through ssacli's attention function
  (softmax for an untouched model, exact to the eager path), which streams each call's weights to
  a :class:`Recorder` in query blocks; logit probes act inside that call.
* ``eager-fallback``: families off the registry (gpt_neo, bloom, deberta-v2, …) run their own
  eager attention; a forward hook on each attention module reduces its weights and drops them, so
  at most one layer's map exists at a time. Logit probes need the first route and are skipped.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import __version__
from .attention import (
    CONFIG_SPEC_ATTR,
    SCORER_ATTR,
    _num_heads,
    apply_scorer,
    attention_modules,
    observing,
    restore,
    scorers_of,
    supports,
)
from .errors import UnsupportedModelError, UsageError
from .loading import DEFAULT_MODEL, LoadedModel, _kind, _max_positions, load_model
from .metrics import DEFAULT_TAU, DEFAULT_TOP_K, HeadStats, row_sums
from .probes import (
    Batch,
    Probe,
    TokenSource,
    default_probes,
    icl_batches,
    icl_tokens,
    numeric_sequences,
    pad_sequences,
    parse_probe,
    pick_targets,
)
from .results import METRICS, DiagnoseResult, ProbeResult

DEFAULT_SAMPLES = 8
DEFAULT_LENGTH = 64  # tokens; ICL models: points (each point is two tokens)
DEFAULT_ICL_POINTS = 40
DEFAULT_BLOCK = 256
Progress = Callable[[str, int, int], None]  # (what, done, total)


class Recorder:
    """The :class:`ssacli.attention.Observer` of one probe level: applies the logit probe and keeps
    per-layer :class:`HeadStats`."""

    def __init__(self, layer_of: dict[int, int], *, tau: float, top_k: int, block_size: int, causal: bool):
        self.layer_of = layer_of
        self.tau, self.top_k, self.block_size, self.causal = tau, top_k, block_size, causal
        self.stats: dict[int, HeadStats] = {}
        self.alpha = 1.0  # logit-scale
        self.dominant = 0.0  # dominant-key M
        self.valid: torch.Tensor | None = None  # [b, t] real tokens of the current batch
        self.target: torch.Tensor | None = None  # [b] target token of the current batch

    def transform(self, logits: torch.Tensor, module: nn.Module) -> torch.Tensor:
        if self.alpha != 1.0:
            logits = logits * self.alpha
        if self.dominant and self.target is not None:
            k = logits.shape[-1]
            bump = F.one_hot(self.target.to(logits.device), k).to(logits.dtype) * self.dominant
            logits = logits + bump.reshape(-1, 1, 1, k)
        return logits

    def record(self, module, weights, visible, query_positions) -> None:
        layer = self.layer_of.get(id(module))
        if layer is None:
            return
        k = weights.shape[-1]
        valid = target = None
        if self.valid is not None and self.valid.shape[-1] == k:  # keys are this batch's tokens
            valid = self.valid.to(weights.device)[:, query_positions]
            target = self.target
        sums = row_sums(
            weights, visible, query_valid=valid, query_positions=query_positions,
            target=target, tau=self.tau, top_k=self.top_k,
        )  # fmt: skip
        if layer not in self.stats:
            self.stats[layer] = HeadStats(weights.shape[1])
        self.stats[layer].add(sums)

    def fallback_hook(self, module, args, output):
        """Forward hook for eager-fallback attention modules: reduce the weights, then drop them."""
        if not isinstance(output, tuple):
            return None
        for index, item in enumerate(output):
            if isinstance(item, torch.Tensor) and item.dim() == 4 and item.is_floating_point():
                q, k = item.shape[-2:]
                positions = torch.arange(k - q, k, device=item.device)
                visible = self._structural_mask(module, item, positions)
                self.record(module, item, visible, positions)
                return (*output[:index], None, *output[index + 1 :])
        return None

    def _structural_mask(self, module: nn.Module, weights: torch.Tensor, positions: torch.Tensor):
        """Which keys each row may see: the module's own causal/local-window buffer when it has one
        (GPT-Neo's ``bias``), else causal by family; and the batch's key padding."""
        k = weights.shape[-1]
        visible = torch.ones(1, 1, len(positions), k, dtype=torch.bool, device=weights.device)
        buffer = getattr(module, "bias", None)
        if isinstance(buffer, torch.Tensor) and buffer.dtype == torch.bool and buffer.dim() == 4:
            if buffer.shape[-1] >= k:
                visible = visible & buffer[:, :, positions, :k].to(weights.device)
        elif self.causal:
            visible = visible & (torch.arange(k, device=weights.device) <= positions.unsqueeze(-1))
        if self.valid is not None and self.valid.shape[-1] == k:
            visible = visible & self.valid.to(weights.device)[:, None, None, :]
        return visible


def diagnose(
    model: str | Path | nn.Module | LoadedModel = DEFAULT_MODEL,
    probes: Sequence[str | Probe] | None = None,
    *,
    scorer: str | None = None,
    text: str | None = None,
    random_ids: bool = False,
    inputs: Sequence[Sequence[int]] | None = None,
    tokenizer: Any = None,
    samples: int = DEFAULT_SAMPLES,
    length: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
    tau: float = DEFAULT_TAU,
    top_k: int = DEFAULT_TOP_K,
    block_size: int = DEFAULT_BLOCK,
    device: str = "auto",
    dtype: str = "auto",
    allow_download: bool = False,
    allow_pickle: bool = False,
    progress: Progress | None = None,
) -> DiagnoseResult:
    """Probe ``model`` and return per probe level × layer × head saturation metrics.

    ``model``: a path, ``builtin:NAME``, cached Hub id, a transformers model or an ICL model.
    ``probes``: specs such as ``"embed-scale:1,4,16"`` (default: every probe that applies).
    ``scorer``: re-score the model's attention with this spec first (e.g. ``"ssa:init=faithful"``).
    Inputs: the built-in texts, ``text`` (a string), ``random_ids``, or ``inputs`` (token-id lists of
    any lengths; batches are padded and padding is excluded from every metric).
    """
    started = time.perf_counter()
    for name, value, low in (
        ("samples", samples, 1),
        ("batch_size", batch_size, 1),
        ("block_size", block_size, 1),
    ):
        if value < low:
            raise UsageError(f"{name.replace('_', '-')} must be >= {low}, got {value}")
    if not 0 < tau <= 1:
        raise UsageError(f"tau must be in (0, 1], got {tau}")
    if top_k < 1:
        raise UsageError(f"top-k must be >= 1, got {top_k}")
    probe_list = [p if isinstance(p, Probe) else parse_probe(p) for p in (probes or default_probes())]
    names = [p.name for p in probe_list]
    if len(set(names)) != len(names):
        raise UsageError("each probe may be given once; put all its levels in one --probe NAME:L1,L2")
    opts = {
        "text": text, "random_ids": random_ids, "inputs": inputs, "samples": samples, "length": length,
        "batch_size": batch_size, "seed": seed, "tau": tau, "top_k": top_k, "block_size": block_size,
    }  # fmt: skip
    loaded = _as_loaded(model, tokenizer, device, dtype, allow_download, allow_pickle)
    root = loaded.attention_root
    route = "ssacli" if supports(root) else "eager-fallback"
    if route == "eager-fallback" and scorer is not None:
        raise UnsupportedModelError(
            f"model family '{loaded.family}' does not route attention through transformers' "
            "AttentionInterface, so --scorer cannot be applied; diagnose it without --scorer"
        )
    training = loaded.model.training
    loaded.model.eval()
    undo = _prepare_scorer(root, scorer) if route == "ssacli" else None
    try:
        return _run(loaded, probe_list, route, opts, started, progress)
    finally:
        if undo is not None:
            undo()
        loaded.model.train(training)


def _as_loaded(model, tokenizer, device, dtype, allow_download, allow_pickle) -> LoadedModel:
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, str | Path):
        loaded = load_model(
            str(model), device=device, dtype=dtype, allow_download=allow_download, allow_pickle=allow_pickle
        )
        if tokenizer is not None:
            loaded.tokenizer = tokenizer
        return loaded
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a path, a model id or a torch module, got {type(model).__name__}")
    spec = getattr(model, "spec", None)
    if spec is not None and hasattr(model, "backbone"):  # an ICL model
        return LoadedModel(model, "ICLModel", "icl-gpt2", "icl", None, 2 * spec.max_points)
    config = getattr(model, "config", None)
    if config is None:
        raise UsageError("model must be a transformers model (with .config) or an ssacli ICL model")
    return LoadedModel(
        model, getattr(config, "name_or_path", "") or type(model).__name__, config.model_type,
        _kind(model), tokenizer, _max_positions(config),
    )  # fmt: skip


def _prepare_scorer(root: nn.Module, scorer: str | None) -> Callable[[], None] | None:
    """Route the model through ssacli's attention function; returns how to put it back."""
    before = scorers_of(root)
    if before and scorer is None:
        return None  # already scored (an ICL or converted model): measure it as it is
    spec_before = getattr(root.config, CONFIG_SPEC_ATTR, None)
    apply_scorer(root, scorer or spec_before or "softmax")

    def undo() -> None:
        if not before:
            restore(root)
            return
        modules = dict(attention_modules(root))
        for name, old in before.items():
            setattr(modules[name], SCORER_ATTR, old)
        setattr(root.config, CONFIG_SPEC_ATTR, spec_before)

    return undo


def _attention_layers(root: nn.Module, route: str) -> list[tuple[str, nn.Module]]:
    if route == "ssacli":
        return list(attention_modules(root))
    # Innermost modules named *Attention*: the ones that compute the weights.
    found = []
    for name, module in root.named_modules():
        if "Attention" in type(module).__name__ and not any(
            "Attention" in type(m).__name__ for m in list(module.modules())[1:]
        ):
            found.append((name, module))
    if not found:
        raise UnsupportedModelError(
            f"found no attention layers in model family '{getattr(root.config, 'model_type', '?')}'"
        )
    return found


def _run(
    loaded: LoadedModel, probes: list[Probe], route: str, opts: dict, started: float, progress
) -> DiagnoseResult:
    root = loaded.attention_root
    layers = _attention_layers(root, route)
    layer_of = {id(m): i for i, (_, m) in enumerate(layers)}
    heads = [_layer_heads(m, root, route) for _, m in layers]
    icl = loaded.kind == "icl"
    length = opts["length"] or (DEFAULT_ICL_POINTS if icl else DEFAULT_LENGTH)
    source = None
    if not icl and opts["inputs"] is None:
        vocab = getattr(root.config, "vocab_size", None) or 2
        source = TokenSource(
            loaded.tokenizer,
            text=opts["text"],
            random_ids=opts["random_ids"],
            vocab_size=vocab,
            seed=opts["seed"],
        )
    plans = [(p, _plan(p, loaded, route, source, length, opts)) for p in probes]
    total = sum(len(batches) for _, plan in plans for batches, _ in plan.values() if batches)
    done = 0
    results = []
    for probe, plan in plans:
        metrics = {name: np.full((len(probe.levels), len(layers), max(heads)), np.nan) for name in METRICS}
        rows = np.zeros((len(probe.levels), len(layers)), dtype=np.int64)
        extras: dict[str, list[float | None]] = {}
        note = None
        for li, level in enumerate(probe.levels):
            batches, why = plan[level]
            if batches is None:
                note = why
                continue
            note = note or why
            recorder = Recorder(
                layer_of, tau=opts["tau"], top_k=opts["top_k"], block_size=opts["block_size"],
                causal=loaded.kind == "causal",
            )  # fmt: skip
            totals: dict[str, list[float]] = {}
            for batch in batches:
                for key, (value, count) in _forward(
                    loaded, route, probe, level, batch, recorder, layers
                ).items():
                    acc = totals.setdefault(key, [0.0, 0.0])
                    acc[0] += value
                    acc[1] += count
                done += 1
                if progress is not None:
                    progress(f"{probe.name} {level:g}", done, total)
            for key, (value, count) in totals.items():
                extras.setdefault(key, [None] * len(probe.levels))[li] = value / count if count else None
            for layer, stats in recorder.stats.items():
                means = stats.means()
                for name in METRICS:
                    metrics[name][li, layer, : stats.num_heads] = means[name]
                rows[li, layer] = stats.rows
        results.append(ProbeResult(probe.name, [float(v) for v in probe.levels], metrics, rows, extras, note))
    return DiagnoseResult(
        model=loaded.name,
        family=loaded.family,
        scorer=getattr(root.config, CONFIG_SPEC_ATTR, None) or "softmax",
        route=route,
        layers=[name for name, _ in layers],
        heads=heads,
        probes=results,
        settings={
            **{k: opts[k] for k in ("seed", "tau", "top_k", "samples", "batch_size", "block_size")},
            "length": length,
            "length_unit": "points" if icl else "tokens",
            "inputs": _describe_inputs(loaded, source, opts),
            "device": str(loaded.device),
            "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
        },
        versions=_versions(),
        elapsed_s=time.perf_counter() - started,
    )


def _layer_heads(module: nn.Module, root: nn.Module, route: str) -> int:
    try:
        return _num_heads(module, root)
    except UnsupportedModelError:
        return int(getattr(root.config, "num_attention_heads", 1) or 1)


def _plan(probe: Probe, loaded: LoadedModel, route: str, source, length: int, opts: dict) -> dict:
    """level -> (batches or None, note): the inputs each level runs on, or why it cannot run."""
    kind = probe.kind
    skip = None
    if kind.needs_route and route != "ssacli":
        skip = f"needs ssacli's attention function; family '{loaded.family}' runs on the eager fallback"
    elif kind.needs_tokenizer and loaded.tokenizer is None:
        skip = (
            "needs a tokenizer (the model folder has none)" if loaded.kind != "icl" else "not for ICL models"
        )
    elif probe.name == "length" and opts["inputs"] is not None:
        skip = "not run on explicit inputs (their lengths are given)"
    if skip:
        return {level: (None, skip) for level in probe.levels}
    # Longest input the model's position table covers (ICL: in points, two tokens each).
    cap = loaded.max_positions
    if cap and loaded.kind == "icl":
        cap //= 2
    unit = "points" if loaded.kind == "icl" else "positions"
    plan, note = {}, None
    for level in probe.levels:
        size = int(length * level) if probe.name == "length" else length
        if cap and size > cap:
            size, note = cap, f"inputs capped at the model's {cap} {unit}"
        batches = _inputs(probe, level, loaded, source, size, opts)
        if cap and any(b.input_ids is not None and b.input_ids.shape[1] > cap for b in batches):
            batches = [_truncate(b, cap) for b in batches]
            note = f"inputs truncated to the model's {cap} {unit}"
        if kind.has_target:
            pick_targets(batches, opts["seed"])
        plan[level] = (batches, note)
    return plan


def _truncate(batch: Batch, cap: int) -> Batch:
    """Keep the first ``cap`` tokens (batches are right-padded, so real tokens come first)."""
    return Batch(input_ids=batch.input_ids[:, :cap], attention_mask=batch.attention_mask[:, :cap])


def _inputs(probe: Probe, level: float, loaded: LoadedModel, source, size: int, opts: dict) -> list[Batch]:
    samples, batch_size, seed = opts["samples"], opts["batch_size"], opts["seed"]
    if loaded.kind == "icl":
        return icl_batches(loaded.model.spec.task, samples, size, batch_size, seed)
    pad = _pad_id(loaded)
    side = "right"  # one forward, no generation: real tokens keep positions 0..n-1 and key 0 (the sink)
    if probe.name == "numeric":
        return pad_sequences(
            numeric_sequences(loaded.tokenizer, int(level), samples, seed), pad, batch_size, side
        )
    if opts["inputs"] is not None:
        return pad_sequences([list(s) for s in opts["inputs"]], pad, batch_size, side)
    return pad_sequences(source.sequences(samples, size), pad, batch_size, side)


def _pad_id(loaded: LoadedModel) -> int:
    for owner in (loaded.tokenizer, loaded.config):
        value = getattr(owner, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return 0


def _forward(loaded, route, probe, level, batch, recorder, layers) -> dict[str, tuple[float, float]]:
    """Run one batch under the probe; returns extras as (sum, count), e.g. the LM loss."""
    recorder.valid = batch.valid
    recorder.target = batch.target
    recorder.alpha = level if probe.name == "logit-scale" else 1.0
    recorder.dominant = level if probe.name == "dominant-key" else 0.0
    device = loaded.device
    hooks = []
    if route == "eager-fallback":
        hooks = [m.register_forward_hook(recorder.fallback_hook) for _, m in layers]
    try:
        with torch.inference_mode(), observing(recorder):
            if loaded.kind == "icl":
                return _icl_forward(loaded, probe, level, batch, device)
            if probe.name in ("embed-scale", "outlier") and level != 1:
                hooks.append(_embedding_hook(loaded, probe.name, level, batch.target))
            return _hf_forward(loaded, route, batch, device)
    finally:
        for hook in hooks:
            hook.remove()


def _embedding_hook(loaded: LoadedModel, name: str, level: float, target: torch.Tensor):
    try:
        embedding = loaded.attention_root.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        embedding = None
    if embedding is None:
        raise UnsupportedModelError(f"model family '{loaded.family}' exposes no input embeddings to scale")

    def scale(module, args, output):
        if name == "embed-scale":
            return output * level
        output = output.clone()
        rows = torch.arange(output.shape[0], device=output.device)
        output[rows, target.to(output.device)] *= level
        return output

    return embedding.register_forward_hook(scale)


def _hf_forward(loaded: LoadedModel, route: str, batch: Batch, device) -> dict[str, tuple[float, float]]:
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if loaded.kind == "seq2seq":
        kwargs.update(decoder_input_ids=ids, decoder_attention_mask=mask)
    if loaded.kind in ("causal", "seq2seq"):
        kwargs["use_cache"] = False
    if route == "eager-fallback":
        kwargs["output_attentions"] = True  # some eager paths only compute weights when asked
    out = loaded.model(**kwargs)
    logits = getattr(out, "logits", None)
    if loaded.kind != "causal" or logits is None or logits.shape[:2] != ids.shape:
        return {}
    keep = (mask[:, 1:] * mask[:, :-1]).bool()
    losses = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    losses = losses.view_as(keep)[keep]
    return {"loss": (float(losses.sum()), float(losses.numel()))}


def _icl_forward(loaded: LoadedModel, probe: Probe, level: float, batch: Batch, device) -> dict:
    from .icl.evaluate import FIRST_SCORED

    model = loaded.model
    xs = batch.xs.clone()
    if probe.name == "embed-scale":
        xs = xs * level
    elif probe.name == "outlier":
        xs[torch.arange(xs.shape[0]), batch.target // 2] *= level
    tokens, ys = icl_tokens(model.spec.task, xs, batch.coef)
    dtype = next(model.parameters()).dtype
    predictions = model(tokens.to(device, dtype)).float().cpu()
    scored = slice(FIRST_SCORED - 1, None)
    if model.spec.task == "linear":
        errors = (predictions[:, scored] - ys[:, scored]) ** 2
    else:
        errors = (torch.sign(predictions[:, scored]) != ys[:, scored]).float()
    return {"error": (float(errors.sum()), float(errors.numel()))}


def _describe_inputs(loaded: LoadedModel, source, opts: dict) -> str:
    if loaded.kind == "icl":
        return f"icl:{loaded.model.spec.task} prompts (seed {opts['seed']})"
    if opts["inputs"] is not None:
        return f"{len(opts['inputs'])} given sequences"
    return source.description


def _versions() -> dict[str, str]:
    import transformers

    return {
        "ssacli": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
