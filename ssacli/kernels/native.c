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
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

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
/* a > b ? a : b per lane (b where either is NaN): one max instruction on AVX-512. */
static inline vf vmax(vf a, vf b) {
#if defined(__AVX512F__) && W == 16
    __m512 x, y;
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    x = _mm512_max_ps(x, y);
    memcpy(&a, &x, sizeof a);
    return a;
#elif defined(__AVX__) && W == 16
    __m256 x[2], y[2];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    x[0] = _mm256_max_ps(x[0], y[0]), x[1] = _mm256_max_ps(x[1], y[1]);
    memcpy(&a, x, sizeof a);
    return a;
#else
    return blend(a > b, a, b);
#endif
}
static inline double lanes_sum(const vd *v) { double s = 0; for (int i = 0; i < W; i++) s += (*v)[i]; return s; }
static inline vd wide(vf v) { return __builtin_convertvector(v, vd); }
static inline float lanes_max(vf v) {
#if defined(__AVX512F__) && W == 16
    __m512 x; /* shuffle trees here and for AVX (callers pass max-blends, which never hold NaN) */
    memcpy(&x, &v, sizeof x);
    return _mm512_reduce_max_ps(x);
#elif defined(__AVX__) && W == 16
    __m256 x[2];
    memcpy(x, &v, sizeof x);
    __m256 h = _mm256_max_ps(x[0], x[1]);
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_shuffle_ps(q, q, 1));
    return _mm_cvtss_f32(q);
#else
    float m = v[0];
    for (int i = 1; i < W; i++) m = v[i] > m ? v[i] : m;
    return m;
#endif
}

#if defined(__AVX512F__) && W == 16
/* e^x for x <= 0, W lanes, on AVX-512: Cody-Waite reduction x = n ln2 + r with n = round(x·log2 e),
 * a degree-6 polynomial for e^r on |r| <= ln2/2 (relative error ~1.5e-7, about an ulp), then
 * scalef(e^r, n) = e^r·2^n (one instruction: no exponent-bit arithmetic, no blends). Below -87.3
 * (where e^x leaves the normal floats) it is 0, never a denormal that would slow the p·v product;
 * NaN lanes stay NaN. The same values as the portable version below. */
static inline vf exp_nonpositive(vf x) {
    __m512 v;
    memcpy(&v, &x, sizeof v);
    __mmask16 kept = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ); /* >= -87.3 or NaN */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), v);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 poly = _mm512_set1_ps(1.9875691500e-4f);
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.3981999507e-3f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(8.3334519073e-3f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(4.1665795894e-2f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.6666665459e-1f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(5.0000001201e-1f));
    poly = _mm512_fmadd_ps(_mm512_mul_ps(poly, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 e = _mm512_maskz_scalef_ps(kept, poly, n);
    vf out;
    memcpy(&out, &e, sizeof out);
    return out;
}
#else
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
#endif

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
#elif defined(__AVX__) && W == 16
    __m256 lo, hi, f = _mm256_set1_ps(floor);
    memcpy(&lo, &u, sizeof lo);
    memcpy(&hi, (const char *)&u + sizeof lo, sizeof hi);
    return (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(lo, f, _CMP_GE_OQ))
           | (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(hi, f, _CMP_GE_OQ)) << 8;
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

/* The statistics of one row of n keys, visibility vr (NULL: all visible). With `scaled` (the flash
 * loop's rows, where t, raw and p are all that one row of logits) pass 1 first multiplies each
 * vector by `scale` and writes it back: the scaling costs no pass of its own. */
static inline __attribute__((always_inline)) int row(
    const float *tr, const float *xr, const uint8_t *restrict vr, int64_t n, int64_t k, float *pr,
    double *m, double *l, double *spread, float *shrink, double *restrict topr, double *sq, double *cnt,
    float *scaled, float scale) {
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
            if (scaled) { /* t = raw = x·scale, visible; written back for pass 2 and the top-k */
                for (; c + W <= c1; c += W) {
                    vf x = load(scaled, c) * scale;
                    store(scaled, c, x);
                    scan_step(x, x, shown(NULL, c), &vis_v, &sq_v, &raw_zero, &t_zero, &cmax_v);
                }
                if (c < c1) {
                    vf x = load_tail(scaled, c, n) * scale;
                    store_tail(scaled, c, n, x);
                    scan_step(x, x, shown_tail(NULL, c, n), &vis_v, &sq_v, &raw_zero, &t_zero, &cmax_v);
                }
            } else {
                for (; c + W <= c1; c += W)
                    scan_step(load(xr, c), load(tr, c), shown(vr, c), &vis_v, &sq_v, &raw_zero, &t_zero, &cmax_v);
                if (c < c1)
                    scan_step(load_tail(xr, c, n), load_tail(tr, c, n), shown_tail(vr, c, n), &vis_v, &sq_v,
                              &raw_zero, &t_zero, &cmax_v);
            }
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
                          m + r, l + r, spread + r, shrink + r, top + r * k, sq + r, cnt + r, NULL, 1.0f);
    }
    (void)threads;
    return all_finite;
}

/* ---- SSA's forward block (ssacli.kernels.blocked) ------------------------------------------------ */

#if defined(__AVX512F__) && W == 16
/* log1p(z) for z >= 0, W lanes, on AVX-512: log(u) for u = 1 + z rounded, u = 2^e · m with m in [1, 2);
 * the top 5 bits of m pick c_i = 1/LOG_INV[i] (the centre of m's 32nd of [1, 2)), both tables read by
 * one two-register permute; r = m·LOG_INV[i] - 1 (one fused rounding) is within ±1/65, where
 * r - r²/2 + r³/3 leaves 1.4e-8, and log m = LOG_C[i] + log1p(r) with LOG_C[i] = -log LOG_INV[i]
 * (about half an ulp of the result over z in [0, 1e30]; a third of the polynomial version's work).
 * Rounding 1 + z costs at most 2^-24 in absolute terms, which is all a softmax of n·log1p sees (p
 * changes by a relative 6e-8 per unit of n). z = +inf gives +inf. */
static const float LOG_INV[32] = {
    0.984615386f, 0.955223858f, 0.927536249f, 0.901408434f, 0.876712322f, 0.853333354f,
    0.83116883f, 0.810126603f, 0.790123463f, 0.771084309f, 0.752941191f, 0.735632181f,
    0.719101131f, 0.703296721f, 0.688172042f, 0.673684239f, 0.659793794f, 0.646464646f,
    0.633663356f, 0.621359229f, 0.609523833f, 0.598130822f, 0.587155938f, 0.576576591f,
    0.566371679f, 0.556521714f, 0.547008574f, 0.537815154f, 0.528925598f, 0.520325184f,
    0.512000024f, 0.503937006f
};
static const float LOG_C[32] = {
    0.015504186f, 0.0458095595f, 0.0752234012f, 0.10379681f, 0.131576359f, 0.158605009f,
    0.184922338f, 0.210564747f, 0.235566065f, 0.259957552f, 0.283768147f, 0.307025045f,
    0.32975328f, 0.351976395f, 0.373716414f, 0.394993752f, 0.41582793f, 0.436236769f, 0.456237435f,
    0.475845903f, 0.495077223f, 0.513945758f, 0.532464862f, 0.55064708f, 0.568504751f, 0.58604908f,
    0.603290796f, 0.620240331f, 0.636907518f, 0.653301299f, 0.669430614f, 0.685303986f
};

static inline vf log1p_nonnegative(vf z) {
    vf u = 1.0f + z;
    vi bits = (vi)u;
    vf e = __builtin_convertvector(((bits >> 23) & 0xff) - 127, vf);
    vf m = (vf)((bits & 0x7fffff) | 0x3f800000);
    vi top = bits >> 18; /* the permute reads only the low 5 bits: m's top 5 */
    __m512i idx;
    memcpy(&idx, &top, sizeof idx);
    __m512 inv_r = _mm512_permutex2var_ps(_mm512_loadu_ps(LOG_INV), idx, _mm512_loadu_ps(LOG_INV + 16));
    __m512 log_c = _mm512_permutex2var_ps(_mm512_loadu_ps(LOG_C), idx, _mm512_loadu_ps(LOG_C + 16));
    vf inv, c;
    memcpy(&inv, &inv_r, sizeof inv);
    memcpy(&c, &log_c, sizeof c);
    vf r = m * inv - 1.0f;
    vf poly = r * 0.333333343f - 0.5f;
    vf logu = e * 0.693359375f + (c + (poly * (r * r) + r));
    logu = e * -2.12194440e-4f + logu;
    return blend(z <= 3.40282347e38f, logu, splat(INFINITY));
}
#else
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
#endif

/* The flash forward works in base 2, where SSA's weight (1 + |y|)^(±n) / e^ref is 2^(±n·log2(1 + |y|) -
 * ref/ln 2): no ln 2 splits in the logarithm, no Cody-Waite reduction in the power. */
#if defined(__AVX512F__) && W == 16
static const float LOG2_C[32] = { /* -log2 LOG_INV[i] */
    0.0223678108f, 0.0660892203f, 0.108524427f, 0.149747148f, 0.189824566f, 0.228818655f,
    0.266786546f, 0.303780705f, 0.339849979f, 0.375039488f, 0.409390897f, 0.442943513f,
    0.475733429f, 0.507794619f, 0.539158821f, 0.569855571f, 0.599912882f, 0.629356623f,
    0.658211529f, 0.68650049f, 0.714245439f, 0.741467059f, 0.768184364f, 0.794415832f,
    0.820178986f, 0.845490098f, 0.870364666f, 0.89481771f, 0.918863297f, 0.942514539f,
    0.965784192f, 0.988684714f
};

/* log2(1 + z) for z >= 0, W lanes: as log1p_nonnegative, with log2(1 + r) = r·(log2 e)·(1 - r/2 + r²/3)
 * and the exponent added as it is. z = +inf gives +inf. */
static inline vf log2_1p_nonnegative(vf z) {
    vf u = 1.0f + z;
    vi bits = (vi)u;
    vf e = __builtin_convertvector(((bits >> 23) & 0xff) - 127, vf);
    vf m = (vf)((bits & 0x7fffff) | 0x3f800000);
    vi top = bits >> 18;
    __m512i idx;
    memcpy(&idx, &top, sizeof idx);
    __m512 inv_r = _mm512_permutex2var_ps(_mm512_loadu_ps(LOG_INV), idx, _mm512_loadu_ps(LOG_INV + 16));
    __m512 log_c = _mm512_permutex2var_ps(_mm512_loadu_ps(LOG2_C), idx, _mm512_loadu_ps(LOG2_C + 16));
    vf inv, c;
    memcpy(&inv, &inv_r, sizeof inv);
    memcpy(&c, &log_c, sizeof c);
    vf r = m * inv - 1.0f;
    vf poly = (r * 0.480898347f - 0.721347520f) * r + 1.44269504f; /* log2 e · (1/3, -1/2, 1) */
    vf log2u = e + (c + poly * r);
    return blend(z <= 3.40282347e38f, log2u, splat(INFINITY));
}

/* 2^x for x <= 0, W lanes: x = k + f with k = round(x), a degree-6 polynomial for 2^f on |f| <= 1/2
 * (relative error ~6e-9 before rounding), scalef(2^f, k). Below -126 it is 0 (no denormals); NaN
 * stays NaN. */
static inline vf exp2_nonpositive(vf x) {
    __m512 v;
    memcpy(&v, &x, sizeof v);
    __mmask16 kept = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    __m512 k = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(v, k);
    __m512 poly = _mm512_set1_ps(1.5465317935e-4f);
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.3395285364e-3f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(9.6180399297e-3f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(5.5503406681e-2f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(2.4022651101e-1f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(6.9314720007e-1f));
    poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.0f));
    __m512 e = _mm512_maskz_scalef_ps(kept, poly, k);
    vf out;
    memcpy(&out, &e, sizeof out);
    return out;
}
#else
static inline vf log2_1p_nonnegative(vf z) { return log1p_nonnegative(z) * 1.44269504088896341f; }
static inline vf exp2_nonpositive(vf x) { return exp_nonpositive(x * 0.693147180559945309f); }
#endif

/* t = n·sgn(y)·log1p|y| for W lanes (y = -inf gives -inf). */
/* sgn(y)·mag for mag >= 0 (NaN y: +mag, as the comparison says): a masked subtraction on AVX-512. */
static inline vf signed_like(vf y, vf mag) {
#if defined(__AVX512F__) && W == 16
    __m512 a, b;
    memcpy(&a, &y, sizeof a);
    memcpy(&b, &mag, sizeof b);
    b = _mm512_mask_sub_ps(b, _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps(), b);
    memcpy(&mag, &b, sizeof mag);
    return mag;
#else
    return blend(y < 0.0f, -mag, mag);
#endif
}

static inline vf ssa_transform(vf y, vf n) {
    return n * signed_like(y, log1p_nonnegative((vf)((vi)y & 0x7fffffff)));
}

/* t·log2 e = n·sgn(y)·log2(1 + |y|), the flash forward's base-2 logit. */
static inline vf ssa_transform2(vf y, vf n) {
    return n * signed_like(y, log2_1p_nonnegative((vf)((vi)y & 0x7fffffff)));
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
    vf ymax_v = splat(-INFINITY);
    int64_t c = 0;
    for (; c + W <= n_keys; c += W) {
        ymax_v = vmax(load(yr, c), ymax_v);
    }
    float ymax = lanes_max(ymax_v);
    for (int64_t j = c; j < n_keys; j++) ymax = yr[j] > ymax ? yr[j] : ymax;
    vf ymax_vec = splat(ymax), n_vec = splat(n); /* t_max as each lane computes it */
    float t_max = (base2 ? ssa_transform2(ymax_vec, n_vec) : ssa_transform(ymax_vec, n_vec))[0];
    float top = t_max > floor ? t_max : floor;
    const vf ref_v = splat(top == -INFINITY ? 0.0f : top), n_v = splat(n);
    vd sum_d = {0};
    for (c = 0; c < n_keys; c += 4 * W) { /* 4 vectors a step: float partial sums of 64 */
        vf sum_v = {0};
        for (int64_t cc = c; cc < c + 4 * W && cc < n_keys; cc += W) {
            int whole = cc + W <= n_keys;
            vf v = whole ? load(yr, cc) : load_tail(yr, cc, n_keys);
            vf e = base2 ? exp2_nonpositive(ssa_transform2(v, n_v) - ref_v)
                         : exp_nonpositive(ssa_transform(v, n_v) - ref_v);
            if (masked) e = blend(v == -INFINITY, splat(0.0f), e); /* n = 0 would make t NaN there */
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
    *sum = (float)lanes_sum(&sum_d);
    return t_max;
}

/* One SSA forward block (blocked.py's _forward_block): for rows [r0, r1) of y [batch, heads, width, C]
 * flattened to rows, row r in head (r / width) % heads with exponent n_head of it: m = the row's max
 * of t = n·sgn(y)·log1p|y| over visible keys, p = e^(t - m) (0 for hidden keys; m = -inf when none
 * is visible) and s = Σp. Keys that y marks -inf are hidden, and so are those outside the row's band
 * (see band()). p may be y itself. */
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
        m[r] = ssa_row(y + r * C, p + r * C, C, lo, hi, n_head[(r / width) % heads], -INFINITY, s + r, 1, 0);
    }
    (void)threads;
}

/* ---- SSA's whole forward in one loop (flash attention with BLAS tiles) --------------------------- */

/* Fortran BLAS sgemm (column-major), the one torch itself runs (its MKL or OpenBLAS): the caller
 * passes its address, so the products round exactly as torch.matmul's. */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *,
                         const float *, const float *, const int *, const float *, const int *,
                         const float *, float *, const int *);

/* Row-major C[m, n] = A[m, k] · B[k, n] + beta·C (row strides lda, ldb, ldc): column-major
 * Cᵀ = Bᵀ·Aᵀ, the same memory. */
static void gemm_rows(sgemm_fn gemm, int m, int n, int k, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    gemm("N", "N", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
}

/* Row-major C[m, n] = A[m, k] · B[n, k]ᵀ + beta·C (row strides lda, ldb, ldc): column-major
 * Cᵀ = (Bᵀ)ᵀ·Aᵀ, B read transposed in place, as torch.matmul reads a transposed key. */
static void gemm_rows_bt(sgemm_fn gemm, int m, int n, int k, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    gemm("T", "N", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
}

/* Element strides of the flash loops' tensors, [batch, head, row] for each of q, k, v and out (the
 * last axis is contiguous): the model's transposed projections are read where they lie. */
enum { QB, QH, QR, KB, KH, KR, VB, VH, VR, OB, OH, OR, STRIDES };

/* out = softmax(n·sgn(y)·log1p|y|) · v with y = q·kᵀ for q [B, H, Q, D] (already scaled by b·scale),
 * k [B, Hkv, K, D], v [B, Hkv, K, Dv], out [B, H, Q, Dv] float32 with element strides st (see the
 * enum above); lse [B, H, Q] contiguous; query head h reads K/V head
 * h / (H / Hkv). Query i sits at key position K - Q + i (bottom-right alignment); with causal set it
 * sees keys up to there, with window > 0 only the last `window` of those. Each task is one head's
 * block of `rows` queries: per block of `cols` keys, one sgemm writes the logits into the thread's
 * tile (it stays in cache), ssa_row turns each row into weights against the row's running max, the
 * accumulated output is rescaled and one more sgemm adds p·v. Writes out [B, H, Q, Dv] and the
 * log-sum-exp lse [B, H, Q] (+inf for a row that sees nothing; its output is 0). Returns 0, or -1 if
 * a tile could not be allocated (nothing is then written). */
int ssacli_ssa_flash_forward(void *gemm_ptr, const float *q, const float *k, const float *v,
                             const int64_t *restrict st, const float *restrict n_head, int64_t B,
                             int64_t H, int64_t Hkv, int64_t Q, int64_t K, int64_t D, int64_t Dv,
                             int causal, int64_t window, int64_t rows, int64_t cols, float *out,
                             float *lse, int threads) {
    sgemm_fn gemm = (sgemm_fn)gemm_ptr;
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
    int64_t n_keys = hi + 1 - lo;
    const vf n_v = splat(n), lse_v = splat(lse), delta_v = splat(delta), zero = {0};
    vd dn_d = {0};
    for (int64_t c = 0; c < n_keys; c += W) {
        int whole = c + W <= n_keys;
        vf v = whole ? load(yr, c) : load_tail(yr, c, n_keys);
        vf g = whole ? load(dr, c) : load_tail(dr, c, n_keys);
        vi shown_v = masked ? v != splat(-INFINITY) : (vi){0} - 1;
        if (!whole) shown_v &= shown_tail(NULL, c, n_keys);
        vf mag = (vf)((vi)v & 0x7fffffff);
        vf lg = log1p_nonnegative(mag);
        vf u = signed_like(v, lg);
        vf p = exp_nonpositive(n_v * u - lse_v);
        if (masked || !whole) p = blend(shown_v, p, zero);
        vf dt = p * (g - delta_v);
        vf dy = dt * n_v / (1.0f + mag);
        if (masked || !whole) dy = blend(shown_v, dy, zero);
        dn_d += wide(blend(shown_v & (p > 0.0f), dt * u, zero));
        if (whole) {
            store(yr, c, p);
            store(dr, c, dy);
        } else {
            store_tail(yr, c, n_keys, p);
            store_tail(dr, c, n_keys, dy);
        }
    }
    return lanes_sum(&dn_d);
}

/* One SSA backward block (blocked.py's _backward_block): for rows [r0, r1) of y [batch, heads, width, C]
 * (as in ssacli_ssa_forward: hidden keys -inf or outside the band) with dp = dO·vᵀ of the same shape,
 * the rows' saved log-sum-exp lse[r] and delta[r]: ssa_backward_row on each, its Σ dt·u added to
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
        dn_row[r] += ssa_backward_row(y + r * C, dp + r * C, C, lo, hi, n_head[(r / width) % heads], lse[r],
                                      delta[r], 1);
    }
    (void)threads;
}

/* Row-major C[m, n] = A[k, m]ᵀ · B[k, n] + beta·C (row strides lda, ldb, ldc): column-major
 * Cᵀ = Bᵀ·A, A read transposed in place. */
static void gemm_rows_at(sgemm_fn gemm, int m, int n, int k, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    gemm("N", "T", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
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
 * Returns 0, or -1 if a tile could not be allocated. */
int ssacli_ssa_flash_backward(void *gemm_ptr, const float *q, const float *k, const float *v,
                              const float *dout, const int64_t *restrict st, const float *restrict n_head,
                              const float *restrict lse, const float *restrict delta, int64_t B, int64_t H,
                              int64_t Hkv, int64_t Q, int64_t K, int64_t D, int64_t Dv, int causal,
                              int64_t window, int64_t rows, int64_t cols, float *dq, float *dk_h,
                              float *dv_h, double *dn, int threads) {
    sgemm_fn gemm = (sgemm_fn)gemm_ptr;
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
 * else bit 0 set if every logit formed was finite and bit 1 if every output and l is. */
int ssacli_stats_flash(void *gemm_ptr, const float *q, const float *key, const float *v,
                       const int64_t *restrict st, float scaling,
                       int64_t B, int64_t H, int64_t Hkv, int64_t Q, int64_t K, int64_t D, int64_t Dv,
                       int causal, int64_t window, const int64_t *restrict target, int64_t k,
                       int64_t rows, int64_t cols, float *out, double *m, double *l, double *spread,
                       double *top, double *sq, double *cnt, double *first, double *t_target,
                       double *x_target, int threads) {
    sgemm_fn gemm = (sgemm_fn)gemm_ptr;
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
                                      spread + r, shrink + i, top + r * k, sq + r, cnt + r, x + rlo, scaling);
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
