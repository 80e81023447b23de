"""`ssacli.toml`: reading the ``[check]`` table (merged with explicit settings by
:func:`ssacli.check.settings.check_settings`), and the commented file ``ssacli check --init`` writes,
with requirements measured on a model (:func:`write_check_config`; templates for ICL models vs
transformers language models and encoders). Cheap to import (no torch): the CLI reads
:data:`CONFIG_FILE` for its help."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from ..defaults import DEFAULT_MODEL, SAMPLES, SEED
from ..errors import InputError, UsageError
from ..files import check_writable, write_text
from ..models.kinds import KINDS, family_kind

CONFIG_FILE = "ssacli.toml"  # what check reads from the working folder when no config is given

CONFIG_KEYS: dict[str, tuple[type, ...]] = {
    "model": (str,), "requires": (list,), "baseline": (str,), "max_regression": (int, float),
    "samples": (int,), "seed": (int,), "length": (int,), "tau": (int, float), "scorer": (str,),
    "device": (str,), "dtype": (str,),
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
        if isinstance(value, bool) or not isinstance(value, kinds):
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
requires = [
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


# What `check --init` measures: each magnitude probe at its neutral level and one harsh level.
INIT_PROBES = ("embed-scale:1,8", "outlier:1,100", "key-scale:1,8", "logit-scale:1,4", "dominant-key:0,8")
INIT_MARGIN = 0.1  # thresholds sit this far above what the model measures, so it passes as it is


def measured_requires(result) -> str:
    """Requirement lines for a measured ``DiagnoseResult`` of :data:`INIT_PROBES`: each probe that
    reached attention (its logit RMS moved) gets a collapse-rate gate (and a capture gate for probes
    with a target) just above what the model measures; probes that did not reach attention, or
    that the scorer cannot respond to, are listed as comments saying why (a gate on them could never
    fail)."""
    lines = []
    for probe in result.probes:
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
        if probe.overflowed(len(probe.levels) - 1):
            lines.append(f"    # {probe.name}:{level:g} overflowed here: no gate")
            continue
        for metric in ("collapse_rate", "outlier_capture") if probe.kind.has_target else ("collapse_rate",):
            value = float(probe.model_mean(metric)[-1])
            if value != value:
                continue
            limit = min(1.0, round(value + INIT_MARGIN, 2))
            lines.append(f"    # measured {value:.3f} (logit RMS {moved}); fails if it rises past {limit:g}")
            lines.append(f'    "{metric}@{probe.name}:{level:g} <= {limit:g}",')
    return "\n".join(lines) + "\n"


def init_config(family: str, model: str = DEFAULT_MODEL, requires: str | None = None) -> str:
    """A commented ssacli.toml with default requirements for ``family``: a kind (icl, causal,
    masked, encoder, seq2seq) or a ``model_type`` such as llama, bert or icl-gpt2. The ICL
    thresholds sit well clear of what builtin:every-softmax measures, so it passes; those for other
    models are loose starting points: tighten them, or gate on a baseline, once you have measured."""
    kind = family if family in KINDS else family_kind(family)
    what = "an in-context-learning model" if kind == "icl" else f"a transformers model ({kind})"
    if requires is not None:
        what += "; thresholds measured on it (probes that do not reach its attention get no gate)"
    return _TEMPLATE.format(
        what=what,
        model=json.dumps(model),
        samples=SAMPLES,
        seed=SEED,
        requires=requires if requires is not None else _REQUIRES["icl" if kind == "icl" else "lm"],
    )


# ---- check --init ---------------------------------------------------------------------------------


def write_check_config(model: str | None = None, path: str | Path | None = None, **load_options: Any) -> str:
    """Write a commented ssacli.toml to ``path`` (None: ./ssacli.toml; never over an existing file)
    with requirements measured on ``model`` (None: the default model; :func:`measured_requires`),
    so the model passes as it is; return the model's kind. ``load_options``: how MODEL is loaded
    (:class:`~ssacli.models.loading.LoadOptions`, ``trust_remote_code`` included)."""
    from ..diagnosis.run import diagnose
    from ..models.loading import load_model

    model = model or DEFAULT_MODEL
    target = Path(path or CONFIG_FILE)
    if target.exists():
        raise UsageError(f"'{target}' already exists; edit it, or remove it to write fresh defaults")
    check_writable(target, "--config")
    loaded = load_model(model, **load_options)
    result = diagnose(loaded, list(INIT_PROBES), samples=SAMPLES, seed=SEED)
    requires = measured_requires(result)
    local = Path(model).expanduser()
    if not model.startswith("builtin:") and local.exists():  # config paths are relative to the file
        model = Path(os.path.relpath(local.resolve(), target.resolve().parent)).as_posix()
    write_text(init_config(loaded.kind, model, requires), target)
    return loaded.kind
