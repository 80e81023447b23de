/* SSA attention on the CPU in float32 (ssacli.kernels.blocked):
 *
 * - ssacli_ssa_forward / ssacli_ssa_backward: the block loop's forward and backward blocks (the
 *   transform, causal band, max, exp and sums; the recomputed weights and ∂L/∂y, ∂L/∂n), between
 *   torch's matmuls; they serve mask tensors and dropout;
 * - ssacli_ssa_flash_forward / ssacli_ssa_flash_backward: the whole forward and backward as one loop
 *   each (FlashAttention's and FlashAttention-2's), their tiles formed by torch's sgemm and reduced
 *   while they sit in cache.
 */
#include "native_abi.h"
#include "native_math.h"

/* One row of SSA's forward math: keys [lo, hi] of the row's C are in its band (with `masked`, those y
 * marks -inf are hidden too: p = 0 there even for n = 0, where t would be NaN). Writes p = e^(t - ref) over the row (0 for hidden keys and outside the band) with
 * t = n·sgn(y)·log1p|y| and ref = the larger of floor and t's max over visible keys (0 when both are
 * -inf); stores Σp in *sum and returns t's max (-inf: nothing visible). t is increasing in y, so t's
 * max is t at the max y. p may be y itself (each vector is read before it is written). */
static inline __attribute__((always_inline)) float ssa_row(
    const float *y, float *p, int64_t C, int64_t lo, int64_t hi, float n, float floor, float *sum, int masked,
    int base2) {
    if (hi < lo) { /* nothing visible */
        memset(p, 0, C * sizeof(float));
        *sum = 0.0f;
        return -INFINITY;
    }
    if (lo > 0) memset(p, 0, lo * sizeof(float));
    if (hi + 1 < C) memset(p + hi + 1, 0, (C - hi - 1) * sizeof(float));
    const float *yr = y + lo;
    float *pr = p + lo;
    int64_t n_keys = hi + 1 - lo;
    int64_t c = 0;
#if W < 16
    /* four running maxima below AVX-512: one would wait on each max instruction's latency, a tenth
     * of the AVX2 row's time (the max is exact in any order) */
    vf ymax_v[4] = {splat(-INFINITY), splat(-INFINITY), splat(-INFINITY), splat(-INFINITY)};
    for (; c + 4 * W <= n_keys; c += 4 * W)
        for (int j = 0; j < 4; j++) ymax_v[j] = vmax(load(yr, c + j * W), ymax_v[j]);
    for (; c + W <= n_keys; c += W) ymax_v[0] = vmax(load(yr, c), ymax_v[0]);
    float ymax = lanes_max(vmax(vmax(ymax_v[0], ymax_v[1]), vmax(ymax_v[2], ymax_v[3])));
#else
    vf ymax_v = splat(-INFINITY);
    for (; c + W <= n_keys; c += W) {
        ymax_v = vmax(load(yr, c), ymax_v);
    }
    float ymax = lanes_max(ymax_v);
#endif
    for (int64_t j = c; j < n_keys; j++) ymax = yr[j] > ymax ? yr[j] : ymax;
    vf ymax_vec = splat(ymax), n_vec = splat(n); /* t_max as each lane computes it */
    float t_max = (base2 ? ssa_transform2(ymax_vec, n_vec) : ssa_transform(ymax_vec, n_vec))[0];
    float top = t_max > floor ? t_max : floor;
    const vf ref_v = splat(top == -INFINITY ? 0.0f : top), n_v = splat(n);
    struct wide_sum sum_d = {{0}, {0}};
    vf sum_v = {0};
    /* whole vectors, float partial sums of 4 folded into double; then the row's ragged last vector */
    for (c = 0; c + W <= n_keys; c += W) {
        vf v = load(yr, c);
        vf e = base2 ? exp2_nonpositive(ssa_transform2(v, n_v) - ref_v)
                     : exp_nonpositive(ssa_transform(v, n_v) - ref_v);
        if (masked) e = blend(v == -INFINITY, splat(0.0f), e); /* n = 0 would make t NaN there */
        store(pr, c, e);
        sum_v += e;
        if ((c / W) % 4 == 3) wide_add(&sum_d, sum_v), sum_v = (vf){0};
    }
    if (c < n_keys) {
        vf v = load_tail(yr, c, n_keys);
        vf e = base2 ? exp2_nonpositive(ssa_transform2(v, n_v) - ref_v)
                     : exp_nonpositive(ssa_transform(v, n_v) - ref_v);
        if (masked) e = blend(v == -INFINITY, splat(0.0f), e);
        e = blend(shown_tail(NULL, c, n_keys), e, splat(0.0f));
        store_tail(pr, c, n_keys, e);
        sum_v += e;
    }
    wide_add(&sum_d, sum_v);
    *sum = (float)wide_total(&sum_d);
    return t_max;
}

/* One SSA forward block (blocked.py's _forward_block): for rows [r0, r1) of y [batch, heads, width, C]
 * flattened to rows, row r in head (r / width) % heads with exponent n_head of it: m = the row's max
 * of t = n·sgn(y)·log1p|y| over visible keys, p = e^(t - m) (0 for hidden keys; m = -inf when none
 * is visible) and s = Σp. Keys that y marks -inf are hidden, and so are those outside the row's band
 * (see band()). p may be y itself. Returns 0. The arguments are the fields of *a (native_abi.h). */
int ssacli_ssa_forward(const struct ssacli_ssa_forward_args *a) {
    const float *y = a->y;
    const int64_t C = a->C, r0 = a->r0, r1 = a->r1, heads = a->heads;
    const float *restrict n_head = a->n_head;
    float *p = a->p, *restrict m = a->m, *restrict s = a->s;
    const int64_t width = a->width, diag = a->diag, window = a->window;
    const int causal = a->causal, threads = a->threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
    for (int64_t r = r0; r < r1; r++) {
        int64_t lo, hi;
        band(r, width, C, causal, diag, window, &lo, &hi);
        m[r] = ssa_row(y + r * C, p + r * C, C, lo, hi, n_head[(r / width) % heads], -INFINITY, s + r, 1, 0);
    }
    (void)threads;
    return 0;
}

/* ---- SSA's whole forward in one loop (FlashAttention's, with sgemm tiles) -------------------- */

/* out = softmax(n·sgn(y)·log1p|y|) · v with y = q·kᵀ for q [B, H, Q, D] (already scaled by b·scale),
 * k [B, Hkv, K, D], v [B, Hkv, K, Dv], out [B, H, Q, Dv] float32 with element strides st (see the
 * enum above); lse [B, H, Q] contiguous; query head h reads K/V head
 * h / (H / Hkv). Query i sits at key position K - Q + i (bottom-right alignment); with causal set it
 * sees keys up to there, with window > 0 only the last `window` of those. Each task is one head's
 * block of `rows` queries: per block of `cols` keys, one sgemm writes the logits into the thread's
 * tile (it stays in cache), ssa_row turns each row into weights against the row's running max, the
 * accumulated output is rescaled and one more sgemm adds p·v. Writes out [B, H, Q, Dv] and the
 * log-sum-exp lse [B, H, Q] (+inf for a row that sees nothing; its output is 0). Returns 0, or -1 if
 * a tile could not be allocated (nothing is then written). The arguments are the fields of *a
 * (native_abi.h). */
int ssacli_ssa_flash_forward(const struct ssacli_ssa_flash_forward_args *a) {
    sgemm_fn gemm = (sgemm_fn)a->gemm;
    const float *q = a->q, *k = a->k, *v = a->v;
    const int64_t *restrict st = a->strides;
    const float *restrict n_head = a->n_head;
    const int64_t B = a->B, H = a->H, Hkv = a->Hkv, Q = a->Q, K = a->K, D = a->D, Dv = a->Dv;
    const int causal = a->causal, threads = a->threads;
    const int64_t window = a->window, rows = a->rows, cols = a->cols;
    float *out = a->out, *lse = a->lse;
    const int64_t offset = K - Q, blocks = (Q + rows - 1) / rows, tasks = B * H * blocks;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : failed)
#endif
    {
        float *tile = malloc(sizeof(float) * (size_t)(rows * cols + rows * Dv + 3 * rows));
        failed |= tile == NULL;
        float *acc = tile + rows * cols, *run_max = acc + rows * Dv, *run_sum = run_max + rows,
              *sums = run_sum + rows;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t task = 0; task < tasks; task++) {
            if (tile == NULL) continue;
            /* the last query blocks first: under causal they are the longest, dynamic scheduling
             * then balances the short ones across threads */
            int64_t block = blocks - 1 - task % blocks, bh = task / blocks, h = bh % H;
            int64_t bi = bh / H, hkv = h / (H / Hkv);
            int64_t r0 = block * rows, width = Q - r0 < rows ? Q - r0 : rows;
            const float *qb = q + bi * st[QB] + h * st[QH] + r0 * st[QR];
            const float *kb = k + bi * st[KB] + hkv * st[KH], *vb = v + bi * st[VB] + hkv * st[VH];
            float *ob = out + bi * st[OB] + h * st[OH] + r0 * st[OR], *lb = lse + bh * Q + r0, n = n_head[h];
            int64_t lo = 0, hi = K; /* the keys any row of the block sees: [lo, hi) */
            if (causal && offset + r0 + width < hi) hi = offset + r0 + width;
            if (window > 0 && offset + r0 - window + 1 > lo) lo = offset + r0 - window + 1;
            memset(acc, 0, sizeof(float) * (size_t)(width * Dv));
            for (int64_t i = 0; i < width; i++) run_max[i] = -INFINITY, run_sum[i] = 0.0f;
            for (int64_t c0 = lo; c0 < hi; c0 += cols) {
                int64_t c1 = c0 + cols < hi ? c0 + cols : hi, C = c1 - c0;
                gemm_rows_bt(gemm, (int)width, (int)C, (int)D, qb, (int)st[QR], kb + c0 * st[KR], (int)st[KR],
                             0.0f, tile, (int)C);
                for (int64_t i = 0; i < width; i++) {
                    int64_t rlo, rhi;
                    band(i, width, C, causal, offset + r0 - c0, window, &rlo, &rhi);
                    float old = run_max[i];
                    /* run_max in base 2 (t·log2 e): see log2_1p_nonnegative */
                    float t_max = ssa_row(tile + i * C, tile + i * C, C, rlo, rhi, n, old, sums + i, 0, 1);
                    float top = t_max > old ? t_max : old;
                    if (old != -INFINITY && top > old) { /* rescale what came before to the new max */
                        float shrink = exp2f(old - top);
                        for (int64_t d = 0; d < Dv; d++) acc[i * Dv + d] *= shrink;
                        run_sum[i] *= shrink;
                    }
                    run_max[i] = top;
                    run_sum[i] += sums[i];
                }
                gemm_rows(gemm, (int)width, (int)Dv, (int)C, tile, (int)C, vb + c0 * st[VR], (int)st[VR], 1.0f,
                          acc, (int)Dv);
            }
            for (int64_t i = 0; i < width; i++) {
                int seen = run_sum[i] > 0.0f;
                float inv = seen ? 1.0f / run_sum[i] : 0.0f;
                for (int64_t d = 0; d < Dv; d++) ob[i * st[OR] + d] = acc[i * Dv + d] * inv;
                lb[i] = seen ? (float)(0.69314718055994531 * ((double)run_max[i] + log2((double)run_sum[i])))
                             : INFINITY;
            }
        }
        free(tile);
    }
    (void)threads;
    return failed ? -1 : 0;
}

/* ---- SSA's backward ---------------------------------------------------------------------------- */

/* 1 / x for x >= 1, W lanes: on AVX-512 the 14-bit estimate and one Newton step (within 2^-27
 * relative, where a division costs as much as a dozen other instructions); a division elsewhere. */
static inline vf reciprocal(vf x) {
#if defined(__AVX512F__) && W == 16
    __m512 a, r;
    memcpy(&a, &x, sizeof a);
    r = _mm512_rcp14_ps(a);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(a, r, _mm512_set1_ps(2.0f)));
    memcpy(&x, &r, sizeof x);
    return x;
#else
    return 1.0f / x;
#endif
}

/* One vector of ssa_backward_row: p and dy for keys y with dO·vᵀ g (lanes outside `shown` 0), and
 * dt·u where p > 0 added to *dn. */
static inline __attribute__((always_inline)) void backward_step(vf v, vf g, vi shown_v, int apply, vf n_v,
                                                                vf lse_v, vf delta_v, vf *p_out, vf *dy_out,
                                                                vf *dn) {
    const vf zero = {0};
    vf mag = (vf)((vi)v & 0x7fffffff);
    vf u = signed_like(v, log1p_nonnegative(mag));
    vf p = exp_nonpositive(n_v * u - lse_v);
    if (apply) p = blend(shown_v, p, zero);
    vf dt = p * (g - delta_v);
    vf dy = dt * n_v * reciprocal(1.0f + mag);
    if (apply) dy = blend(shown_v, dy, zero);
    vi counted = p > 0.0f;
    if (apply) counted &= shown_v;
    *dn += blend(counted, dt * u, zero);
    *p_out = p, *dy_out = dy;
}

/* One row of SSA's backward math (FlashAttention-2's recomputation): keys [lo, hi] of the row's C are
 * in its band (with `masked`, those y marks -inf are hidden too); lse and delta = rowsum(dO ∘ O) are
 * the row's. u = sgn(y)·log1p|y|, p = e^(n·u - lse), dt = p·(dp - delta): writes p over y and
 * dy = dt·n / (1 + |y|) over dp (0 where hidden and outside the band) and returns Σ dt·u over the
 * visible keys (the row's part of ∂L/∂n). */
static double ssa_backward_row(float *y, float *dp, int64_t C, int64_t lo, int64_t hi, float n, float lse,
                               float delta, int masked) {
    if (hi < lo || !(lse <= 3.40282347e38f)) { /* nothing visible */
        memset(y, 0, C * sizeof(float));
        memset(dp, 0, C * sizeof(float));
        return 0.0;
    }
    if (lo > 0) memset(y, 0, lo * sizeof(float)), memset(dp, 0, lo * sizeof(float));
    if (hi + 1 < C) {
        memset(y + hi + 1, 0, (C - hi - 1) * sizeof(float));
        memset(dp + hi + 1, 0, (C - hi - 1) * sizeof(float));
    }
    float *yr = y + lo, *dr = dp + lo;
    int64_t n_keys = hi + 1 - lo, c = 0;
    const vf n_v = splat(n), lse_v = splat(lse), delta_v = splat(delta);
    const vi all = (vi){0} - 1;
    struct wide_sum dn_d = {{0}, {0}};
    vf dn_v = {0}, p, dy;
    for (; c + W <= n_keys; c += W) { /* whole vectors; float partial sums of 4 folded into double */
        vf v = load(yr, c);
        backward_step(v, load(dr, c), masked ? v != splat(-INFINITY) : all, masked, n_v, lse_v, delta_v,
                      &p, &dy, &dn_v);
        store(yr, c, p);
        store(dr, c, dy);
        if ((c / W) % 4 == 3) wide_add(&dn_d, dn_v), dn_v = (vf){0};
    }
    if (c < n_keys) { /* the ragged last vector */
        vf v = load_tail(yr, c, n_keys);
        vi shown_v = shown_tail(NULL, c, n_keys);
        if (masked) shown_v &= v != splat(-INFINITY);
        backward_step(v, load_tail(dr, c, n_keys), shown_v, 1, n_v, lse_v, delta_v, &p, &dy, &dn_v);
        store_tail(yr, c, n_keys, p);
        store_tail(dr, c, n_keys, dy);
    }
    wide_add(&dn_d, dn_v);
    return wide_total(&dn_d);
}

/* One SSA backward block (blocked.py's _backward_block): for rows [r0, r1) of y [batch, heads, width, C]
 * (as in ssacli_ssa_forward: hidden keys -inf or outside the band) with dp = dO·vᵀ of the same shape,
 * the rows' saved log-sum-exp lse[r] and delta[r]: ssa_backward_row on each, its Σ dt·u added to
 * dn_row[r] (the caller sums rows per head: ∂L/∂n). Returns 0. The arguments are the fields of *a
 * (native_abi.h). */
int ssacli_ssa_backward(const struct ssacli_ssa_backward_args *a) {
    float *y = a->y, *dp = a->dp;
    const int64_t C = a->C, r0 = a->r0, r1 = a->r1, heads = a->heads;
    const float *restrict n_head = a->n_head, *restrict lse = a->lse, *restrict delta = a->delta;
    double *restrict dn_row = a->dn_row;
    const int64_t width = a->width, diag = a->diag, window = a->window;
    const int causal = a->causal, threads = a->threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
    for (int64_t r = r0; r < r1; r++) {
        int64_t lo, hi;
        band(r, width, C, causal, diag, window, &lo, &hi);
        dn_row[r] += ssa_backward_row(y + r * C, dp + r * C, C, lo, hi, n_head[(r / width) % heads], lse[r],
                                      delta[r], 1);
    }
    (void)threads;
    return 0;
}

/* SSA's whole backward in one loop per query head (FlashAttention-2's, on torch's sgemm): for q, k, v
 * as in ssacli_ssa_flash_forward, dO [B, H, Q, Dv] (element strides st[OB..OR]), the forward's lse
 * and delta = rowsum(dO ∘ O) ([B, H, Q] contiguous): each task is one query head h; per block of
 * `cols` keys (its dk, dv tiles kept in the thread's cache) and per block of `rows` queries that see
 * any of them, sgemm recomputes y = q·kᵀ and dp = dO·vᵀ into tiles, ssa_backward_row turns them into p
 * and dy, and sgemm adds pᵀ·dO to dv, dyᵀ·q to dk and dy·k to the head's dq rows. Writes dq
 * [B, H, Q, D] (contiguous, zeroed by the caller), the head's dk and dv into dk_h [B, H, K, D] and
 * dv_h [B, H, K, Dv] (contiguous; the caller sums the heads that share a K/V head) and Σ dt·u into
 * dn[b·H + h]. One task owns everything it writes, so the result does not depend on the threads.
 * Returns 0, or -1 if a tile could not be allocated. The arguments are the fields of *a
 * (native_abi.h). */
int ssacli_ssa_flash_backward(const struct ssacli_ssa_flash_backward_args *a) {
    sgemm_fn gemm = (sgemm_fn)a->gemm;
    const float *q = a->q, *k = a->k, *v = a->v, *dout = a->dout;
    const int64_t *restrict st = a->strides;
    const float *restrict n_head = a->n_head, *restrict lse = a->lse, *restrict delta = a->delta;
    const int64_t B = a->B, H = a->H, Hkv = a->Hkv, Q = a->Q, K = a->K, D = a->D, Dv = a->Dv;
    const int causal = a->causal, threads = a->threads;
    const int64_t window = a->window, rows = a->rows, cols = a->cols;
    float *dq = a->dq, *dk_h = a->dk_h, *dv_h = a->dv_h;
    double *dn = a->dn;
    const int64_t offset = K - Q, tasks = B * H;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : failed)
#endif
    {
        float *tile = malloc(sizeof(float) * (size_t)(2 * rows * cols + cols * (D + Dv)));
        failed |= tile == NULL;
        float *dpt = tile + rows * cols, *dk_t = dpt + rows * cols, *dv_t = dk_t + cols * D;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t task = 0; task < tasks; task++) {
            if (tile == NULL) continue;
            const int64_t bi = task / H, h = task % H, hkv = h / (H / Hkv);
            const float *qh = q + bi * st[QB] + h * st[QH], *kh = k + bi * st[KB] + hkv * st[KH];
            const float *vh = v + bi * st[VB] + hkv * st[VH], *oh = dout + bi * st[OB] + h * st[OH];
            const float *lh = lse + task * Q, *delh = delta + task * Q, n = n_head[h];
            float *dqh = dq + task * Q * D, *dkh = dk_h + task * K * D, *dvh = dv_h + task * K * Dv;
            double dn_sum = 0.0;
            for (int64_t c0 = 0; c0 < K; c0 += cols) {
                const int64_t c1 = c0 + cols < K ? c0 + cols : K, C = c1 - c0;
                /* the queries that see a key of [c0, c1): causal, pos >= c0; window, pos < c1 - 1 + window */
                int64_t q_lo = 0, q_hi = Q;
                if (causal && c0 - offset > q_lo) q_lo = c0 - offset;
                if (window > 0 && c1 - 1 + window - offset < q_hi) q_hi = c1 - 1 + window - offset;
                memset(dk_t, 0, sizeof(float) * (size_t)(C * D));
                memset(dv_t, 0, sizeof(float) * (size_t)(C * Dv));
                for (int64_t r0 = q_lo - q_lo % rows; r0 < q_hi; r0 += rows) {
                    const int64_t width = (q_hi - r0 < rows ? q_hi - r0 : rows);
                    const float *qb = qh + r0 * st[QR], *ob = oh + r0 * st[OR];
                    gemm_rows_bt(gemm, (int)width, (int)C, (int)D, qb, (int)st[QR], kh + c0 * st[KR],
                                 (int)st[KR], 0.0f, tile, (int)C);
                    gemm_rows_bt(gemm, (int)width, (int)C, (int)Dv, ob, (int)st[OR], vh + c0 * st[VR],
                                 (int)st[VR], 0.0f, dpt, (int)C);
                    for (int64_t i = 0; i < width; i++) {
                        int64_t rlo, rhi;
                        band(i, width, C, causal, offset + r0 - c0, window, &rlo, &rhi);
                        dn_sum += ssa_backward_row(tile + i * C, dpt + i * C, C, rlo, rhi, n, lh[r0 + i],
                                                   delh[r0 + i], 0);
                    }
                    gemm_rows_at(gemm, (int)C, (int)Dv, (int)width, tile, (int)C, ob, (int)st[OR], 1.0f, dv_t,
                                 (int)Dv);
                    gemm_rows_at(gemm, (int)C, (int)D, (int)width, dpt, (int)C, qb, (int)st[QR], 1.0f, dk_t,
                                 (int)D);
                    gemm_rows(gemm, (int)width, (int)D, (int)C, dpt, (int)C, kh + c0 * st[KR], (int)st[KR],
                              1.0f, dqh + r0 * D, (int)D);
                }
                memcpy(dkh + c0 * D, dk_t, sizeof(float) * (size_t)(C * D));
                memcpy(dvh + c0 * Dv, dv_t, sizeof(float) * (size_t)(C * Dv));
            }
            dn[task] = dn_sum;
        }
        free(tile);
    }
    (void)threads;
    return failed ? -1 : 0;
}
