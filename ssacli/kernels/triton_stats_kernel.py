"""The Triton kernel of diagnose's statistics on CUDA: one FlashAttention-2 forward that carries, per
query row, every running sum of :class:`~ssacli.kernels.row_stats.RowStatistics` (ssacli/kernels/
triton_stats.py launches it and says why one kernel rather than flex_attention calls).

One program per (query block, batch × query head); GQA reads the K/V head ``h // GROUP``. Per key
tile, in float32 whatever the inputs (natural-log units, as RowStatistics):

* the logits x = scale·(q·kᵀ): with 16-bit inputs rounded to the input dtype after the product and
  again after the scaling (ROUND), as ssacli.kernels.stats_call forms them (a bf16 matmul, then
  ``mul_(scaling)`` in bf16), so the statistics are those of the eager weights;
* Σ x² and the count over the visible finite logits, and how many visible logits are not finite;
* t = x, or SSA's n·sgn(x)·ln(1 + b|x|) (ln(1 + a) as a − a²/2 below 1e-4, where log2(1 + a) loses
  digits; no libdevice log1p, which the interpreter lacks);
* the online softmax: m, l = Σ e^(t − m) and spread = Σ e^(t − m)·(m − t), whose old terms become
  e^(−δ)·(spread + δ·l) when the max grows by δ (ssacli.kernels.online_stats); the output
  accumulator Σ e^(t − m)·v (p rounded to the input dtype for 16-bit inputs, as SDPA and the eager
  path round the weights; float32 products for float32 inputs);
* t at key 0 and at the sample's target key, x at the target (NaN where hidden or not finite);
* the running top-k of t, kept unsorted in a [rows, TOP_P] tile (padding columns +inf, never
  replaced): skipped for a tile in which no row's max beats its current k-th, else k rounds of
  "take the tile's max, remove one occurrence, replace the row's smallest kept value if larger";
* with POSITIONS, ssacli.kernels.positions's terms: Σ e^(t − m) per key bin and per distance bin
  (bit length of |pos − j|, read from the float32 exponent: exact below 2^24 keys) and
  Σ e^(t − m)·|pos − j|, rescaled with l; each tile adds only to the bins it touches.

Visibility: in range, causal bottom-right (query i at key K − Q + i), a window (the last WINDOW keys
up to the row's own) and a boolean mask (uint8 view, broadcast strides); tiles outside the causal
band and the window are never loaded. UPCAST: the interpreter's bf16 ``tl.dot`` is wrong
(triton-lang/triton#11584), so the operands are rounded to the input dtype and multiplied in float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_kernels import (
    column_tile,
    max_combine,
    min_combine,
    operand,
    program_heads,
    row_tile,
    store_rows,
    total,
    visible,
)

# Planes of the per-row float32 output S [PLANES, B, H, Q]
PLANES = ("max", "total", "spread", "first", "target", "target_logit", "logit_sq", "logit_n",
          "distance_sum", "not_finite")  # fmt: skip


@triton.jit
def _low(x):
    return tl.reduce(x, 1, min_combine)


@triton.jit
def _rounded(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """float32 x rounded to the 16-bit input dtype, to nearest even, back in float32. Under UPCAST (the
    interpreter with bf16 inputs) by integer arithmetic: the interpreter's float32 → bf16 cast
    truncates, where a GPU's rounds to nearest."""
    if UPCAST:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def _bit_length(d):
    """Bit length of integers 0 ≤ d < 2^24 (0 → 0, 1 → 1, 2–3 → 2, …) from float32's exponent."""
    e = (d.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 126
    return tl.where(d == 0, 0, e)


@triton.jit
def _add_column(bins, column, value, offs):
    """bins [M, P] with ``value`` [M] added to column ``column``."""
    return bins + tl.where(offs[None, :] == column, value[:, None], 0.0)


@triton.jit
def _top_update(top, t, cols, offs_top, N_TOP: tl.constexpr):
    """The running top-k tile ``top`` [M, TOP_P] after the key tile t [M, N] (−inf at hidden keys)."""
    cand = t
    for _ in tl.static_range(N_TOP):
        v = tl.reduce(cand, 1, max_combine)
        first = _low(tl.where(cand == v[:, None], cols[None, :], 2147483647))
        cand = tl.where(cols[None, :] == first[:, None], float("-inf"), cand)
        low = _low(top)
        at = _low(tl.where(top == low[:, None], offs_top[None, :], 2147483647))
        top = tl.where((offs_top[None, :] == at[:, None]) & (v > low)[:, None], v[:, None], top)
    return top


@triton.jit
def row_stats_fwd(
    Q, K, V, Out, S, Top, KB, DB, Mask, Target, Bp, Np,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
    smb, smh, smm, smn,
    scale, H, GROUP, Q_LEN, K_LEN, HEAD_DIM, WINDOW, SINK_K, BIN_WIDTH, PLANE, N_KB, N_DB,
    N_TOP: tl.constexpr, TOP_P: tl.constexpr, KB_P: tl.constexpr, DB_P: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TARGET: tl.constexpr,
    SSA: tl.constexpr, POSITIONS: tl.constexpr, ROUND: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh, bz, h, hk = program_heads(H, GROUP)
    dtype = Q.dtype.element_ty
    offset = K_LEN - Q_LEN
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = rows < Q_LEN
    pos = rows + offset
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_top = tl.arange(0, TOP_P)
    q = operand(row_tile(Q + bz * sqb + h * sqh, rows, offs_d, sqm, sqd, Q_LEN, HEAD_DIM), dtype, UPCAST)
    bb = 1.0
    nn = 1.0
    if SSA:
        bb = tl.load(Bp + h).to(tl.float32)
        nn = tl.load(Np + h).to(tl.float32)
    k_base = K + bz * skb + hk * skh
    v_base = V + bz * svb + hk * svh
    m_base = Mask + bz * smb + h * smh
    tgt = -1
    if HAS_TARGET:
        tgt = tl.load(Target + bz).to(tl.int32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    spread = tl.full([BLOCK_M], 0.0, tl.float32)
    first = tl.full([BLOCK_M], float("-inf"), tl.float32)
    t_tgt = tl.full([BLOCK_M], float("-inf"), tl.float32)
    x_tgt = tl.full([BLOCK_M], float("nan"), tl.float32)
    sq = tl.full([BLOCK_M], 0.0, tl.float32)
    cnt = tl.full([BLOCK_M], 0.0, tl.float32)
    bad = tl.full([BLOCK_M], 0.0, tl.float32)
    dist = tl.full([BLOCK_M], 0.0, tl.float32)
    top = tl.full([BLOCK_M, TOP_P], 0.0, tl.float32)  # its padding columns +inf: never the smallest
    top += tl.where(offs_top[None, :] < N_TOP, float("-inf"), float("inf"))
    offs_kb = tl.arange(0, KB_P)
    offs_db = tl.arange(0, DB_P)
    kb = tl.full([BLOCK_M, KB_P], 0.0, tl.float32)
    db = tl.full([BLOCK_M, DB_P], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    lo = 0
    hi = K_LEN
    last_pos = tl.minimum((pid_m + 1) * BLOCK_M, Q_LEN) - 1 + offset
    if CAUSAL:  # keys after the block's last query position are invisible to every row of it
        hi = tl.minimum(K_LEN, last_pos + 1)
        if HAS_WINDOW:  # keys before the first row's window are invisible to every row of it
            lo = tl.maximum(0, pid_m * BLOCK_M + offset - WINDOW + 1) // BLOCK_N * BLOCK_N
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        kt = column_tile(k_base, cols, offs_d, skn, skd, K_LEN, HEAD_DIM)
        prod = tl.dot(q, operand(kt, dtype, UPCAST), input_precision=PRECISION)
        if ROUND:  # the eager logits: a 16-bit matmul, then the scaling in 16 bits
            x = _rounded(_rounded(prod, dtype, UPCAST) * scale, dtype, UPCAST)
        else:
            x = prod * scale
        ok = visible(rows, cols, Q_LEN, K_LEN, m_base, smm, smn, CAUSAL, HAS_MASK)
        if HAS_WINDOW:
            ok = ok & (pos[:, None] - cols[None, :] < WINDOW)
        finite = tl.abs(x) < float("inf")  # False for ±inf and NaN
        shown = ok & finite
        sq += total(tl.where(shown, x * x, 0.0), 1)
        cnt += total(shown.to(tl.float32), 1)
        bad += total((ok & (finite == 0)).to(tl.float32), 1)
        if SSA:
            a = bb * tl.abs(x)
            ln1p = tl.where(a < 1e-4, a - 0.5 * a * a, tl.log2(1.0 + a) * 0.6931471805599453)
            t = nn * tl.where(x < 0.0, -ln1p, ln1p)
        else:
            t = x
        t = tl.where(ok, t, float("-inf"))
        if start == 0:
            first = tl.reduce(tl.where(cols[None, :] == 0, t, float("-inf")), 1, max_combine)
        if HAS_TARGET:
            if (tgt >= start) & (tgt < start + BLOCK_N):
                at = cols[None, :] == tgt
                t_tgt = tl.reduce(tl.where(at, t, float("-inf")), 1, max_combine)
                seen = tl.reduce(tl.where(at & shown, 1, 0), 1, max_combine)
                x_at = total(tl.where(at & shown, x, 0.0), 1)
                x_tgt = tl.where(seen > 0, x_at, float("nan"))
        tile_max = tl.reduce(t, 1, max_combine)
        m_new = tl.maximum(m_i, tile_max)
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        had = m_i > float("-inf")
        alpha = tl.where(had, tl.exp(m_i - ref), 0.0)
        delta = tl.where(had, ref - m_i, 0.0)
        p = tl.exp(t - ref[:, None])
        spread = alpha * (spread + delta * l_i) + total(p * tl.where(ok, ref[:, None] - t, 0.0), 1)
        l_i = alpha * l_i + total(p, 1)
        v = row_tile(v_base, cols, offs_d, svn, svd, K_LEN, HEAD_DIM)
        if UPCAST:  # p rounded to bf16 to nearest, as on a GPU
            p_op = _rounded(p, dtype, UPCAST)
        else:
            p_op = operand(p, dtype, UPCAST)
        acc = acc * alpha[:, None] + tl.dot(p_op, operand(v, dtype, UPCAST), input_precision=PRECISION)
        if POSITIONS:
            distance = tl.abs(pos[:, None] - cols[None, :])
            dist = alpha * dist + total(p * distance.to(tl.float32), 1)
            kb = kb * alpha[:, None]
            db = db * alpha[:, None]
            key_bin = tl.where(cols < SINK_K, 0, 1 + (cols - SINK_K) // BIN_WIDTH)
            tile_end = tl.minimum(start + BLOCK_N, K_LEN) - 1
            bin_lo = tl.where(start < SINK_K, 0, 1 + (start - SINK_K) // BIN_WIDTH)
            bin_hi = tl.where(tile_end < SINK_K, 0, 1 + (tile_end - SINK_K) // BIN_WIDTH)
            for b in range(bin_lo, bin_hi + 1):
                kb = _add_column(kb, b, total(tl.where(key_bin[None, :] == b, p, 0.0), 1), offs_kb)
            dist_bin = _bit_length(distance)
            first_pos = pid_m * BLOCK_M + offset
            near = tl.maximum(0, tl.maximum(start - last_pos, first_pos - tile_end))
            far = tl.maximum(tl.abs(last_pos - start), tl.abs(tile_end - first_pos))
            for b in range(_bit_length(near), _bit_length(far) + 1):
                db = _add_column(db, b, total(tl.where(dist_bin == b, p, 0.0), 1), offs_db)
        m_i = m_new
        kth = _low(top)
        if tl.reduce((tile_max > kth).to(tl.int32), 0, max_combine) > 0:
            top = _top_update(top, t, cols, offs_top, N_TOP)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # a row with no visible key gives 0
    store_rows(Out + bz * sob + h * soh, out, rows, offs_d, som, sod, Q_LEN, HEAD_DIM)
    row = bh.to(tl.int64) * Q_LEN + rows
    tl.store(S + row, m_i, mask=r_ok)  # in the order of PLANES
    tl.store(S + PLANE + row, l_i, mask=r_ok)
    tl.store(S + 2 * PLANE + row, spread, mask=r_ok)
    tl.store(S + 3 * PLANE + row, first, mask=r_ok)
    tl.store(S + 4 * PLANE + row, t_tgt, mask=r_ok)
    tl.store(S + 5 * PLANE + row, x_tgt, mask=r_ok)
    tl.store(S + 6 * PLANE + row, sq, mask=r_ok)
    tl.store(S + 7 * PLANE + row, cnt, mask=r_ok)
    tl.store(S + 8 * PLANE + row, dist, mask=r_ok)
    tl.store(S + 9 * PLANE + row, bad, mask=r_ok)
    # [rows, k], [rows, N_KB], [rows, N_DB]: the real columns only, not the padded tiles
    top_ok = r_ok[:, None] & (offs_top < N_TOP)[None, :]
    tl.store(Top + row[:, None] * N_TOP + offs_top[None, :], top, mask=top_ok)
    if POSITIONS:
        kb_ok = r_ok[:, None] & (offs_kb < N_KB)[None, :]
        db_ok = r_ok[:, None] & (offs_db < N_DB)[None, :]
        tl.store(KB + row[:, None] * N_KB + offs_kb[None, :], kb, mask=kb_ok)
        tl.store(DB + row[:, None] * N_DB + offs_db[None, :], db, mask=db_ok)
