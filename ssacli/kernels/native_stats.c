/* Diagnose's fused statistics on the CPU in float32 (ssacli.kernels.online_stats):
 *
 * - ssacli_row_stats: one key block of the statistics, in two passes over each row that stay in
 *   cache, where the torch path takes a dozen ops, each a full read (and often a write) of the
 *   [rows, keys] block. Per row of t (the transformed logits) and raw (the logits before the
 *   transform), with the row's visibility and running state (m, l, spread, top-k, Σx², count): pass 1
 *   takes Σ raw² and the count over visible finite raw, the max of visible t and each chunk's max,
 *   then the running top-k from the few chunks that can hold one; pass 2 writes p = e^(t - ref) with
 *   ref = max(m, block max) for p·v and merges Σp and Σp·(ref - t) into l and the spread (relative to
 *   the running max, as the torch path does), returning shrink = e^(m_old - ref) for the caller's
 *   output accumulator. A row with a NaN or +inf visible t gets NaN sums and p, as the torch path's
 *   arithmetic would.
 * - ssacli_stats_flash: the same rows for plain softmax, in one loop whose logit tiles torch's sgemm
 *   forms and whose p·v it adds, no [rows, keys] block ever written to memory.
 *
 * Both add, where asked, the position terms of native_positions.h to each row.
 */
#include "native_abi.h"
#include "native_math.h"
#include "native_positions.h"

static inline void insert_top(double *top, int64_t k, double value) {
    /* top: k values, descending; value > top[k - 1]. */
    int64_t i = k - 1;
    while (i > 0 && top[i - 1] < value) {
        top[i] = top[i - 1];
        i--;
    }
    top[i] = value;
}

/* Exact counts for a row whose fast sums met a non-finite value: Σx² and the count over visible
 * finite raw, whether every raw is finite, and whether a visible t is NaN or +inf. */
static void exact_counts(const float *tr, const float *xr, const uint8_t *vr, int64_t n,
                         double *sq, int64_t *counted, int *raw_finite, int *t_bad) {
    double s = 0.0;
    int64_t used = 0;
    *raw_finite = 1, *t_bad = 0;
    for (int64_t c = 0; c < n; c++) {
        int vis = vr ? vr[c] != 0 : 1, finite = isfinite(xr[c]);
        *raw_finite &= finite;
        if (vis && finite) s += (double)xr[c] * xr[c], used++;
        if (vis && (isnan(tr[c]) || tr[c] == INFINITY)) *t_bad = 1;
    }
    *sq = s, *counted = used;
}

/* Bit j set where lane j of u is >= floor (NaN: not set): the few lanes a top-k search looks at, one
 * mask instruction on AVX-512 and AVX, a lane loop elsewhere. */
static inline uint32_t lanes_at_least(vf u, float floor) {
#if defined(__AVX512F__) && W == 16
    __m512 x;
    memcpy(&x, &u, sizeof x);
    return (uint32_t)_mm512_cmp_ps_mask(x, _mm512_set1_ps(floor), _CMP_GE_OQ);
#elif defined(__AVX__) && W == 8
    __m256 x;
    memcpy(&x, &u, sizeof x);
    return (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(floor), _CMP_GE_OQ));
#else
    vi mask = u >= floor;
    uint32_t bits = 0;
    for (int j = 0; j < W; j++) bits |= (uint32_t)(mask[j] & 1) << j;
    return bits;
#endif
}

/* The running top-k over one group of chunks. Each chunk's max is one of the group's values, so the
 * k-th largest chunk max (bound) is at most the k-th largest value: only values >= bound, in chunks
 * whose max reaches it, can enter (about k chunks of the group), and within those chunks only the
 * vectors holding such a value are looked at lane by lane. */
static void top_group(const float *tr, const uint8_t *restrict vr, int64_t c0, int64_t n,
                      const float *chunk_max, int chunks, int64_t k, double *restrict topr) {
    const vf ninf = splat(-INFINITY);
    double threshold = topr[k - 1];
    float best[GROUP];
    int kept = 0, want = k < GROUP ? (int)k : GROUP;
    for (int i = 0; i < chunks; i++) { /* the `want` largest chunk maxima, descending */
        float v = chunk_max[i];
        if (kept == want && !(v > best[kept - 1])) continue;
        int j = kept < want ? kept++ : kept - 1;
        while (j > 0 && best[j - 1] < v) best[j] = best[j - 1], j--;
        best[j] = v;
    }
    float bound = kept == k ? best[k - 1] : -INFINITY; /* fewer than k chunks (or k > GROUP): none */
    if (!((double)best[0] > threshold)) return;
    for (int i = 0; i < chunks; i++) {
        if (!(chunk_max[i] >= bound && (double)chunk_max[i] > threshold)) continue;
        int64_t lo = c0 + (int64_t)i * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
        for (int64_t c = lo; c < hi; c += W) {
            vf u = c + W <= n ? blend(shown(vr, c), load(tr, c), ninf)
                              : blend(shown_tail(vr, c, n), load_tail(tr, c, n), ninf);
            float floor_f = (float)threshold > bound ? (float)threshold : bound;
            for (uint32_t hits = lanes_at_least(u, floor_f); hits; hits &= hits - 1) {
                float x = u[__builtin_ctz(hits)];
                if (x >= bound && (double)x > threshold) {
                    insert_top(topr, k, (double)x);
                    threshold = topr[k - 1];
                }
            }
        }
    }
}

/* Pass 1 on one vector: raw x, transformed t, visible lanes. */
static inline void scan_step(vf x, vf t, vi vis, vi *vis_v, vf *sq_v, vf *raw_zero, vf *t_zero, vf *cmax_v) {
    const vf zero = {0};
    *vis_v -= vis;
    *sq_v += blend(vis, x * x, zero);
    *raw_zero += x * 0.0f;
    *t_zero += blend(vis, t * 0.0f, zero);
    vf u = blend(vis, t, splat(-INFINITY));
    *cmax_v = vmax(u, *cmax_v);
}

/* Pass 2 on one vector: p = e^(t - ref) (0 for hidden keys, whose gap may be inf, when masked). */
static inline vf weight_step(vf t, vf ref_v, vi vis, int masked, vf *tot_v, vf *gap_v) {
    const vf zero = {0};
    vf d = t - ref_v; /* -(ref - t) exactly: the gap's negation, one fused multiply-subtract below */
    vf e = exp_nonpositive(d);
    if (masked) {
        e = blend(vis, e, zero);
        d = blend(vis, d, zero);
    }
    *tot_v += e;
    *gap_v -= e * d;
    return e;
}

/* The statistics of one row of n keys, visibility vr (NULL: all visible). With `scaled` (the flash
 * loop's rows, where t, raw and p are all that one row of logits) pass 1 first multiplies each
 * vector by `scale` and writes it back: the scaling costs no pass of its own. With P (not NULL) the
 * row's position terms (row r of P's sums; its keys from key0, its query at key position pos) too. */
static inline __attribute__((always_inline)) int row(
    const float *tr, const float *xr, const uint8_t *restrict vr, int64_t n, int64_t k, float *pr,
    double *m, double *l, double *spread, float *shrink, double *restrict topr, double *sq, double *cnt,
    float *scaled, float scale, const struct positions *P, int64_t r, int64_t key0, int64_t pos) {
    const vf ninf = splat(-INFINITY);
    /* Pass 1, fast sums: Σx² and the count over visible raw, the max of visible t and the chunk
     * maxima for the top-k; x·0 and t·0 summed are NaN exactly when a value is NaN or ±inf, and only
     * then does exact_counts look at the row again. */
    struct wide_sum sq_d = {{0}, {0}};
    vi vis_v = {0};
    float tmax = -INFINITY, chunk_max[GROUP];
    vf raw_zero = {0}, t_zero = {0};
    for (int64_t g0 = 0; g0 < n; g0 += GROUP * CHUNK) {
        int chunks = 0;
        for (int64_t c0 = g0; c0 < n && c0 < g0 + GROUP * CHUNK; c0 += CHUNK) {
            int64_t c1 = c0 + CHUNK < n ? c0 + CHUNK : n;
            vf sq_v = {0}, cmax_v = ninf;
            int64_t c = c0;
            if (scaled) {
                /* t = raw = x·scale, all visible; written back for pass 2 and the top-k. Σx² alone
                 * finds a non-finite x (inf² = inf, NaN stays NaN; an x² that overflows sends the
                 * row to exact_counts too, which counts it right), and the count is n. */
                for (; c + W <= c1; c += W) {
                    vf x = load(scaled, c) * scale;
                    store(scaled, c, x);
                    sq_v += x * x;
                    cmax_v = vmax(x, cmax_v);
                }
                if (c < c1) {
                    vf x = load_tail(scaled, c, n) * scale;
                    store_tail(scaled, c, n, x);
                    sq_v += x * x; /* the tail's lanes past n load as 0 */
                    cmax_v = vmax(blend(shown_tail(NULL, c, n), x, ninf), cmax_v);
                }
            } else {
                for (; c + W <= c1; c += W)
                    scan_step(load(xr, c), load(tr, c), shown(vr, c), &vis_v, &sq_v, &raw_zero, &t_zero, &cmax_v);
                if (c < c1)
                    scan_step(load_tail(xr, c, n), load_tail(tr, c, n), shown_tail(vr, c, n), &vis_v, &sq_v,
                              &raw_zero, &t_zero, &cmax_v);
            }
            wide_add(&sq_d, sq_v);
            chunk_max[chunks] = lanes_max(cmax_v);
            tmax = chunk_max[chunks] > tmax ? chunk_max[chunks] : tmax;
            chunks++;
        }
        top_group(tr, vr, g0, n, chunk_max, chunks, k, topr);
    }
    double sq_r = wide_total(&sq_d);
    int64_t counted = scaled ? n : 0;
    for (int i = 0; i < W; i++) counted += vis_v[i];
    int raw_finite = 1, t_bad = 0;
    struct wide_sum raw_check = {{0}, {0}}, t_check = {{0}, {0}};
    wide_add(&raw_check, raw_zero), wide_add(&t_check, t_zero);
    double check = wide_total(&raw_check) + wide_total(&t_check);
    if (check != 0.0 || !isfinite(sq_r)) /* NaN: some value is not finite (or x² overflowed) */
        exact_counts(tr, xr, vr, n, &sq_r, &counted, &raw_finite, &t_bad);
    *sq += sq_r;
    *cnt += (double)counted;
    if (t_bad) {
        for (int64_t c = 0; c < n; c++) pr[c] = NAN;
        *m = INFINITY, *l = NAN, *spread = NAN, *shrink = NAN;
        if (P) position_terms_broken(P, r);
        return raw_finite;
    }
    double old = *m;
    double new_max = (double)tmax > old ? (double)tmax : old;
    double ref = new_max == -INFINITY ? 0.0 : new_max;
    const vf ref_v = splat((float)ref);
    /* Pass 2: p = e^(t - ref), Σp and Σp·(ref - t). */
    struct wide_sum total_d = {{0}, {0}}, gap_d = {{0}, {0}};
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
        int64_t c1 = c0 + CHUNK < n ? c0 + CHUNK : n;
        vf tot_v = {0}, gap_v = {0};
        int64_t c = c0;
        if (vr)
            for (; c + W <= c1; c += W) store(pr, c, weight_step(load(tr, c), ref_v, shown(vr, c), 1, &tot_v, &gap_v));
        else
            for (; c + W <= c1; c += W) store(pr, c, weight_step(load(tr, c), ref_v, shown(vr, c), 0, &tot_v, &gap_v));
        if (c < c1)
            store_tail(pr, c, n, weight_step(load_tail(tr, c, n), ref_v, shown_tail(vr, c, n), 1, &tot_v, &gap_v));
        wide_add(&total_d, tot_v);
        wide_add(&gap_d, gap_v);
    }
    double total = wide_total(&total_d), gap_sum = wide_total(&gap_d);
    double s = 0.0;
    if (old == -INFINITY) {
        *shrink = 0.0f, *l = total, *spread = gap_sum;
    } else {
        double delta = ref - old;
        s = exp(-delta);
        *shrink = (float)s;
        *spread = s * (*spread + delta * *l) + gap_sum;
        *l = s * *l + total;
    }
    if (P) position_terms(P, r, pr, n, key0, pos, s);
    *m = new_max;
    return raw_finite;
}

/* Rows [r0, r1) of a block of rows × C keys, over `threads` OpenMP threads where built with OpenMP
 * (then it is the libgomp torch has loaded, so the threads are torch's own intra-op pool). Row r's
 * visibility starts at vis + vis_off[r] (one byte per key), or every key is visible if vis is NULL.
 * State arrays are per row (top: top_k per row, descending). p may be t (and t raw): pass 1 reads a
 * row whole before pass 2 writes it. Returns 1 if every raw logit of these rows is finite, else 0.
 * The arguments are the fields of *a (native_abi.h), copied into locals by name. */
int ssacli_row_stats(const struct ssacli_row_stats_args *a) {
    const float *t = a->t, *raw = a->raw;
    const uint8_t *restrict vis = a->vis;
    const int64_t *restrict vis_off = a->vis_off;
    const int64_t C = a->C, r0 = a->r0, r1 = a->r1, k = a->top_k;
    float *p = a->p;
    double *restrict m = a->m, *restrict l = a->l, *restrict spread = a->spread;
    float *restrict shrink = a->shrink;
    double *restrict top = a->top, *restrict sq = a->sq, *restrict cnt = a->cnt;
    const int threads = a->threads;
    const struct positions where = {a->sink_k, a->bin_width, a->key_bins, a->distance_bins, a->kb, a->db, a->dist};
    const struct positions *P = a->kb ? &where : NULL;
    const int64_t key0 = a->key0, pos0 = a->pos0, width = a->width > 0 ? a->width : 1;
    int all_finite = 1;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) reduction(& : all_finite) if (threads > 1)
#endif
    for (int64_t r = r0; r < r1; r++) {
        all_finite &= row(t + r * C, raw + r * C, vis ? vis + vis_off[r] : NULL, C, k, p + r * C,
                          m + r, l + r, spread + r, shrink + r, top + r * k, sq + r, cnt + r, NULL, 1.0f,
                          P, r, key0, pos0 + r % width);
    }
    (void)threads;
    return all_finite;
}

/* ---- diagnose's statistics in one loop: softmax rows whose logits come from BLAS tiles ----------- */

/* The fused statistics (ssacli_row_stats' row()) of softmax attention whose logits x = (q·kᵀ)·scaling
 * the scorer takes unchanged, in FlashAttention's loop: q [B, H, Q, D], k [B, Hkv, K, D],
 * v [B, Hkv, K, Dv], out [B, H, Q, Dv] float32 with element strides st (the enum above), query head
 * h on K/V head h / (H / Hkv), query i at key
 * K - Q + i, causal and window as in ssacli_ssa_flash_forward (neither: every key visible). Per task
 * (one head's block of `rows` queries) and block of `cols` keys: sgemm writes q·kᵀ into the thread's
 * tile (the products round as torch.matmul's), the scaling is applied in place (the float multiply
 * torch's `mul_(scaling)` makes), x at key 0 and at the sample's target key (target [B], or NULL) are
 * recorded, row() takes each row's visible span, the output is rescaled by the row's shrink and sgemm
 * adds p·v. The per-row state (m, l, spread, top [.., k], sq, cnt, first, t_target, x_target; all
 * [B, H, Q] float64) arrives initialized (as ssacli.kernels.online_stats starts it) and is updated
 * in place; out gets acc / l (acc where l is not > 0). Returns -1 if a tile could not be allocated,
 * else bit 0 set if every logit formed was finite and bit 1 if every output and l is. The arguments
 * are the fields of *a (native_abi.h; its k is the key tensor, top_k the k here). */
int ssacli_stats_flash(const struct ssacli_stats_flash_args *a) {
    sgemm_fn gemm = (sgemm_fn)a->gemm;
    const float *q = a->q, *key = a->k, *v = a->v;
    const int64_t *restrict st = a->strides;
    const float scaling = a->scaling;
    const int64_t B = a->B, H = a->H, Hkv = a->Hkv, Q = a->Q, K = a->K, D = a->D, Dv = a->Dv;
    const int causal = a->causal;
    const int64_t window = a->window;
    const int64_t *restrict target = a->target;
    const int64_t k = a->top_k, rows = a->rows, cols = a->cols;
    float *out = a->out;
    double *m = a->m, *l = a->l, *spread = a->spread, *top = a->top, *sq = a->sq, *cnt = a->cnt;
    double *first = a->first, *t_target = a->t_target, *x_target = a->x_target;
    const int threads = a->threads;
    const struct positions where = {a->sink_k, a->bin_width, a->key_bins, a->distance_bins, a->kb, a->db, a->dist};
    const struct positions *P = a->kb ? &where : NULL;
    const int64_t offset = K - Q, blocks = (Q + rows - 1) / rows, tasks = B * H * blocks;
    int failed = 0, all_finite = 1, all_finite_out = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(| : failed) \
    reduction(& : all_finite, all_finite_out)
#endif
    {
        float *tile = malloc(sizeof(float) * (size_t)(rows * cols + 2 * rows * Dv + rows));
        failed |= tile == NULL;
        float *acc = tile + rows * cols, *pv = acc + rows * Dv, *shrink = pv + rows * Dv;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t task = 0; task < tasks; task++) {
            if (tile == NULL) continue;
            int64_t block = blocks - 1 - task % blocks, bh = task / blocks, h = bh % H, bi = bh / H;
            int64_t hkv = h / (H / Hkv);
            int64_t r0 = block * rows, width = Q - r0 < rows ? Q - r0 : rows;
            const float *qb = q + bi * st[QB] + h * st[QH] + r0 * st[QR];
            const float *kb = key + bi * st[KB] + hkv * st[KH], *vb = v + bi * st[VB] + hkv * st[VH];
            float *ob = out + bi * st[OB] + h * st[OH] + r0 * st[OR];
            const int64_t row0 = bh * Q + r0, tg = target ? target[bi] : -1;
            int64_t lo = 0, hi = K;
            if (causal && offset + r0 + width < hi) hi = offset + r0 + width;
            if (window > 0 && offset + r0 - window + 1 > lo) lo = offset + r0 - window + 1;
            memset(acc, 0, sizeof(float) * (size_t)(width * Dv));
            for (int64_t c0 = lo; c0 < hi; c0 += cols) {
                int64_t c1 = c0 + cols < hi ? c0 + cols : hi, C = c1 - c0;
                gemm_rows_bt(gemm, (int)width, (int)C, (int)D, qb, (int)st[QR], kb + c0 * st[KR], (int)st[KR],
                             0.0f, tile, (int)C);
                for (int64_t i = 0; i < width; i++) {
                    float *x = tile + i * C;
                    const int64_t pos = offset + r0 + i, r = row0 + i;
                    int64_t rlo = 0, rhi = C - 1; /* the row's visible columns of the tile */
                    if (causal && pos - c0 < rhi) rhi = pos - c0;
                    if (window > 0 && pos - window + 1 - c0 > rlo) rlo = pos - window + 1 - c0;
                    if (rhi < rlo) { /* nothing visible here: p = 0, the running state unchanged */
                        memset(x, 0, C * sizeof(float));
                        shrink[i] = m[r] == -INFINITY ? 0.0f : 1.0f;
                        continue;
                    }

                    /* x at key 0 and the target, scaled as row() scales the span before it reads it */
                    if (c0 == 0 && rlo == 0) first[r] = x[0] * scaling;
                    if (tg >= c0 && tg < c1) {
                        int64_t j = tg - c0, shown_j = j >= rlo && j <= rhi;
                        float xt = x[j] * scaling;
                        t_target[r] = shown_j ? (double)xt : -INFINITY;
                        x_target[r] = shown_j && isfinite(xt) ? (double)xt : NAN;
                    }
                    if (rlo > 0) memset(x, 0, rlo * sizeof(float));
                    if (rhi + 1 < C) memset(x + rhi + 1, 0, (C - rhi - 1) * sizeof(float));
                    all_finite &= row(x + rlo, x + rlo, NULL, rhi + 1 - rlo, k, x + rlo, m + r, l + r,
                                      spread + r, shrink + i, top + r * k, sq + r, cnt + r, x + rlo, scaling,
                                      P, r, c0 + rlo, pos);
                }
                /* acc·shrink + p·v, rounded as the torch path's acc.mul_(shrink).add_(p @ v) */
                gemm_rows(gemm, (int)width, (int)Dv, (int)C, tile, (int)C, vb + c0 * st[VR], (int)st[VR], 0.0f,
                          pv, (int)Dv);
                for (int64_t i = 0; i < width; i++)
                    for (int64_t d = 0; d < Dv; d++) {
                        volatile float kept = acc[i * Dv + d] * shrink[i]; /* two roundings, no FMA */
                        acc[i * Dv + d] = kept + pv[i * Dv + d];
                    }
            }
            for (int64_t i = 0; i < width; i++) {
                double total = l[row0 + i];
                float denominator = total > 0.0 ? (float)total : 1.0f;
                for (int64_t d = 0; d < Dv; d++) {
                    float o = acc[i * Dv + d] / denominator;
                    ob[i * st[OR] + d] = o;
                    all_finite_out &= isfinite(o) != 0;
                }
                all_finite_out &= isfinite(total) != 0;
            }
        }
        free(tile);
    }
    (void)threads;
    return failed ? -1 : all_finite | all_finite_out << 1;
}
