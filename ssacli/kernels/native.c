/* ssacli's native block math for the CPU in float32 (ssacli.kernels.native builds and loads it):
 *
 * - ssacli_row_stats: one key block of diagnose's fused statistics (ssacli.kernels.online_stats), in
 *   two passes over each row that stay in cache, where the torch path takes a dozen ops, each a full
 *   read (and often a write) of the [rows, keys] block. Per row of t (the transformed logits) and raw
 *   (the logits before the transform), with the row's visibility and running state (m, l, spread,
 *   top-k, Σx², count): pass 1 takes Σ raw² and the count over visible finite raw, the max of visible
 *   t and each chunk's max, then the running top-k from the few chunks that can hold one; pass 2
 *   writes p = e^(t - ref) with ref = max(m, block max) for p·v and merges Σp and Σp·(ref - t) into l
 *   and the spread (relative to the running max, as the torch path does), returning
 *   shrink = e^(m_old - ref) for the caller's output accumulator. A row with a NaN or +inf visible t
 *   gets NaN sums and p, as the torch path's arithmetic would.
 * - ssacli_ssa_forward / ssacli_ssa_backward: the blocked SSA kernel's forward and backward blocks
 *   (ssacli.kernels.blocked), the causal band applied in the loop.
 *
 * C99 with GCC/Clang vector extensions (W = 16 floats a step, whatever the CPU's SIMD width: the
 * compiler maps them onto AVX-512, AVX, SSE or NEON registers) and no library but libm; OpenMP over
 * rows where the compiler has it.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef W
#define W 16 /* lanes per vector step (two AVX2 or one AVX-512 register) */
#endif
#define CHUNK 64  /* columns per chunk: float partial sums fold into double, top-k skips whole chunks */
#define GROUP 16  /* chunks per top-k group */

typedef float vf __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef uint8_t vb __attribute__((vector_size(W)));
typedef double vd __attribute__((vector_size(8 * W)));

/* Lanes c .. c + W of a row: whole (c + W <= n), or the row's ragged last vector, where a load reads
 * 0 past the end, a store writes nothing there and those lanes are hidden keys. */
static inline vf load(const float *p, int64_t c) { vf v; memcpy(&v, p + c, sizeof v); return v; }
static inline void store(float *p, int64_t c, vf v) { memcpy(p + c, &v, sizeof v); }
static inline vi shown(const uint8_t *vis, int64_t c) {
    if (!vis) return (vi){0} - 1;
    vb v;
    memcpy(&v, vis + c, sizeof v);
    return __builtin_convertvector(v, vi) != 0;
}
static inline vf load_tail(const float *p, int64_t c, int64_t n) {
    vf v = {0};
    memcpy(&v, p + c, (n - c) * sizeof(float));
    return v;
}
static inline void store_tail(float *p, int64_t c, int64_t n, vf v) { memcpy(p + c, &v, (n - c) * sizeof(float)); }
static inline vi shown_tail(const uint8_t *vis, int64_t c, int64_t n) {
    vi lane;
    for (int i = 0; i < W; i++) lane[i] = i;
    vi inside = lane < (int32_t)(n - c);
    if (!vis) return inside;
    vb v = {0};
    memcpy(&v, vis + c, n - c);
    return inside & (__builtin_convertvector(v, vi) != 0);
}
static inline vf blend(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }
static inline vf splat(float x) { return (vf){0} + x; }
static inline double lanes_sum(const vd *v) { double s = 0; for (int i = 0; i < W; i++) s += (*v)[i]; return s; }
static inline vd wide(vf v) { return __builtin_convertvector(v, vd); }
static inline float lanes_max(vf v) { float m = v[0]; for (int i = 1; i < W; i++) m = v[i] > m ? v[i] : m; return m; }

/* e^x for x <= 0, W lanes: Cody-Waite reduction x = n ln2 + r with n rounded by the 1.5·2^23 trick,
 * a degree-6 polynomial for e^r on |r| <= ln2/2 (relative error ~1.5e-7, about an ulp), 2^n built in
 * the exponent bits. Below -87.3 (where e^x leaves the normal floats) it is 0; NaN lanes stay NaN. */
static inline vf exp_nonpositive(vf x) {
    const float magic = 12582912.0f;
    vi low = x < -87.3f;
    vf xc = blend(low, splat(-87.3f), x);
    vf shifted = xc * 1.44269504088896341f + magic;
    vf n = shifted - magic;
    vi ni = (vi)shifted - (vi)splat(magic);
    vf r = xc - n * 0.693359375f - n * -2.12194440e-4f;
    vf poly = splat(1.9875691500e-4f);
    poly = poly * r + 1.3981999507e-3f;
    poly = poly * r + 8.3334519073e-3f;
    poly = poly * r + 4.1665795894e-2f;
    poly = poly * r + 1.6666665459e-1f;
    poly = poly * r + 5.0000001201e-1f;
    poly = poly * r * r + r + 1.0f;
    vf scale = (vf)((ni + 127) << 23);
    return blend(low, splat(0.0f), poly * scale);
}

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

static inline int any(vi mask) {
    vi none = {0};
    return memcmp(&mask, &none, sizeof mask) != 0;
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
            if (!any(u >= floor_f)) continue;
            for (int j = 0; j < W; j++) {
                if (u[j] >= bound && (double)u[j] > threshold) {
                    insert_top(topr, k, (double)u[j]);
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
    *cmax_v = blend(u > *cmax_v, u, *cmax_v);
}

/* Pass 2 on one vector: p = e^(t - ref) (0 for hidden keys, whose gap may be inf, when masked). */
static inline vf weight_step(vf t, vf ref_v, vi vis, int masked, vf *tot_v, vf *gap_v) {
    const vf zero = {0};
    vf gap = ref_v - t;
    vf e = exp_nonpositive(-gap);
    if (masked) {
        e = blend(vis, e, zero);
        gap = blend(vis, gap, zero);
    }
    *tot_v += e;
    *gap_v += e * gap;
    return e;
}

/* The statistics of one row of n keys, visibility vr (NULL: all visible). */
static int row(const float *tr, const float *xr, const uint8_t *restrict vr,
               int64_t n, int64_t k, float *pr, double *m, double *l, double *spread,
               float *shrink, double *restrict topr, double *sq, double *cnt) {
    const vf ninf = splat(-INFINITY);
    /* Pass 1, fast sums: Σx² and the count over visible raw, the max of visible t and the chunk
     * maxima for the top-k; x·0 and t·0 summed are NaN exactly when a value is NaN or ±inf, and only
     * then does exact_counts look at the row again. */
    vd sq_d = {0};
    vi vis_v = {0};
    float tmax = -INFINITY, chunk_max[GROUP];
    vf raw_zero = {0}, t_zero = {0};
    for (int64_t g0 = 0; g0 < n; g0 += GROUP * CHUNK) {
        int chunks = 0;
        for (int64_t c0 = g0; c0 < n && c0 < g0 + GROUP * CHUNK; c0 += CHUNK) {
            int64_t c1 = c0 + CHUNK < n ? c0 + CHUNK : n;
            vf sq_v = {0}, cmax_v = ninf;
            int64_t c = c0;
            for (; c + W <= c1; c += W)
                scan_step(load(xr, c), load(tr, c), shown(vr, c), &vis_v, &sq_v, &raw_zero, &t_zero, &cmax_v);
            if (c < c1)
                scan_step(load_tail(xr, c, n), load_tail(tr, c, n), shown_tail(vr, c, n), &vis_v, &sq_v,
                          &raw_zero, &t_zero, &cmax_v);
            sq_d += wide(sq_v);
            chunk_max[chunks] = lanes_max(cmax_v);
            tmax = chunk_max[chunks] > tmax ? chunk_max[chunks] : tmax;
            chunks++;
        }
        top_group(tr, vr, g0, n, chunk_max, chunks, k, topr);
    }
    double sq_r = lanes_sum(&sq_d);
    int64_t counted = 0;
    for (int i = 0; i < W; i++) counted += vis_v[i];
    int raw_finite = 1, t_bad = 0;
    vd raw_check = wide(raw_zero), t_check = wide(t_zero);
    double check = lanes_sum(&raw_check) + lanes_sum(&t_check);
    if (check != 0.0 || !isfinite(sq_r)) /* NaN: some value is not finite (or x² overflowed) */
        exact_counts(tr, xr, vr, n, &sq_r, &counted, &raw_finite, &t_bad);
    *sq += sq_r;
    *cnt += (double)counted;
    if (t_bad) {
        for (int64_t c = 0; c < n; c++) pr[c] = NAN;
        *m = INFINITY, *l = NAN, *spread = NAN, *shrink = NAN;
        return raw_finite;
    }
    double old = *m;
    double new_max = (double)tmax > old ? (double)tmax : old;
    double ref = new_max == -INFINITY ? 0.0 : new_max;
    const vf ref_v = splat((float)ref);
    /* Pass 2: p = e^(t - ref), Σp and Σp·(ref - t). */
    vd total_d = {0}, gap_d = {0};
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
        total_d += wide(tot_v);
        gap_d += wide(gap_v);
    }
    double total = lanes_sum(&total_d), gap_sum = lanes_sum(&gap_d);
    if (old == -INFINITY) {
        *shrink = 0.0f, *l = total, *spread = gap_sum;
    } else {
        double delta = ref - old, s = exp(-delta);
        *shrink = (float)s;
        *spread = s * (*spread + delta * *l) + gap_sum;
        *l = s * *l + total;
    }
    *m = new_max;
    return raw_finite;
}

/* Rows [r0, r1) of a block of rows × C keys, over `threads` OpenMP threads where built with OpenMP
 * (then it is the libgomp torch has loaded, so the threads are torch's own intra-op pool). Row r's
 * visibility starts at vis + vis_off[r] (one byte per key), or every key is visible if vis is NULL.
 * State arrays are per row (top: k per row, descending). p may be t (and t raw): pass 1 reads a
 * row whole before pass 2 writes it. Returns 1 if every raw logit of these rows is finite, else 0. */
int ssacli_row_stats(const float *t, const float *raw,
                     const uint8_t *restrict vis, const int64_t *restrict vis_off, int64_t C,
                     int64_t r0, int64_t r1, int64_t k, float *p, double *restrict m,
                     double *restrict l, double *restrict spread, float *restrict shrink,
                     double *restrict top, double *restrict sq, double *restrict cnt, int threads) {
    int all_finite = 1;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) reduction(& : all_finite) if (threads > 1)
#endif
    for (int64_t r = r0; r < r1; r++) {
        all_finite &= row(t + r * C, raw + r * C, vis ? vis + vis_off[r] : NULL, C, k, p + r * C,
                          m + r, l + r, spread + r, shrink + r, top + r * k, sq + r, cnt + r);
    }
    (void)threads;
    return all_finite;
}

/* ---- SSA's forward block (ssacli.kernels.blocked) ------------------------------------------------ */

/* log1p(z) for z >= 0, W lanes: log(u) for u = 1 + z rounded, split as 2^e · x with x in
 * [sqrt(1/2), sqrt(2)), Cephes' degree-8 polynomial for log(x) (about an ulp). Rounding 1 + z costs at
 * most 2^-24 in absolute terms, which is all a softmax of n·log1p sees (p changes by a relative 6e-8
 * per unit of n); the usual correction (z - (u - 1)) / u would add a division per lane for
 * accuracy relative to tiny z that the weights never show. z = +inf gives +inf. */
static inline vf log1p_nonnegative(vf z) {
    vf u = 1.0f + z;
    vi bits = (vi)u;
    vi e = ((bits >> 23) & 0xff) - 126;
    vf x = (vf)((bits & 0x7fffff) | 0x3f000000); /* u's mantissa in [0.5, 1) */
    vi small = x < 0.707106781186547524f;
    e = e + small; /* small: e - 1 (true is -1) */
    x = blend(small, x + x - 1.0f, x - 1.0f);
    vf x2 = x * x;
    vf poly = splat(7.0376836292e-2f);
    poly = poly * x - 1.1514610310e-1f;
    poly = poly * x + 1.1676998740e-1f;
    poly = poly * x - 1.2420140846e-1f;
    poly = poly * x + 1.4249322787e-1f;
    poly = poly * x - 1.6668057665e-1f;
    poly = poly * x + 2.0000714765e-1f;
    poly = poly * x - 2.4999993993e-1f;
    poly = poly * x + 3.3333331174e-1f;
    vf fe = __builtin_convertvector(e, vf);
    vf y = poly * x * x2 + fe * -2.12194440e-4f - 0.5f * x2;
    vf logu = x + y + fe * 0.693359375f;
    return blend(z <= 3.40282347e38f, logu, splat(INFINITY));
}

/* t = n·sgn(y)·log1p|y| for W lanes (y = -inf gives -inf). */
static inline vf ssa_transform(vf y, vf n) {
    vi negative = y < 0.0f;
    vf mag = log1p_nonnegative((vf)((vi)y & 0x7fffffff));
    return n * blend(negative, -mag, mag);
}

/* The columns [lo, hi] row r of a block sees under the band: it is query i = r % width of the block;
 * with causal set it sees only columns <= diag + i, with window > 0 only those > diag + i - window
 * (blocked.py's bottom-right alignment, relative to the block). hi < lo: none. */
static inline void band(int64_t r, int64_t width, int64_t C, int causal, int64_t diag, int64_t window,
                        int64_t *lo, int64_t *hi) {
    int64_t i = r % width;
    *lo = 0, *hi = C - 1;
    if (causal && diag + i < *hi) *hi = diag + i;
    if (window > 0 && diag + i - window + 1 > *lo) *lo = diag + i - window + 1;
}

/* One SSA forward block (blocked.py's _forward_block): for rows [r0, r1) of y [batch, heads, width, C]
 * flattened to rows, row r in head (r / width) % heads with exponent n_head of it: m = the row's max
 * of t = n·sgn(y)·log1p|y| over visible keys (t is increasing in y, so t at the max y), p = e^(t - m)
 * (0 for hidden keys; m = -inf when none is visible) and s = Σp. Keys that y marks -inf are hidden,
 * and so are those outside the row's band (see band()). p may be y itself (each vector is read
 * before it is written). */
void ssacli_ssa_forward(const float *y, int64_t C, int64_t r0, int64_t r1,
                        const float *restrict n_head, int64_t heads, float *p, float *restrict m,
                        float *restrict s, int64_t width, int causal, int64_t diag, int64_t window,
                        int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
    for (int64_t r = r0; r < r1; r++) {
        int64_t lo, hi;
        band(r, width, C, causal, diag, window, &lo, &hi);
        float *row_p = p + r * C;
        if (hi < lo) { /* nothing visible */
            memset(row_p, 0, C * sizeof(float));
            m[r] = -INFINITY, s[r] = 0.0f;
            continue;
        }
        if (lo > 0) memset(row_p, 0, lo * sizeof(float));
        if (hi + 1 < C) memset(row_p + hi + 1, 0, (C - hi - 1) * sizeof(float));
        const float *yr = y + r * C + lo;
        float *pr = row_p + lo;
        int64_t n_keys = hi + 1 - lo;
        vf ymax_v = splat(-INFINITY);
        int64_t c = 0;
        for (; c + W <= n_keys; c += W) {
            vf v = load(yr, c);
            ymax_v = blend(v > ymax_v, v, ymax_v);
        }
        float ymax = lanes_max(ymax_v);
        for (int64_t j = c; j < n_keys; j++) ymax = yr[j] > ymax ? yr[j] : ymax;
        float n = n_head[(r / width) % heads], t_max = ssa_transform(splat(ymax), splat(n))[0]; /* as each lane computes it */
        float ref = t_max == -INFINITY ? 0.0f : t_max;
        const vf ref_v = splat(ref), n_v = splat(n);
        vd sum_d = {0};
        for (c = 0; c < n_keys; c += 4 * W) { /* 4 vectors a step: float partial sums of 64 */
            vf sum_v = {0};
            for (int64_t cc = c; cc < c + 4 * W && cc < n_keys; cc += W) {
                int whole = cc + W <= n_keys;
                vf v = whole ? load(yr, cc) : load_tail(yr, cc, n_keys);
                vf e = exp_nonpositive(ssa_transform(v, n_v) - ref_v);
                e = blend(v == -INFINITY, splat(0.0f), e);
                if (whole) {
                    store(pr, cc, e);
                } else {
                    e = blend(shown_tail(NULL, cc, n_keys), e, splat(0.0f));
                    store_tail(pr, cc, n_keys, e);
                }
                sum_v += e;
            }
            sum_d += wide(sum_v);
        }
        m[r] = t_max;
        s[r] = (float)lanes_sum(&sum_d);
    }
    (void)threads;
}

/* One SSA backward block (blocked.py's _backward_block), FlashAttention-2's recomputation: for rows
 * [r0, r1) of y [batch, heads, width, C] (as in ssacli_ssa_forward: hidden keys -inf or outside the
 * band) with dp = dO·vᵀ of the same shape, the row's saved log-sum-exp lse[r] and delta[r] =
 * rowsum(dO ∘ O): u = sgn(y)·log1p|y|, p = e^(n·u - lse), dt = p·(dp - delta); writes p over y and
 * dy = dt·n / (1 + |y|) over dp (0 where hidden), and adds Σ dt·u over the row's visible keys to
 * dn_row[r] (the caller sums rows per head: ∂L/∂n). */
void ssacli_ssa_backward(float *y, float *dp, int64_t C, int64_t r0, int64_t r1,
                         const float *restrict n_head, int64_t heads, const float *restrict lse,
                         const float *restrict delta, double *restrict dn_row, int64_t width,
                         int causal, int64_t diag, int64_t window, int threads) {
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
    for (int64_t r = r0; r < r1; r++) {
        int64_t lo, hi;
        band(r, width, C, causal, diag, window, &lo, &hi);
        float *row_y = y + r * C, *row_dp = dp + r * C;
        if (hi < lo || !(lse[r] <= 3.40282347e38f)) { /* nothing visible */
            memset(row_y, 0, C * sizeof(float));
            memset(row_dp, 0, C * sizeof(float));
            continue;
        }
        if (lo > 0) memset(row_y, 0, lo * sizeof(float)), memset(row_dp, 0, lo * sizeof(float));
        if (hi + 1 < C) {
            memset(row_y + hi + 1, 0, (C - hi - 1) * sizeof(float));
            memset(row_dp + hi + 1, 0, (C - hi - 1) * sizeof(float));
        }
        float *yr = row_y + lo, *dr = row_dp + lo;
        int64_t n_keys = hi + 1 - lo;
        const float n = n_head[(r / width) % heads];
        const vf n_v = splat(n), lse_v = splat(lse[r]), delta_v = splat(delta[r]), zero = {0};
        vd dn_d = {0};
        for (int64_t c = 0; c < n_keys; c += W) {
            int whole = c + W <= n_keys;
            vf v = whole ? load(yr, c) : load_tail(yr, c, n_keys);
            vf g = whole ? load(dr, c) : load_tail(dr, c, n_keys);
            vi shown_v = v != splat(-INFINITY);
            if (!whole) shown_v &= shown_tail(NULL, c, n_keys);
            vf mag = (vf)((vi)v & 0x7fffffff);
            vf lg = log1p_nonnegative(mag);
            vf u = blend(v < 0.0f, -lg, lg);
            vf p = blend(shown_v, exp_nonpositive(n_v * u - lse_v), zero);
            vf dt = p * (g - delta_v);
            vf dy = blend(shown_v, dt * n_v / (1.0f + mag), zero);
            dn_d += wide(blend(shown_v & (p > 0.0f), dt * u, zero));
            if (whole) {
                store(yr, c, p);
                store(dr, c, dy);
            } else {
                store_tail(yr, c, n_keys, p);
                store_tail(dr, c, n_keys, dy);
            }
        }
        dn_row[r] += lanes_sum(&dn_d);
    }
    (void)threads;
}
