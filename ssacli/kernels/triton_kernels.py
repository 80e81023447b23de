"""The Triton kernels of SSA attention: FlashAttention-2's forward and backward with SSA's transform.

One query head per program row of the grid (GQA reads its K/V head, never a repeated copy). Every
logit tile is y = (b·scale)·(q·kᵀ) in float32 and the softmax runs in base 2:

    t₂ = n·sgn(y)·log2(1 + |y|)      (SSA=True; the weight 2^t₂ = (1 + |y|)^(sgn(y)·n))
    t₂ = y·log2(e)                   (SSA=False: plain softmax, the benchmark's control kernel)

so 2^(t₂ − lse₂) is the attention weight. The forward saves lse₂ per row (0 for a row with no
visible key, whose output is 0) in two parts, the row's max m and log2 of its sum, at LSE[0] and
LSE[1]: the backward recomputes each tile's weights as 2^((t₂ − m) − log2 l), where t₂ − m is exact
for the largest weights, whereas 2^(t₂ − lse₂) carries lse₂'s rounding (an ulp of |lse₂|, ~4e-6 at
lse₂ ≈ 40) into every weight of the row alike, and sums over rows that cancel (dn, db with large
logits) amplify it (2.6e-5 relative error in db, measured in the tests' large-logit case; 2.7e-6 with
the two parts). The backward needs no [Q, K] matrix:
with natural-log t = t₂·ln 2, dt = p·(dp − Δ), Δ = rowsum(dO·O), and

    ∂t/∂y = n / (1 + |y|),   ∂t/∂n = sgn(y)·ln(1 + |y|) = ln 2 · sgn(y)·log2(1 + |y|).

* :func:`ssa_bwd_dkdv` (one program per query head × key block) accumulates dK, dV of that query
  head in float32 (summed over each GQA group afterwards, so every query head gets its own program)
  and Σ dt·sgn(y)·log2(1+|y|) into one partial per (batch, head, key block): no atomics, the sum
  over blocks is taken afterwards in a fixed order, so dn is deterministic.
* :func:`ssa_bwd_dq` (one program per query head × query block) accumulates dQ in float32 and, from
  that float32 accumulator, Σ q·dq per (batch, head, query block): with q̃ = b·scale·q,
  Σ_ij (∂L/∂y_ij)·y_ij = Σ_i q̃_i·∂L/∂q̃_i = Σ_i q_i·dq_i, so db = Σ q·dq / b with no per-score work.

Masking is by loads (any length, no multiple-of-block rule; the head size is padded to the next power
of two by masked loads). ``mask`` is a uint8 view of a boolean tensor expanded to [B, H, Q, K] (a key
padding mask has stride 0 over heads and queries). ``causal`` is bottom-right aligned: query i sits at
key position K − Q + i. UPCAST (the interpreter with bfloat16 inputs, whose bf16 ``tl.dot`` is wrong:
triton-lang/triton#11584) multiplies in float32 after rounding each operand to the input dtype, so the
interpreter still sees the GPU's bf16 rounding of p and ds. Only ``tl.log2``/``tl.exp2``: no libdevice.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Reductions through tl.reduce with triton's own combine functions instead of tl.sum / tl.max (which
# reduce with the same ones): those are @triton.jit functions of triton itself, built as compiled or
# interpreted once, when triton is first imported, so a process that imported triton before setting
# TRITON_INTERPRET (torch._dynamo imports it) could not interpret them; tl.reduce is a builtin, and
# the interpreter recognizes these combine functions and reduces with numpy. (tl.zeros is such a
# function too: the kernels use tl.full.)
add_combine = tl.standard._sum_combine
max_combine = tl.standard._elementwise_max
min_combine = tl.standard._elementwise_min


@triton.jit
def total(x, axis: tl.constexpr):
    return tl.reduce(x, axis, add_combine)


@triton.jit
def program_heads(H, GROUP):
    """(batch × head index, batch, query head, K/V head) of this program: grid axis 1 runs over
    batch × query heads; a GQA group of GROUP query heads reads one K/V head."""
    bh = tl.program_id(1)
    h = bh % H
    return bh, (bh // H).to(tl.int64), h, (h // GROUP).to(tl.int64)


@triton.jit
def row_tile(base, rows, offs_d, s_row, s_dim, LENGTH, HEAD_DIM):
    """[rows, D] of a [LENGTH, HEAD_DIM] matrix (queries, values), 0 past either end."""
    ok = (rows[:, None] < LENGTH) & (offs_d < HEAD_DIM)[None, :]
    return tl.load(base + rows[:, None] * s_row + offs_d[None, :] * s_dim, mask=ok, other=0.0)


@triton.jit
def column_tile(base, cols, offs_d, s_col, s_dim, LENGTH, HEAD_DIM):
    """[D, cols]: the keys of ``cols`` transposed, for q·kᵀ, 0 past either end."""
    ok = (cols < LENGTH)[None, :] & (offs_d < HEAD_DIM)[:, None]
    return tl.load(base + cols[None, :] * s_col + offs_d[:, None] * s_dim, mask=ok, other=0.0)


@triton.jit
def store_rows(base, tile, rows, offs_d, s_row, s_dim, LENGTH, HEAD_DIM):
    """``tile`` [rows, D] into a [LENGTH, HEAD_DIM] matrix in its element type."""
    ok = (rows[:, None] < LENGTH) & (offs_d < HEAD_DIM)[None, :]
    tl.store(base + rows[:, None] * s_row + offs_d[None, :] * s_dim, tile.to(base.dtype.element_ty), mask=ok)


@triton.jit
def _transform(y, nn, SSA: tl.constexpr):
    """(t₂, sgn(y)·log2(1 + |y|)) of a float32 tile; the second is only used by SSA's backward."""
    if SSA:
        a = tl.abs(y)
        lg = tl.log2(1.0 + a)
        slg = tl.where(y < 0.0, -lg, lg)
        return nn * slg, slg
    else:
        return y * 1.4426950408889634, y


@triton.jit
def visible(rows, cols, Q_LEN, K_LEN, mask_ptr, smm, smn, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """[M, N] bool: in range, causal (bottom-right) and the mask tensor."""
    ok = (rows[:, None] < Q_LEN) & (cols[None, :] < K_LEN)
    if CAUSAL:
        ok = ok & (cols[None, :] <= rows[:, None] + (K_LEN - Q_LEN))
    if HAS_MASK:
        keep = tl.load(mask_ptr + rows[:, None] * smm + cols[None, :] * smn, mask=ok, other=0)
        ok = ok & (keep != 0)
    return ok


@triton.jit
def operand(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """A tile as a tl.dot operand: rounded to the input dtype, then float32 under UPCAST."""
    x = x.to(DTYPE)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def ssa_fwd(
    Q, K, V, Out, LSE, Bp, Np, M,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
    smb, smh, smm, smn,
    scale, H, GROUP, Q_LEN, K_LEN, HEAD_DIM, STATS,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, SSA: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh, bz, h, hk = program_heads(H, GROUP)
    dtype = Q.dtype.element_ty
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = operand(row_tile(Q + bz * sqb + h * sqh, rows, offs_d, sqm, sqd, Q_LEN, HEAD_DIM), dtype, UPCAST)
    c = tl.load(Bp + h).to(tl.float32) * scale
    nn = tl.load(Np + h).to(tl.float32)
    k_base = K + bz * skb + hk * skh
    v_base = V + bz * svb + hk * svh
    m_base = M + bz * smb + h * smh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    hi = K_LEN
    if CAUSAL:  # keys after the block's last query position are invisible to every row of it
        hi = tl.minimum(K_LEN, (pid_m + 1) * BLOCK_M + K_LEN - Q_LEN)
    for start in range(0, hi, BLOCK_N):
        cols = start + offs_n
        kt = column_tile(k_base, cols, offs_d, skn, skd, K_LEN, HEAD_DIM)
        y = tl.dot(q, operand(kt, dtype, UPCAST), input_precision=PRECISION) * c
        t, _ = _transform(y, nn, SSA)
        t = tl.where(visible(rows, cols, Q_LEN, K_LEN, m_base, smm, smn, CAUSAL, HAS_MASK), t, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(t, 1, max_combine))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(t - m_ref[:, None])
        l_i = l_i * alpha + total(p, 1)
        v = row_tile(v_base, cols, offs_d, svn, svd, K_LEN, HEAD_DIM)
        acc = acc * alpha[:, None] + tl.dot(
            operand(p, dtype, UPCAST), operand(v, dtype, UPCAST), input_precision=PRECISION
        )
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]  # a row with no visible key gives 0
    store_rows(Out + bz * sob + h * soh, out, rows, offs_d, som, sod, Q_LEN, HEAD_DIM)
    r_ok = rows < Q_LEN
    row = LSE + bh.to(tl.int64) * Q_LEN + rows
    tl.store(row, tl.where(empty, 0.0, m_i), mask=r_ok)
    tl.store(row + STATS, tl.log2(tl.where(empty, 1.0, l_i)), mask=r_ok)


@triton.jit
def _dt_tile(q, kt, do, vt, m, lg2l, delta, c, nn, ok, SSA: tl.constexpr, PRECISION: tl.constexpr):
    """The recomputed tile's (∂L/∂y, ∂L/∂t · sgn(y)·log2(1 + |y|)): [M, N] float32 each."""
    y = tl.dot(q, kt, input_precision=PRECISION) * c
    t, slg = _transform(y, nn, SSA)
    p = tl.exp2((tl.where(ok, t, float("-inf")) - m[:, None]) - lg2l[:, None])
    dp = tl.dot(do, vt, input_precision=PRECISION)
    dt = p * (dp - delta[:, None])
    if SSA:
        dy = dt * nn / (1.0 + tl.abs(y))
    else:
        dy = dt
    return dy, dt * slg, p


@triton.jit
def ssa_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, Bp, Np, M, DK, DV, DN,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
    smb, smh, smm, smn,
    scale, H, GROUP, Q_LEN, K_LEN, HEAD_DIM, STATS, N_BLOCKS,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, SSA: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    bz = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)
    dtype = Q.dtype.element_ty
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    c_ok = cols < K_LEN
    kv_ok = c_ok[None, :] & d_ok[:, None]
    # K and V transposed ([D, N]) for q·kᵀ and dO·vᵀ; the same tiles serve pᵀ·dO and dsᵀ·q via tl.trans.
    kt = tl.load(K + bz * skb + hk * skh + cols[None, :] * skn + offs_d[:, None] * skd, mask=kv_ok, other=0.0)
    vt = tl.load(V + bz * svb + hk * svh + cols[None, :] * svn + offs_d[:, None] * svd, mask=kv_ok, other=0.0)
    kt = operand(kt, dtype, UPCAST)
    vt = operand(vt, dtype, UPCAST)
    c = tl.load(Bp + h).to(tl.float32) * scale
    nn = tl.load(Np + h).to(tl.float32)
    q_base = Q + bz * sqb + h * sqh
    do_base = DO + bz * sdb + h * sdh
    m_base = M + bz * smb + h * smh
    row_base = bh.to(tl.int64) * Q_LEN
    dk = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dn = tl.full([BLOCK_N], 0.0, tl.float32)
    lo = 0
    if CAUSAL:  # queries before position pid_n·BLOCK_N see none of these keys
        lo = tl.maximum(0, pid_n * BLOCK_N - (K_LEN - Q_LEN)) // BLOCK_M * BLOCK_M
    for start in range(lo, Q_LEN, BLOCK_M):
        rows = start + offs_m
        r_ok = rows < Q_LEN
        qd_ok = r_ok[:, None] & d_ok[None, :]
        q = tl.load(q_base + rows[:, None] * sqm + offs_d[None, :] * sqd, mask=qd_ok, other=0.0)
        do = tl.load(do_base + rows[:, None] * sdm + offs_d[None, :] * sdd, mask=qd_ok, other=0.0)
        q = operand(q, dtype, UPCAST)
        do = operand(do, dtype, UPCAST)
        m = tl.load(LSE + row_base + rows, mask=r_ok, other=0.0)
        lg2l = tl.load(LSE + STATS + row_base + rows, mask=r_ok, other=0.0)
        delta = tl.load(DELTA + row_base + rows, mask=r_ok, other=0.0)
        ok = visible(rows, cols, Q_LEN, K_LEN, m_base, smm, smn, CAUSAL, HAS_MASK)
        dy, dn_tile, p = _dt_tile(q, kt, do, vt, m, lg2l, delta, c, nn, ok, SSA, PRECISION)
        dv += tl.dot(tl.trans(operand(p, dtype, UPCAST)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(operand(dy * c, dtype, UPCAST)), q, input_precision=PRECISION)
        if SSA:
            dn += total(dn_tile, 0)
    out = bh.to(tl.int64) * K_LEN * HEAD_DIM + cols[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk, mask=c_ok[:, None] & d_ok[None, :])
    tl.store(DV + out, dv, mask=c_ok[:, None] & d_ok[None, :])
    tl.store(DN + bh.to(tl.int64) * N_BLOCKS + pid_n, total(dn, 0) * 0.6931471805599453)


@triton.jit
def ssa_bwd_dq(
    Q, K, V, DO, LSE, DELTA, Bp, Np, M, DQ, DB,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd,
    sqgb, sqgh, sqgm, sqgd, smb, smh, smm, smn,
    scale, H, GROUP, Q_LEN, K_LEN, HEAD_DIM, STATS, M_BLOCKS,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, SSA: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    bz = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)
    dtype = Q.dtype.element_ty
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    r_ok = rows < Q_LEN
    qd_ok = r_ok[:, None] & d_ok[None, :]
    q_raw = tl.load(Q + bz * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd, qd_ok, other=0.0)
    do = tl.load(DO + bz * sdb + h * sdh + rows[:, None] * sdm + offs_d[None, :] * sdd, qd_ok, other=0.0)
    q = operand(q_raw, dtype, UPCAST)
    do = operand(do, dtype, UPCAST)
    row_base = bh.to(tl.int64) * Q_LEN
    m = tl.load(LSE + row_base + rows, mask=r_ok, other=0.0)
    lg2l = tl.load(LSE + STATS + row_base + rows, mask=r_ok, other=0.0)
    delta = tl.load(DELTA + row_base + rows, mask=r_ok, other=0.0)
    c = tl.load(Bp + h).to(tl.float32) * scale
    nn = tl.load(Np + h).to(tl.float32)
    k_base = K + bz * skb + hk * skh
    v_base = V + bz * svb + hk * svh
    m_base = M + bz * smb + h * smh
    dq = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    hi = K_LEN
    if CAUSAL:
        hi = tl.minimum(K_LEN, (pid_m + 1) * BLOCK_M + K_LEN - Q_LEN)
    for start in range(0, hi, BLOCK_N):
        cols = start + offs_n
        kv_ok = (cols < K_LEN)[None, :] & d_ok[:, None]
        kt = tl.load(k_base + cols[None, :] * skn + offs_d[:, None] * skd, mask=kv_ok, other=0.0)
        vt = tl.load(v_base + cols[None, :] * svn + offs_d[:, None] * svd, mask=kv_ok, other=0.0)
        kt = operand(kt, dtype, UPCAST)
        ok = visible(rows, cols, Q_LEN, K_LEN, m_base, smm, smn, CAUSAL, HAS_MASK)
        vt = operand(vt, dtype, UPCAST)
        dy, _, _ = _dt_tile(q, kt, do, vt, m, lg2l, delta, c, nn, ok, SSA, PRECISION)
        dq += tl.dot(operand(dy, dtype, UPCAST), tl.trans(kt), input_precision=PRECISION)
    dq = dq * c
    tl.store(DQ + bz * sqgb + h * sqgh + rows[:, None] * sqgm + offs_d[None, :] * sqgd,
             dq.to(DQ.dtype.element_ty), mask=qd_ok)  # fmt: skip
    # Σ q·dq from the float32 accumulator (db's numerator: Σ ∂L/∂y · y over this block's scores).
    tl.store(DB + bh.to(tl.int64) * M_BLOCKS + pid_m, total(total(q_raw.to(tl.float32) * dq, 1), 0))
