"""`ssacli.toml`: reading the ``[check]`` table (merged with explicit settings by
:func:`ssacli.check.settings.check_settings`), and the commented file ``ssacli check --init`` writes,
with requirements measured on a model (:func:`write_check_config`; templates for ICL models vs
transformers language models and encoders). Cheap to import (no torch): the CLI reads
:data:`CONFIG_FILE` for its help."""

from __future__ import annotations

import json
import math
import os
import statistics
import tomllib
from pathlib import Path
from typing import Any

from ..defaults import DEFAULT_MODEL, SAMPLES, SEED
from ..errors import InputError, UsageError
from ..files import check_writable, write_text
from ..models.kinds import KINDS, ModelKind, family_kind

CONFIG_FILE = "ssacli.toml"  # what check reads from the working folder when no config is given

CONFIG_KEYS: dict[str, tuple[type, ...]] = {
    "model": (str,), "requires": (list,), "baseline": (str,), "max_regression": (int, float),
    "samples": (int,), "seed": (int,), "length": (int,), "tau": (int, float), "scorer": (str,),
    "random_ids": (bool,), "device": (str,), "dtype": (str,), "device_map": (str,),
    "max_memory": (str, list),
}  # fmt: skip


def load_config(path: str | Path) -> dict[str, Any]:
    """The ``[check]`` table of an ssacli.toml, validated; paths are relative to the file's folder."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"config '{path}' does not exist; write one with `ssacli check --init`") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read config '{path}': {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"config '{path}' is not valid TOML: {err}") from None
    table = data.get("check", {})
    if not isinstance(table, dict):
        raise UsageError(f"config '{path}': [check] must be a table")
    config: dict[str, Any] = {}
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            raise UsageError(
                f"config '{path}': unknown key '{key}' in [check]; valid: {', '.join(CONFIG_KEYS)}"
            )
        kinds = CONFIG_KEYS[key]
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise UsageError(f"config '{path}': '{key}' must be {' or '.join(k.__name__ for k in kinds)}")
        if key == "requires" and not all(isinstance(v, str) for v in value):
            raise UsageError(f"config '{path}': 'requires' must be a list of strings")
        config[key] = value
    if "baseline" in config:
        config["baseline"] = str(path.parent / config["baseline"])
    model = config.get("model")
    if model and not model.startswith("builtin:") and (path.parent / model).exists():
        config["model"] = str(path.parent / model)
    return config


def same_model(a: str, b: str) -> bool:
    """Whether two MODEL references name the same model: the same folder when both are local paths
    (``./m`` and ``m/`` are one model), else the same string (builtin:NAME, a Hub id)."""
    if a == b:
        return True
    local = [Path(x).expanduser() for x in (a, b) if not x.startswith("builtin:")]
    if len(local) == 2 and all(p.exists() for p in local):
        return local[0].resolve() == local[1].resolve()
    return False


_TEMPLATE = """\
# ssacli.toml: attention-saturation requirements that `ssacli check` enforces (docs/ci.md).
# Written by `ssacli check --init` for {what}.
# A requirement: METRIC@PROBE:LEVEL[layer=A-B,head=H] [mean|max|min] OP VALUE (OP: <= < >= > ==).
# mean (the default) averages every head once; max / min is the worst / best single head.
# check runs only the probe levels named below. Command-line flags override this file.

[check]
model = {model}
samples = {samples}  # inputs per probe level
seed = {seed}     # the same seed gives the same inputs, so runs and baselines stay comparable
{random}requires = [
{requires}]

# Regression gate: compare with an earlier `ssacli check --json` (or `diagnose --json`) file and
# fail when a metric moves towards saturation by more than max_regression (absolute).
# baseline = "ssacli-baseline.json"
# max_regression = 0.05
"""
# Values quoted for the bundled models are `ssacli diagnose` model means (or worst heads, for max)
# at seeds 0-2 with 8 samples, the settings the template writes.
_REQUIRES = {
    "icl": """\
    # One x value 1000x the others: no head collapses (puts >= 0.9 of a row on one token) in more
    # than 20 % of its rows. builtin:every-softmax, worst head: 0.01-0.03.
    "collapse_rate@outlier:1000 max <= 0.2",
    # ...nor does the outlier draw half of the other queries' attention. every-softmax: 0.01-0.05.
    "outlier_capture@outlier:1000 <= 0.5",
    # Every x 32x larger: still no head collapses. every-softmax: <= 0.008, linear-ssa: <= 0.08;
    # linear-softmax fails (0.21-0.32).
    "collapse_rate@embed-scale:32 max <= 0.2",
    # ...and attention stays spread out (entropy 1 = uniform). every-softmax: 0.90-0.92.
    "entropy@embed-scale:32 >= 0.5",
    # Attention logits x8 (the paper's Theorem 1): at most a quarter of rows collapse, over all
    # heads. every-softmax: 0.03-0.05, every-ssa: 0.01; linear-softmax fails (0.43-0.47).
    "collapse_rate@logit-scale:8 <= 0.25",
    # Optional: one key's logit + 16 (Theorem 2). Softmax models fail it (every-softmax: 0.68-0.77),
    # SSA models pass (every-ssa: <= 0.006, linear-ssa: 0.12-0.17).
    # "collapse_rate@dominant-key:16 <= 0.5",
""",
    "lm": """\
    # One token's embedding x100 must not draw half of the other tokens' attention (mean over
    # heads): the model does not fixate on a single out-of-range token.
    "outlier_capture@outlier:100 <= 0.5",
    # ...nor collapse half of the rows: the outlier probe's collapse point lies beyond 100.
    "collapse_rate@outlier:100 <= 0.5",
    # Every embedding x8: fewer than half of the rows collapse (model mean). LMs keep heads that
    # sink onto position 0 by design, which makes `max` over heads too strict as a default.
    "collapse_rate@embed-scale:8 <= 0.5",
    # Optional: attention logits x4 (Theorem 1). Softmax LMs with strong sink heads often fail it.
    # "collapse_rate@logit-scale:4 <= 0.5",
""",
}


# What `check --init` measures: each magnitude probe at its neutral level and one harsh level, at
# several seeds (other inputs and targets), so that every threshold sits above the spread it measured.
INIT_PROBES = ("embed-scale:1,8", "outlier:1,100", "key-scale:1,8", "logit-scale:1,4", "dominant-key:0,8")
INIT_SEEDS = (SEED, SEED + 1, SEED + 2)
MARGIN_STDS = 3.0  # a threshold sits this many standard deviations (across seeds) above the worst seed
MARGIN_FLOOR = 0.03  # ...and at least this far, for bounded metrics (rates, weights, entropy)
QUALITY_FLOOR = 0.05  # loss and output KL: at least this, and this share of the value, above it
# The gate against destroyed attention is anchored at uniform (entropy 1), not at the model's seed
# noise: a model may spread its attention (an SSA conversion does: 0.77 -> 0.91 on the bundled LM) and
# pass; it fails once it keeps less than this share of its distance from uniform.
UNIFORM_DISTANCE_KEPT = 0.25
# Measured, but written commented out: how saturated attention is under a probe is a diagnostic, not
# damage (a change that spreads attention at equal quality moves them the "right" way, and a collapse
# that costs nothing should not fail CI). Uncomment them to gate on saturation itself.
OPT_IN_METRICS = ("collapse_rate", "outlier_capture")


def init_margin(values: list[float], bounded: bool = True) -> float:
    """The margin of a threshold measured at ``values`` (one per seed): max(3·std, floor), with the
    floor :data:`MARGIN_FLOOR` for bounded metrics, max(:data:`QUALITY_FLOOR`, 5 % of the value) for
    loss and output KL; the std is the sample one (ddof 1), 0 for a single seed."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    floor = MARGIN_FLOOR if bounded else max(QUALITY_FLOOR, QUALITY_FLOOR * max(abs(v) for v in values))
    return max(MARGIN_STDS * std, floor)


def _gate(
    expr: str, values: list[float], seeds: str, what: str, bounded: bool = True, opt_in: bool = False
) -> list[str]:
    """A requirement ``expr <= limit`` (limit: the worst seed + :func:`init_margin`) with its comment;
    ``opt_in``: written commented out (:data:`OPT_IN_METRICS`)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    margin = init_margin(values, bounded)
    limit = math.ceil((max(values) + margin) * 1000) / 1000  # rounded up: every seed stays inside
    if bounded and limit >= 1.0:  # a gate at the metric's bound could never fail
        spread = f"{max(values):.3f} at worst, ± {std:.3f} across seeds {seeds}"
        return [f"    # {expr}: {spread}; with its margin past 1: no gate (it could never fail)"]
    rule = f"floor {margin:.3g}" if margin > MARGIN_STDS * std else f"3·std {margin:.3g}"
    head = "opt-in diagnostic, uncomment to gate on it: " if opt_in else ""
    return [
        f"    # {head}{what}: {statistics.fmean(values):.3f} ± {std:.3f} at seeds {seeds}, worst "
        f"{max(values):.3f}; margin max(3·std, floor) = {rule}; fails above {limit:g}",
        f'    {"# " if opt_in else ""}"{expr} <= {limit:g}",',
    ]


def uniform_anchor(values: list[float], floor: bool = True) -> float | None:
    """The limit of a gate on entropy measured at ``values`` (normalized entropy per seed; 1 =
    uniform): it fails once attention keeps less than :data:`UNIFORM_DISTANCE_KEPT` of its distance
    from uniform (from the worst seed), and never inside the seeds' own spread (:func:`init_margin`;
    ``floor=False``: 3·std alone, for the most uniform head, whose distance from 1 may be smaller
    than the floor). None when no such limit lies below 1 (attention near-uniform already: a gate
    could never fail)."""
    worst = max(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    spread = init_margin(values) if floor else MARGIN_STDS * std
    limit = max(1.0 - UNIFORM_DISTANCE_KEPT * (1.0 - worst), worst + spread)
    limit = math.ceil(limit * 1000) / 1000
    return limit if limit < 1.0 else None


def measured_requires(results) -> str:
    """Requirement lines for ``DiagnoseResult`` s of :data:`INIT_PROBES` at different seeds (one
    result is one seed). The gates are on what a user cares about: the model's quality at baseline
    (its loss, and attention that is not destroyed: :func:`uniform_anchor`), then per probe that
    reached attention how far its outputs move (output KL to the unshifted run; for ICL models, which
    have no vocabulary, the task error under the probe); thresholds are the
    worst seed plus :func:`init_margin`. Collapse and capture under each probe are written as opt-in
    comments (:data:`OPT_IN_METRICS`). Probes that did not reach attention, or that the scorer
    cannot respond to, are listed as comments saying why (a gate on them could never fail)."""
    from ..diagnosis.outputs import quality_values

    results = results if isinstance(results, list | tuple) else [results]
    first = results[0]
    seeds = _seed_span([r.settings.get("seed") for r in results])
    lines = _quality_lines(results, seeds)
    for probe in first.probes:
        if probe.skipped:
            lines.append(f"    # {probe.name}: skipped ({probe.note or 'not measured'})")
            continue
        level = probe.levels[-1]
        ratio = probe.reach_model()[-1]
        moved = "–" if ratio is None else f"×{ratio:.2f}"
        if probe.insensitive:
            lines.append(f"    # {probe.name}: n/a for this scorer ({probe.insensitive})")
            continue
        if probe.reached() is False:
            reason = f"did not reach attention here (logit RMS {moved}): no gate"
            lines.append(f"    # {probe.name}:{level:g} {reason}")
            continue
        runs = [r.probe(probe.name) for r in results]
        if any(run.overflowed(len(run.levels) - 1) for run in runs):
            lines.append(f"    # {probe.name}:{level:g} overflowed here: no gate")
            continue
        # How far the outputs move under the probe: their KL to the unshifted run where the model has
        # a vocabulary, else (ICL models) the task error at the shifted level.
        kl = [quality_values(run, "output_kl")[-1] for run in runs]
        error = [quality_values(run, "loss")[-1] for run in runs]
        if all(v is not None for v in kl):
            what = f"output KL to the unshifted run (logit RMS {moved})"
            lines += _gate(f"output_kl@{probe.name}:{level:g}", kl, seeds, what, bounded=False)
        elif all(v is not None for v in error):
            what = f"the task error under the probe (logit RMS {moved})"
            lines += _gate(f"loss@{probe.name}:{level:g}", error, seeds, what, bounded=False)
        metrics = OPT_IN_METRICS if probe.kind.has_target else OPT_IN_METRICS[:1]
        for metric in metrics:
            values = [float(run.model_mean(metric)[-1]) for run in runs]
            if all(math.isfinite(v) for v in values):
                lines += _gate(f"{metric}@{probe.name}:{level:g}", values, seeds, metric, opt_in=True)
    return "\n".join(lines) + "\n"


def _quality_lines(results, seeds: str) -> list[str]:
    """Gates on what the model does at baseline: its loss (LM loss or ICL task error) and, unless its
    attention is near-uniform already, attention that does not turn (near-)uniform."""
    import numpy as np

    from ..diagnosis.outputs import quality_values

    base = next((p for p in results[0].probes if not p.skipped and not p.overflowed(0)), None)
    if base is None:
        return []
    at = f"{base.name}:{base.levels[0]:g}"
    runs = [r.probe(base.name) for r in results]
    lines = []
    losses = [quality_values(run, "loss")[0] for run in runs]
    if all(v is not None for v in losses):
        lines += _gate(f"loss@{at}", losses, seeds, "quality: loss on the probe inputs", bounded=False)
    else:
        lines.append("    # quality: no loss for this model kind (LM loss: causal LMs; task error: ICL)")
    # Two gates against destroyed attention: the mean over heads (attention spread out everywhere) and
    # the most uniform head (some heads destroyed while the mean hides them).
    means = [float(run.model_mean("entropy")[0]) for run in runs]
    heads = [run.metrics["entropy"][0] for run in runs]
    most = [float(np.nanmax(h)) if np.isfinite(h).any() else math.nan for h in heads]
    kept = f"{UNIFORM_DISTANCE_KEPT:.0%}"
    gates = (
        (means, "", "attention not destroyed (mean entropy", True),
        (most, " max", "no head turns uniform (its most uniform head's entropy", False),
    )
    for values, agg, what, floor in gates:
        if not all(math.isfinite(v) for v in values):
            continue
        limit = uniform_anchor(values, floor)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        spread = f"{statistics.fmean(values):.3f} ± {std:.3f} at seeds {seeds}, worst {max(values):.3f}"
        if limit is None:
            lines.append(f"    # entropy@{at}{agg}: {spread}, near-uniform already: no gate")
            continue
        lines += [
            f"    # {what}, 1 = uniform): {spread}; fails once it keeps less than {kept} of its "
            f"distance from uniform: above {limit:g}",
            f'    "entropy@{at}{agg} <= {limit:g}",',
        ]
    return lines


def _seed_span(seeds: list) -> str:
    known = [s for s in seeds if isinstance(s, int)]
    if not known:
        return "?"
    if known == list(range(known[0], known[0] + len(known))) and len(known) > 1:
        return f"{known[0]}–{known[-1]}"
    return ", ".join(map(str, known))


def init_config(
    family: str, model: str = DEFAULT_MODEL, requires: str | None = None, random_ids: bool = False
) -> str:
    """A commented ssacli.toml with default requirements for ``family``: a kind (icl, causal,
    masked, encoder, seq2seq) or a ``model_type`` such as llama, bert or icl-gpt2. The ICL
    thresholds sit well clear of what builtin:every-softmax measures, so it passes; those for other
    models are loose starting points: tighten them, or gate on a baseline, once you have measured.
    ``random_ids``: the model is probed on random token ids (one without a tokenizer)."""
    kind = family if family in KINDS else family_kind(family)
    what = "an in-context-learning model" if kind == ModelKind.ICL else f"a transformers model ({kind})"
    if requires is not None:
        what += "; thresholds measured on it (probes that do not reach its attention get no gate)"
    return _TEMPLATE.format(
        what=what,
        model=json.dumps(model),
        samples=SAMPLES,
        seed=SEED,
        random="random_ids = true  # random token ids: the model has no tokenizer\n" if random_ids else "",
        requires=requires if requires is not None else _REQUIRES["icl" if kind == ModelKind.ICL else "lm"],
    )


# ---- check --init ---------------------------------------------------------------------------------


def write_check_config(
    model: str | None = None, path: str | Path | None = None, random_ids: bool = False, **load_options: Any
) -> str:
    """Write a commented ssacli.toml to ``path`` (None: ./ssacli.toml; never over an existing file)
    with requirements measured on ``model`` (None: the default model) at :data:`INIT_SEEDS`
    (:func:`measured_requires`), so the model passes as it is, at those seeds and others; return the
    model's kind. ``load_options``: how MODEL is loaded (:class:`~ssacli.models.options.LoadOptions`,
    ``trust_remote_code`` included); ``random_ids``: probe on random token ids (a model without a
    tokenizer), which the file then says too."""
    from ..diagnosis.run import diagnose
    from ..models.loading import load_model

    model = model or DEFAULT_MODEL
    target = Path(path or CONFIG_FILE)
    if target.exists():
        raise UsageError(f"'{target}' already exists; edit it, or remove it to write fresh defaults")
    check_writable(target, "--config")
    loaded = load_model(model, **load_options)
    # One run per seed: the spread across seeds sets every margin (:func:`init_margin`).
    results = [
        diagnose(loaded, list(INIT_PROBES), samples=SAMPLES, seed=seed, random_ids=random_ids)
        for seed in INIT_SEEDS
    ]
    requires = measured_requires(results)
    local = Path(model).expanduser()
    if not model.startswith("builtin:") and local.exists():  # config paths are relative to the file
        model = Path(os.path.relpath(local.resolve(), target.resolve().parent)).as_posix()
    write_text(init_config(loaded.kind, model, requires, random_ids), target)
    return loaded.kind
