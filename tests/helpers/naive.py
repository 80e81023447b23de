"""Independent float64 reference formulas for every scorer, one row at a time.

Nothing here imports ssacli or the entmax package. Each ``ROWS[name]`` function receives the logits
of the *visible* keys of one query row (a float64 numpy vector, never empty), the per-head parameter
values of that row's head (already mapped from the raw, unconstrained parameters by ``physical``),
and the scorer's options; it returns the weights of those keys. :func:`reference` loops over
batches, heads and query rows, leaves masked keys at 0 and fully masked rows all zero.

cosFormer works on queries, keys and positions instead of logits, so it has its own row function
(``QK_ROWS``), driven by :func:`reference` as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

POSITIVE_EPS = 1e-9  # b, n = softplus(raw) + eps (docs: "reparameterize positives")
COSFORMER_FLOOR = 1e-6  # the row sum is clamped to at least this (docs/scorers.md)


# ---- raw parameter -> value -----------------------------------------------------------------


def _softplus(r: float) -> float:
    return r + math.log1p(math.exp(-r)) if r > 0 else math.log1p(math.exp(r))


def _sigmoid(r: float) -> float:
    return 1.0 / (1.0 + math.exp(-r)) if r >= 0 else math.exp(r) / (1.0 + math.exp(r))


# public parameter name -> how the stored ``<name>_raw`` value maps to the value the formula uses
PHYSICAL: dict[str, dict[str, Callable[[float], float]]] = {
    "temperature": {"t": math.exp},  # t = exp(raw), weights = softmax(x / t)
    "ssa": {"b": lambda r: _softplus(r) + POSITIVE_EPS, "n": lambda r: _softplus(r) + POSITIVE_EPS},
    "ssmax": {"s": float},
    "sink": {"s": float},
    "entmax": {"alpha": lambda r: 1.0 + _sigmoid(r)},
}


def physical(name: str, raw: dict[str, np.ndarray], head: int) -> dict[str, float]:
    """Values of head ``head`` (a one-element parameter is shared by every head)."""
    out = {}
    for public, values in raw.items():
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        r = float(values[0] if values.size == 1 else values[head])
        out[public] = PHYSICAL[name][public](r)
    return out


# ---- row formulas ---------------------------------------------------------------------------


def _softmax(z: list[float]) -> list[float]:
    m = max(z)
    e = [math.exp(v - m) for v in z]
    total = math.fsum(e)
    return [v / total for v in e]


def softmax_row(v, p, o):
    return _softmax(list(v))


def temperature_row(v, p, o):
    return _softmax([x / p["t"] for x in v])


def ssa_row(v, p, o):
    # w_j ∝ (1 + b|x_j|)^(sgn(x_j)·n); evaluated through logs so large n cannot overflow float64
    b, n = p["b"], p["n"]
    return _softmax([n * math.copysign(1.0, x) * math.log1p(b * abs(x)) if x != 0 else 0.0 for x in v])


def ssmax_row(v, p, o):
    scale = p["s"] * math.log(len(v))
    return _softmax([scale * x for x in v])


def _sink(v, s):
    m = max(max(v), s)
    e = [math.exp(x - m) for x in v]
    den = math.exp(s - m) + math.fsum(e)
    return [x / den for x in e]


def sink_row(v, p, o):
    return _sink(v, p["s"])


def softmax1_row(v, p, o):
    return _sink(v, 0.0)  # exp(x) / (1 + Σ exp(x))


def _consistent_threshold(z: list[float], tau_of_k: Callable[[list[float], int], float | None]) -> float:
    """The τ of the support size k whose top-k entries are > τ and the rest <= τ (sort-based)."""
    zs = sorted(z, reverse=True)
    for k in range(1, len(zs) + 1):
        tau = tau_of_k(zs, k)
        if tau is None:
            continue
        nxt = zs[k] if k < len(zs) else -math.inf
        if zs[k - 1] > tau >= nxt:
            return tau
    raise AssertionError(f"no consistent threshold for {z}")


def sparsemax_row(v, p, o):
    z = list(v)

    def tau(zs, k):  # Σ_{top k} (z - τ) = 1
        return (math.fsum(zs[:k]) - 1.0) / k

    t = _consistent_threshold(z, tau)
    return [max(x - t, 0.0) for x in z]


def entmax15_row(v, p, o):
    z = [x / 2.0 for x in v]

    def tau(zs, k):  # Σ_{top k} (z - τ)² = 1, the smaller root
        mean = math.fsum(zs[:k]) / k
        mean_sq = math.fsum(x * x for x in zs[:k]) / k
        disc = (1.0 - k * (mean_sq - mean * mean)) / k
        if disc < 0:
            return None
        return mean - math.sqrt(disc)

    t = _consistent_threshold(z, tau)
    w = [max(x - t, 0.0) ** 2 for x in z]
    return w


def entmax_bisect_row(v, p, o, iters: int = 200):
    """α-entmax: w = [(α-1)x - τ]₊^(1/(α-1)) with τ such that Σw = 1, by bisection on τ."""
    alpha = p["alpha"]
    am1 = alpha - 1.0
    z = [am1 * x for x in v]
    zmax = max(z)

    def mass(tau):
        return math.fsum(max(x - tau, 0.0) ** (1.0 / am1) for x in z)

    lo, hi = zmax - 1.0, zmax  # mass(lo) >= 1 (the max alone gives 1), mass(hi) = 0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mass(mid) >= 1.0:
            lo = mid
        else:
            hi = mid
    w = [max(x - lo, 0.0) ** (1.0 / am1) for x in z]
    total = math.fsum(w)
    return [x / total for x in w]


def sigmoid_row(v, p, o):
    bias = o.get("bias")
    shift = -math.log(len(v)) if bias is None else bias
    out = []
    for x in v:
        y = x + shift
        out.append(1.0 / (1.0 + math.exp(-y)) if y >= 0 else math.exp(y) / (1.0 + math.exp(y)))
    return out


def softpick_row(v, p, o):
    # relu(eˣ − 1) / Σ|eˣ − 1|, both multiplied by e^(−m), m = max(0, max x), so nothing overflows
    m = max(0.0, max(v))
    d = [math.exp(-m) * math.expm1(x) if x <= 0 else -math.exp(x - m) * math.expm1(-x) for x in v]
    den = math.fsum(abs(x) for x in d)
    if den == 0.0:
        return [0.0] * len(v)
    return [max(x, 0.0) / den for x in d]


def sa_softmax_row(v, p, o):
    prob = _softmax(list(v))
    if not o.get("norm", True):
        return [x * q for x, q in zip(v, prob)]
    lo, hi = min(v), max(v)
    if hi == lo:
        return prob
    return [(x - lo) / (hi - lo) * q for x, q in zip(v, prob)]


def relu_norm_row(v, p, o):
    power = o.get("power", 1)
    return [max(x, 0.0) ** power / len(v) for x in v]


ROWS: dict[str, Callable[[np.ndarray, dict[str, float], dict[str, Any]], list[float]]] = {
    "softmax": softmax_row,
    "temperature": temperature_row,
    "ssa": ssa_row,
    "ssmax": ssmax_row,
    "sink": sink_row,
    "softmax1": softmax1_row,
    "sparsemax": sparsemax_row,
    "entmax15": entmax15_row,
    "entmax": entmax_bisect_row,
    "sigmoid": sigmoid_row,
    "softpick": softpick_row,
    "sa-softmax": sa_softmax_row,
    "relu-norm": relu_norm_row,
}


def cosformer_row(qi, keys, pos_i, key_pos, big_m):
    """s_j = relu(q_i)·relu(k_j)·cos(π/2·(i − j)/M); A = s / max(Σ s, floor)."""
    rq = [max(a, 0.0) for a in qi]
    s = []
    for kj, pj in zip(keys, key_pos):
        dot = math.fsum(a * max(c, 0.0) for a, c in zip(rq, kj))
        s.append(dot * math.cos(math.pi / 2.0 * (pos_i - pj) / big_m))
    den = max(math.fsum(s), COSFORMER_FLOOR)
    return [x / den for x in s]


QK_ROWS = {"cosformer": cosformer_row}

REFERENCES = set(ROWS) | set(QK_ROWS)


def reference(
    name: str,
    x: np.ndarray,
    visible: np.ndarray,
    raw_params: dict[str, np.ndarray] | None = None,
    options: dict[str, Any] | None = None,
    query: np.ndarray | None = None,
    key: np.ndarray | None = None,
    query_positions: np.ndarray | None = None,
    key_positions: np.ndarray | None = None,
) -> np.ndarray:
    """Weights for logits ``x[b, h, q, k]`` (float64) and a bool ``visible`` of the same shape."""
    if name not in REFERENCES:
        raise KeyError(f"tests/helpers/naive.py has no reference formula for scorer {name!r}")
    x = np.asarray(x, dtype=np.float64)
    visible = np.broadcast_to(np.asarray(visible, dtype=bool), x.shape)
    assert x.ndim == 4, "reference expects [b, h, q, k]"
    raw_params = raw_params or {}
    options = options or {}
    nb, nh, nq, nk = x.shape
    out = np.zeros_like(x)
    if name in QK_ROWS:
        q = np.asarray(query, dtype=np.float64)
        k = np.asarray(key, dtype=np.float64)
        qp = np.arange(nk - nq, nk) if query_positions is None else np.asarray(query_positions)
        kp = np.arange(nk) if key_positions is None else np.asarray(key_positions)
        qp = np.broadcast_to(qp.astype(np.float64), (nb, nq))
        kp = np.broadcast_to(kp.astype(np.float64), (nb, nk))
        big_m = max(nq, nk)
    for b in range(nb):
        for h in range(nh):
            params = physical(name, raw_params, h)
            for i in range(nq):
                idx = [j for j in range(nk) if visible[b, h, i, j]]
                if not idx:
                    continue  # fully masked row: all zeros
                if name in QK_ROWS:
                    w = QK_ROWS[name](
                        q[b, h, i], [k[b, h, j] for j in idx], qp[b, i], [kp[b, j] for j in idx], big_m
                    )
                else:
                    w = ROWS[name](np.array([x[b, h, i, j] for j in idx]), params, options)
                for j, wj in zip(idx, w):
                    out[b, h, i, j] = wj
    return out


# ---- tolerances for quantities computed in float32 ----------------------------------------------


def float32_kl_resolution(log_p) -> float:
    """The smallest KL per token that float32 log-probabilities can resolve.

    Each log-probability from a float32 forward carries a rounding error of a few ulps of its own
    magnitude; in the KL, Σ p·(log p − log q), an error δ enters at first order, so two KLs of the
    same models computed along different float32 paths (other kernels, thread counts, CPUs) agree
    only to about eps32 · E_p|log p|. The factor 64 covers the accumulation over the forward's
    layers; the bound scales with the quantity, so it holds on any machine.
    """
    p = np.exp(np.asarray(log_p, dtype=np.float64))
    mean_abs_log_p = float((p * np.abs(np.log(np.clip(p, 1e-300, None)))).sum(-1).mean())
    return 64 * float(np.finfo(np.float32).eps) * max(mean_abs_log_p, 1.0)


def float32_kl_bound(vocab: int) -> float:
    """:func:`float32_kl_resolution` without the log-probabilities at hand: E_p|log p| is the
    entropy, at most log(vocab)."""
    return 64 * float(np.finfo(np.float32).eps) * max(math.log(vocab), 1.0)
