/* ssacli's native kernels for the CPU in float32: what they share (ssacli.kernels.native builds
 * native_stats.c and native_ssa.c, which include this header, into one library).
 *
 * - vector types and helpers: C99 with GCC/Clang vector extensions, W floats a step: one register of
 *   the CPU's SIMD width (16 on AVX-512, 8 on AVX, 4 on SSE or NEON), with AVX-512 and AVX intrinsics
 *   where a generic form would cost several instructions;
 * - e^x, log1p and their base-2 forms, about an ulp each;
 * - SSA's transform, the causal band of a block, and the row-major products on torch's own sgemm
 *   that the one-loop kernels form their tiles with.
 *
 * No library but libm; OpenMP over rows or tasks where the compiler has it.
 */
#ifndef SSACLI_NATIVE_MATH_H
#define SSACLI_NATIVE_MATH_H
#include <math.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* Lanes per vector step: one register. Wider than the register, GCC lowers the vector comparisons
 * (x < c, a > b) lane by lane into scalar compares and branches: with W = 16 on AVX2 SSA's row math
 * ran 12x slower than on AVX-512 (docs/performance.md, "Instruction sets"). */
#ifndef W
#if defined(__AVX512F__)
#define W 16
#elif defined(__AVX__)
#define W 8
#else
#define W 4
#endif
#endif
#define CHUNK 64  /* columns per chunk: float partial sums fold into double, top-k skips whole chunks */
#define GROUP 16  /* chunks per top-k group */

/* AVX2 with FMA at one register a step: the 8-entry table logarithm and exp2 below (vpermps, FMA). */
#if defined(__AVX2__) && defined(__FMA__) && W == 8
#define SSACLI_AVX2_TABLES 1
#else
#define SSACLI_AVX2_TABLES 0
#endif

typedef float vf __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef uint8_t vb __attribute__((vector_size(W)));

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
/* The ragged last vector by a masked load and store where the instruction set has them: the same
 * lanes (0 past the end) as a memcpy into a zeroed vector, without the store-forwarding stall that
 * reloading memcpy's piecewise stores as one register costs every short row piece (a fifth of the
 * AVX2 position terms' time, docs/performance.md). */
#if defined(__AVX512F__) && W == 16
#define TAIL_MASK(c, n) ((__mmask16)((1u << ((n) - (c))) - 1u))
#define TAIL_LOAD(p, c, n) _mm512_maskz_loadu_ps(TAIL_MASK(c, n), (p) + (c))
#define TAIL_STORE(p, c, n, r) _mm512_mask_storeu_ps((p) + (c), TAIL_MASK(c, n), r)
typedef __m512 tail_reg;
#elif defined(__AVX__) && W == 8
static inline __m256i tail_mask(int64_t c, int64_t n) {
    const vi lane = {0, 1, 2, 3, 4, 5, 6, 7};
    vi inside = lane < (int32_t)(n - c);
    __m256i m;
    memcpy(&m, &inside, sizeof m);
    return m;
}
#define TAIL_LOAD(p, c, n) _mm256_maskload_ps((p) + (c), tail_mask(c, n))
#define TAIL_STORE(p, c, n, r) _mm256_maskstore_ps((p) + (c), tail_mask(c, n), r)
typedef __m256 tail_reg;
#endif
#ifdef TAIL_LOAD
static inline vf load_tail(const float *p, int64_t c, int64_t n) {
    tail_reg r = TAIL_LOAD(p, c, n);
    vf v;
    memcpy(&v, &r, sizeof v);
    return v;
}
static inline void store_tail(float *p, int64_t c, int64_t n, vf v) {
    tail_reg r;
    memcpy(&r, &v, sizeof r);
    TAIL_STORE(p, c, n, r);
}
#else
static inline vf load_tail(const float *p, int64_t c, int64_t n) {
    vf v = {0};
    memcpy(&v, p + c, (n - c) * sizeof(float));
    return v;
}
static inline void store_tail(float *p, int64_t c, int64_t n, vf v) { memcpy(p + c, &v, (n - c) * sizeof(float)); }
#endif
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
/* The register a vf is, and its max instruction, where intrinsics name them. */
#if defined(__AVX512F__) && W == 16
typedef __m512 vreg;
#define VREG_MAX _mm512_max_ps
#elif defined(__AVX__) && W == 8
typedef __m256 vreg;
#define VREG_MAX _mm256_max_ps
#endif
/* a > b ? a : b per lane (b where either is NaN): one max instruction on AVX-512 and AVX. */
static inline vf vmax(vf a, vf b) {
#ifdef VREG_MAX
    vreg x, y;
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    x = VREG_MAX(x, y);
    memcpy(&a, &x, sizeof a);
    return a;
#else
    return blend(a > b, a, b);
#endif
}
/* Float partial sums folded into double: lane i of v added to lane i of the sum, then the lanes
 * summed in order 0 .. W - 1. The sum is two registers of W/2 doubles, never one vector of W doubles:
 * that is two registers wide, and GCC kept it on the stack, writing its halves and reading it back
 * whole, a stalled store-to-load forward at every fold (the largest cost of the position terms on
 * AVX-512, docs/performance.md). */
typedef float vfh __attribute__((vector_size(2 * W)));
typedef double vdh __attribute__((vector_size(4 * W)));
struct wide_sum { vdh lo, hi; };
#if W == 16
#define LOW_LANES 0, 1, 2, 3, 4, 5, 6, 7
#define HIGH_LANES 8, 9, 10, 11, 12, 13, 14, 15
#elif W == 8
#define LOW_LANES 0, 1, 2, 3
#define HIGH_LANES 4, 5, 6, 7
#else
#define LOW_LANES 0, 1
#define HIGH_LANES 2, 3
#endif
static inline void wide_add(struct wide_sum *acc, vf v) {
    acc->lo += __builtin_convertvector((vfh)__builtin_shufflevector(v, v, LOW_LANES), vdh);
    acc->hi += __builtin_convertvector((vfh)__builtin_shufflevector(v, v, HIGH_LANES), vdh);
}
static inline double wide_total(const struct wide_sum *acc) {
    double s = 0;
    for (int i = 0; i < W / 2; i++) s += acc->lo[i];
    for (int i = 0; i < W / 2; i++) s += acc->hi[i];
    return s;
}
static inline float lanes_max(vf v) {
#if defined(__AVX512F__) && W == 16
    __m512 x; /* shuffle trees here and for AVX (callers pass max-blends, which never hold NaN) */
    memcpy(&x, &v, sizeof x);
    return _mm512_reduce_max_ps(x);
#elif defined(__AVX__) && W == 8
    __m256 h;
    memcpy(&h, &v, sizeof h);
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

/* ---- SSA's transform ------------------------------------------------------------------------- */

/* The table logarithms' u = 1 + z = 2^e·m with m in [1, 2): returns m, writes e and u's bits (whose
 * mantissa's top bits index the tables). */
static inline vf exponent_split(vf z, vf *e, vi *bits) {
    vf u = 1.0f + z;
    *bits = (vi)u;
    *e = __builtin_convertvector(((*bits >> 23) & 0xff) - 127, vf);
    return (vf)((*bits & 0x7fffff) | 0x3f800000);
}

#if defined(__AVX512F__) && W == 16
/* log1p(z) for z >= 0, W lanes, on AVX-512: log(u) for u = 1 + z rounded, u = 2^e · m with m in [1, 2);
 * the top 5 bits of m pick c_i = 1/LOG_INV[i] (the centre of m's 32nd of [1, 2)), both tables read by
 * one two-register permute; r = m·LOG_INV[i] - 1 (one fused rounding) is within ±1/65, where
 * r - r²/2 + r³/3 leaves 1.4e-8, and log m = LOG_C[i] + log1p(r) with LOG_C[i] = -log LOG_INV[i]
 * (about half an ulp of the result over z in [0, 1e30]; a third of the polynomial version's work).
 * Rounding 1 + z costs at most 2^-24 in absolute terms, which is all a softmax of n·log1p sees (p
 * changes by a relative 6e-8 per unit of n). z = +inf gives +inf. */
static const float LOG_INV[32] __attribute__((unused)) = {
    0.984615386f, 0.955223858f, 0.927536249f, 0.901408434f, 0.876712322f, 0.853333354f,
    0.83116883f, 0.810126603f, 0.790123463f, 0.771084309f, 0.752941191f, 0.735632181f,
    0.719101131f, 0.703296721f, 0.688172042f, 0.673684239f, 0.659793794f, 0.646464646f,
    0.633663356f, 0.621359229f, 0.609523833f, 0.598130822f, 0.587155938f, 0.576576591f,
    0.566371679f, 0.556521714f, 0.547008574f, 0.537815154f, 0.528925598f, 0.520325184f,
    0.512000024f, 0.503937006f
};
static const float LOG_C[32] __attribute__((unused)) = {
    0.015504186f, 0.0458095595f, 0.0752234012f, 0.10379681f, 0.131576359f, 0.158605009f,
    0.184922338f, 0.210564747f, 0.235566065f, 0.259957552f, 0.283768147f, 0.307025045f,
    0.32975328f, 0.351976395f, 0.373716414f, 0.394993752f, 0.41582793f, 0.436236769f, 0.456237435f,
    0.475845903f, 0.495077223f, 0.513945758f, 0.532464862f, 0.55064708f, 0.568504751f, 0.58604908f,
    0.603290796f, 0.620240331f, 0.636907518f, 0.653301299f, 0.669430614f, 0.685303986f
};

/* Entry i of a 32-entry table per lane, i = m's top 5 bits, by one two-register permute (it reads
 * only the low 5 bits of bits >> 18). */
#define TABLE_INDEX_SHIFT 18
#define TABLE_INV LOG_INV
static inline vf table_read(const float *table, vi top) {
    __m512i idx;
    memcpy(&idx, &top, sizeof idx);
    __m512 r = _mm512_permutex2var_ps(_mm512_loadu_ps(table), idx, _mm512_loadu_ps(table + 16));
    vf v;
    memcpy(&v, &r, sizeof v);
    return v;
}
#elif SSACLI_AVX2_TABLES
/* log1p(z) for z >= 0, 8 lanes, on AVX2 with FMA: the AVX-512 path's table logarithm with 8 entries,
 * each table read by one one-register permute (vpermps): m's top 3 bits pick c_i = 1/LOG_INV8[i] (the
 * centre of m's eighth of [1, 2)), r = m·LOG_INV8[i] - 1 (one fused rounding) is within ±1/17, where a
 * degree-4 polynomial (a minimax fit for absolute error) leaves 9e-9 (1.3e-8 in base 2), and
 * log m = LOG_C8[i] + log1p(r): about the AVX-512 path's accuracy in half the Cephes polynomial's
 * work (tests/kernels/test_native_math.py bounds it against float64). Rounding 1 + z as below.
 * z = +inf gives +inf and NaN gives NaN (signed_like relies on it). */
static const float LOG_INV8[8] = {
    0.941176474f, 0.842105269f, 0.761904776f, 0.695652187f, 0.639999986f, 0.592592597f, 0.551724136f,
    0.516129017f
};
static const float LOG_C8[8] = { /* -log LOG_INV8[i] */
    0.0606246181f, 0.171850249f, 0.271933705f, 0.362905473f, 0.446287125f, 0.523248136f, 0.594707131f,
    0.66139853f
};

/* Entry i of an 8-entry table per lane, i = m's top 3 bits, by one one-register permute (vpermps:
 * it reads only the low 3 bits of bits >> 20). */
#define TABLE_INDEX_SHIFT 20
#define TABLE_INV LOG_INV8
static inline vf table_read(const float *table, vi top) {
    __m256i idx;
    memcpy(&idx, &top, sizeof idx);
    __m256 r = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table), idx);
    vf v;
    memcpy(&v, &r, sizeof v);
    return v;
}
#endif

#ifdef TABLE_INDEX_SHIFT
/* The table logarithms' split of u = 1 + z = 2^e·m: m's top bits pick TABLE_INV[i] and table[i], and
 * r = m·TABLE_INV[i] - 1 (one fused rounding: within ±1/65 with 32 entries, ±1/17 with 8) is
 * returned; log(u) = e·log 2 + table[i] + log1p(r) in the table's base. */
static inline vf table_split(vf z, const float *table, vf *e, vf *c) {
    vi bits;
    vf m = exponent_split(z, e, &bits);
    vi top = bits >> TABLE_INDEX_SHIFT;
    vf inv = table_read(TABLE_INV, top);
    *c = table_read(table, top);
    return m * inv - 1.0f;
}
#endif

#if defined(__AVX512F__) && W == 16
static inline vf log1p_nonnegative(vf z) {
    vf e, c, r = table_split(z, LOG_C, &e, &c);
    vf poly = r * 0.333333343f - 0.5f;
    vf logu = e * 0.693359375f + (c + (poly * (r * r) + r));
    logu = e * -2.12194440e-4f + logu;
    return blend(z <= 3.40282347e38f, logu, splat(INFINITY));
}
#elif SSACLI_AVX2_TABLES
static inline vf log1p_nonnegative(vf z) {
    vf e, c, r = table_split(z, LOG_C8, &e, &c);
    vf poly = ((r * -2.5095614791e-1f + 3.3419668674e-1f) * r - 4.9999868870e-1f) * r + 9.9999928474e-1f;
    vf logu = e * 0.693359375f + (c + poly * r);
    logu = e * -2.12194440e-4f + logu;
    return blend(z <= 3.40282347e38f, logu, z);
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
static const float LOG2_C[32] __attribute__((unused)) = { /* -log2 LOG_INV[i] */
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
    vf e, c, r = table_split(z, LOG2_C, &e, &c);
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
#elif SSACLI_AVX2_TABLES
static const float LOG2_C8[8] = { /* -log2 LOG_INV8[i] */
    0.087462835f, 0.247927502f, 0.392317384f, 0.523561954f, 0.643856227f, 0.754887462f, 0.857981026f,
    0.954196334f
};

/* log2(1 + z) for z >= 0, 8 lanes: as log1p_nonnegative above, in base 2 (the exponent added as it is;
 * the degree-4 fit leaves 1.3e-8). z = +inf gives +inf, NaN gives NaN. */
static inline vf log2_1p_nonnegative(vf z) {
    vf e, c, r = table_split(z, LOG2_C8, &e, &c);
    vf poly = ((r * -3.6205318570e-1f + 4.8214387894e-1f) * r - 7.2134566307e-1f) * r + 1.4426939487f;
    vf log2u = e + (c + poly * r);
    return blend(z <= 3.40282347e38f, log2u, z);
}

/* 2^x for x <= 0, 8 lanes, on AVX2: x = k + f with k = floor(x), a degree-6 polynomial for 2^f on
 * [0, 1) (a minimax fit for relative error, 1.3e-8 with its float coefficients; 1 at f = 0), then
 * 2^f·2^k with 2^k built in the exponent bits, in place of scalef. x is first raised to -127, where
 * 2^k's bits are those of 0: below -126 it is 0 (no denormals), as on AVX-512; NaN stays NaN (the
 * max keeps its second operand's NaN). */
static inline vf exp2_nonpositive(vf x) {
    __m256 v;
    memcpy(&v, &x, sizeof v);
    v = _mm256_max_ps(_mm256_set1_ps(-127.0f), v);
    __m256 floor_v = _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    vf k, f;
    memcpy(&k, &floor_v, sizeof k);
    memcpy(&f, &v, sizeof f);
    f -= k;
    vf poly = (((((2.1612919227e-4f * f + 1.2467844645e-3f) * f + 9.6754515544e-3f) * f + 5.5485282093e-2f) * f
                + 2.4022930861e-1f) * f + 6.9314706326e-1f) * f + 1.0f; /* FMAs, contracted */
    return poly * (vf)((__builtin_convertvector(k, vi) + 127) << 23);
}
#else
static inline vf log2_1p_nonnegative(vf z) { return log1p_nonnegative(z) * 1.44269504088896341f; }
static inline vf exp2_nonpositive(vf x) { return exp_nonpositive(x * 0.693147180559945309f); }
#endif

/* sgn(y)·mag for mag >= 0 (NaN y: +mag, as the comparison says): a masked subtraction on AVX-512. On
 * AVX2 y's sign bit is put on mag (an and and an xor, where a compare and a blend cost twice that; -0
 * gives -mag): a NaN y may have it set, but there mag is the logarithm of NaN, NaN, so a NaN logit
 * still makes its row NaN instead of a weight of 0. */
static inline vf signed_like(vf y, vf mag) {
#if SSACLI_AVX2_TABLES
    return (vf)((vi)mag ^ ((vi)y & INT32_MIN));
#elif defined(__AVX512F__) && W == 16
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

/* t = n·sgn(y)·log1p|y| for W lanes (y = -inf gives -inf). */
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

/* ---- products on torch's sgemm (the one-loop kernels' tiles) ---------------------------------- */

/* Fortran BLAS sgemm (column-major), the one torch itself runs (its MKL or OpenBLAS): the caller
 * passes its address, so the products round exactly as torch.matmul's. */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *,
                         const float *, const float *, const int *, const float *, const int *,
                         const float *, float *, const int *);

/* Row-major C[m, n] = A[m, k] · B[k, n] + beta·C (row strides lda, ldb, ldc): column-major
 * Cᵀ = Bᵀ·Aᵀ, the same memory. */
static inline void gemm_rows(sgemm_fn gemm, int m, int n, int k, const float *A, int lda, const float *B,
                      int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    gemm("N", "N", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
}

/* Row-major C[m, n] = A[m, k] · B[n, k]ᵀ + beta·C (row strides lda, ldb, ldc): column-major
 * Cᵀ = (Bᵀ)ᵀ·Aᵀ, B read transposed in place, as torch.matmul reads a transposed key. */
static inline void gemm_rows_bt(sgemm_fn gemm, int m, int n, int k, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    gemm("T", "N", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
}

/* Element strides of the flash loops' tensors, [batch, head, row] for each of q, k, v and out (the
 * last axis is contiguous): the model's transposed projections are read where they lie. */
enum { QB, QH, QR, KB, KH, KR, VB, VH, VR, OB, OH, OR, STRIDES };

/* Row-major C[m, n] = A[k, m]ᵀ · B[k, n] + beta·C (row strides lda, ldb, ldc): column-major
 * Cᵀ = Bᵀ·A, A read transposed in place. */
static inline void gemm_rows_at(sgemm_fn gemm, int m, int n, int k, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    gemm("N", "T", &n, &m, &k, &one, B, &ldb, A, &lda, &beta, C, &ldc);
}

#endif
