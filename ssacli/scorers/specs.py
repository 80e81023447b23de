"""The scorers' declarations, and the spec strings every CLI command builds scorers from: torch-free.

A spec is ``name`` or ``name:key=value,key=value``; e.g. ``ssa:init=faithful,m=256`` or
``entmax:alpha=1.3,learn=alpha``. Values are parsed by the scorer's declared :class:`Option`\\ s and
checked by its rules, so a bad key or value fails here with a message that lists what is valid,
before torch is imported (the CLI calls :func:`parse_spec` first).

:data:`DECLARATIONS` is the one table of the built-in scorers, in the order `ssacli scorers` lists
them (the reference first); the torch classes (softmax_family.py, sparse.py, unnormalized.py,
cosformer.py) take their name, summary, traits, options and trainable parameters from it, and a
scorer registered from outside the table adds its own declaration here.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecError
from .declaration import (
    POSITIVE_EPS,
    SHARE,
    Declaration,
    Option,
    Traits,
    check_positive,
    learn_option,
)

# SSA with b = 1/m, n = m tends to softmax as m grows. 128 is the smallest power of two whose mean
# KL(softmax || ssa) on N(0, 1) logits over 64 keys is below 1e-4 (measured 3.8e-5; m = 64 gives
# 1.5e-4). tests/scorers/test_scorers.py measures it again.
FAITHFUL_M = 128.0
PAPER_B, PAPER_N = 0.8, 1.5
# The authors' production kernel (omyokun/SSA, Nemotron3-114M/train/SSA): one n per layer, trainable,
# init 1.5; b fixed at 0.8 (../shared/notes/paper.md).
AUTHORS_B, AUTHORS_N = 0.8, 1.5
SSA_PRESETS = ("paper", "faithful", "authors")

DECLARATIONS: dict[str, Declaration] = {}


def declare(declaration: Declaration) -> Declaration:
    """Add a scorer's declaration to the table (names are plain: no '/', ':', ',' or '=')."""
    name = declaration.name
    if not name or any(c in name for c in "/:,="):
        raise ValueError(f"bad scorer name {name!r}")
    if name in DECLARATIONS:
        raise ValueError(f"scorer {name!r} is already declared")
    DECLARATIONS[name] = declaration
    return declaration


# ---- the value rules --------------------------------------------------------------------------------


def faithful_m(raw: str) -> float | str:
    """``m=auto`` (chosen per layer from the model's own logits by ``ssacli convert``) or a number."""
    return "auto" if raw == "auto" else float(raw)


def ssa_start(given: dict[str, Any]) -> tuple[str, float, float]:
    """The preset an SSA spec starts from (``preset=`` folded into ``init=``) and its b and n."""
    if "preset" in given and "init" in given:
        raise SpecError("scorer 'ssa': preset= and init= are the same option; give one")
    opts = DECLARATIONS["ssa"].filled(given)
    init = opts["preset"] or opts["init"]
    if "m" in given and init != "faithful":
        raise SpecError("scorer 'ssa': m only applies to init=faithful (e.g. ssa:init=faithful,m=256)")
    if init == "faithful":
        m = FAITHFUL_M if opts["m"] == "auto" else opts["m"]
        if not 0 < m < 1 / POSITIVE_EPS:
            raise SpecError(f"scorer 'ssa': m must be in (0, {1 / POSITIVE_EPS:g}), got {m:g}")
        b, n = 1.0 / m, m
    elif init == "authors":
        b, n = AUTHORS_B, AUTHORS_N
    else:
        b, n = PAPER_B, PAPER_N
    b = opts["b"] if opts["b"] is not None else b
    n = opts["n"] if opts["n"] is not None else n
    check_positive(b, "ssa", "b")
    check_positive(n, "ssa", "n")
    return init, b, n


def _temperature(given: dict[str, Any]) -> None:
    t = DECLARATIONS["temperature"].filled(given)["t"]
    if not t > 0:
        raise SpecError(f"scorer 'temperature': t must be > 0, got {t:g}")


def _entmax(given: dict[str, Any]) -> None:
    opts = DECLARATIONS["entmax"].filled(given)
    if not 1.0 < opts["alpha"] < 2.0:
        raise SpecError(
            f"scorer 'entmax': alpha must be strictly between 1 and 2, got {opts['alpha']:g} "
            "(alpha=1 is softmax, alpha=2 is sparsemax: use those scorers)"
        )
    if opts["n_iter"] < 1:
        raise SpecError(f"scorer 'entmax': n_iter must be >= 1, got {opts['n_iter']}")


def _relu_norm(given: dict[str, Any]) -> None:
    power = DECLARATIONS["relu-norm"].filled(given)["power"]
    if power not in (1, 2):
        raise SpecError(f"scorer 'relu-norm': power must be 1 or 2, got {power}")


# ---- the built-in scorers, in the order `ssacli scorers` lists them -----------------------------------

SOFTMAX_LIKE = Traits("yes", "yes", "one-hot", "yes")
SPARSE = Traits("yes", "yes", "one-hot", "no")

declare(Declaration("softmax", "exp(x) / sum exp(x): the reference", SOFTMAX_LIKE))
declare(Declaration(
    "temperature", "softmax(x / t), t = exp(theta) learned per head", SOFTMAX_LIKE,
    options={
        "t": Option(1.0, float, "initial temperature (> 0); weights = softmax(x / t)"),
        "learn": learn_option("t", ("t",)),
        "share": SHARE,
    },
    trainable=("t",), rules=_temperature,
))  # fmt: skip
declare(Declaration(
    "ssa", "softmax(n·sgn(x)·log1p(b|x|)) = (1+b|x|)^(sgn(x)·n), normalized",
    Traits("yes", "no", "x₊ⁿ/Σx₊ⁿ", "yes"),
    options={
        "init": Option(
            "paper",
            SSA_PRESETS,
            f"paper: b={PAPER_B:g}, n={PAPER_N:g}; faithful: b=1/m, n=m (≈ softmax); authors: the "
            f"authors' kernel, b={AUTHORS_B:g} fixed, n={AUTHORS_N:g} one per layer, learned",
        ),
        "preset": Option(None, SSA_PRESETS, "the same as init= (one of the two)"),
        "m": Option(
            "auto",
            faithful_m,
            "init=faithful only: auto (convert picks per layer the smallest power of 2 meeting "
            f"--max-error; {FAITHFUL_M:g} for a scorer built alone, never attached uncalibrated) "
            "or a number; larger m is closer to softmax",
        ),
        "b": Option(None, float, "initial b (> 0); overrides the preset"),
        "n": Option(None, float, "initial n (> 0); overrides the preset"),
        "learn": learn_option("all", ("b", "n")),
        "share": SHARE,
    },
    trainable=("b", "n"), rules=ssa_start,
))  # fmt: skip
declare(Declaration(
    "ssmax", "softmax(s·log(N_i)·x), N_i = visible keys of the row", SOFTMAX_LIKE,
    options={
        "s": Option(1.0, float, "initial scale s"),
        "learn": learn_option("s", ("s",)),
        "share": SHARE,
    },
    trainable=("s",),
))  # fmt: skip
declare(Declaration(
    "sink", "exp(x) / (exp(s) + Σ exp(x)), learned sink logit s per head",
    Traits("< 1", "no", "one-hot", "yes"),
    options={
        "s": Option(0.0, float, "initial sink logit"),
        "learn": learn_option("s", ("s",)),
        "share": SHARE,
    },
    trainable=("s",),
))  # fmt: skip
declare(Declaration(
    "softmax1", "exp(x) / (1 + Σ exp(x)): off-by-one softmax", Traits("< 1", "no", "one-hot", "yes")
))  # fmt: skip
declare(Declaration("sparsemax", "Euclidean projection on the simplex: [x - τ]₊ (entmax package)", SPARSE))
declare(Declaration("entmax15", "1.5-entmax: [x/2 - τ]₊² (entmax package, exact sort)", SPARSE))
declare(Declaration(
    "entmax", "α-entmax by bisection, α ∈ (1, 2) learned per head (entmax package)", SPARSE,
    options={
        "alpha": Option(1.5, float, "initial α, strictly between 1 and 2"),
        "learn": learn_option("alpha", ("alpha",)),
        "share": SHARE,
        "n_iter": Option(50, int, "bisection iterations"),
    },
    trainable=("alpha",), rules=_entmax,
))  # fmt: skip
declare(Declaration(
    "sigmoid", "σ(x - log N_i), each key independently", Traits("no", "no", "0/1 step", "yes"),
    options={"bias": Option(None, float, "fixed bias instead of -log N_i")},
))  # fmt: skip
declare(Declaration(
    "softpick", "relu(eˣ − 1) / Σ|eˣ − 1| over visible keys", Traits("<= 1", "no", "one-hot", "yes")
))  # fmt: skip
declare(Declaration(
    "sa-softmax", "x·softmax(x); norm=true rescales x to [0, 1] over the row",
    Traits("<= 1", "yes (norm=false: no)", "one-hot (norm=false: unbounded)", "yes"),
    options={"norm": Option(True, bool, "rescale x to [0, 1] over the visible row first")},
))  # fmt: skip
declare(Declaration(
    "relu-norm", "relu(x) / N_i (power=2: relu(x)² / N_i)", Traits("no", "no", "scale-free", "yes"),
    options={"power": Option(1, int, "1 for ReLU, 2 for ReLU²")}, rules=_relu_norm,
))  # fmt: skip
declare(Declaration(
    "cosformer", "relu(q)·relu(k)·cos(π/2·(i−j)/M), row-normalized (uses q, k, positions)",
    Traits("yes", "n/a", "n/a (q, k)", "linear"), uses_qk=True,
))  # fmt: skip


# ---- specs ----------------------------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split, type-check and check a spec: ``"ssa:n=2,learn=n"`` -> ``("ssa", {"n": 2.0, "learn": "n"})``."""
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"empty scorer spec; choose one of: {', '.join(DECLARATIONS)}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in DECLARATIONS:
        raise SpecError(
            f"unknown scorer '{name}'; choose one of: {', '.join(DECLARATIONS)} (see `ssacli scorers`)"
        )
    declaration = DECLARATIONS[name]
    valid = ", ".join(declaration.options) or "(none)"
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not key or not raw:
            raise SpecError(f"scorer '{name}': expected key=value, got {item!r}; valid keys: {valid}")
        if key not in declaration.options:
            raise SpecError(f"scorer '{name}' has no option '{key}'; valid keys: {valid}")
        if key in options:
            raise SpecError(f"scorer '{name}': option '{key}' given twice")
        options[key] = declaration.options[key].parse(name, key, raw)
    declaration.check(options)
    return name, options


def scorer_table() -> list[dict[str, Any]]:
    """One row per scorer: what `ssacli scorers` prints (and emits with --json)."""
    return [
        {
            "name": name,
            "summary": d.summary,
            "trainable": list(d.trainable),
            "rows_sum_to_one": d.traits.rows_sum_to_one,
            "shift_invariant": d.traits.shift_invariant,
            "limit": d.traits.limit,
            "fusable": d.traits.fusable,
            "uses_qk": d.uses_qk,
            "options": {k: {"default": o.default, "help": o.help} for k, o in d.options.items()},
        }
        for name, d in DECLARATIONS.items()
    ]
