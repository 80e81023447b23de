/* Where a row's attention lands, as three running sums beside l (ssacli.kernels.positions says what
 * they are; native_stats.c's row() calls these after its pass 2 has written p = e^(t - ref)):
 * Σp per key bin (the first sink_k keys, then bin_width keys a bin), Σp per distance bin (d = |pos - j|:
 * 0, 1, 2-3, 4-7, ...: the bit length of d) and Σp·d. Both kinds of bin are contiguous runs of keys,
 * so a row is cut at every edge of either and each piece is summed with vectors (the row's p is still
 * in cache), never element by element into a bin. */
#ifndef SSACLI_NATIVE_POSITIONS_H
#define SSACLI_NATIVE_POSITIONS_H
#include "native_math.h"

/* The bins and each row's running sums; kb NULL: the terms are not measured. */
struct positions {
    int64_t sink_k, bin_width, key_bins, distance_bins;
    double *kb, *db, *dist; /* [rows, key_bins], [rows, distance_bins], [rows] */
};

static inline int64_t bit_length(int64_t d) { return d == 0 ? 0 : 64 - __builtin_clzll((unsigned long long)d); }

/* Σ p[a, b) into *s and Σ p[c]·(d0 + step·(c - a)) into *sd: float vector sums folded into double
 * every CHUNK columns, as l's. */
static inline void segment_sums(const float *p, int64_t a, int64_t b, float d0, float step, double *s, double *sd) {
    vf lane;
    for (int i = 0; i < W; i++) lane[i] = (float)i;
    /* Each lane's distance d0 + step·(c - a + i), carried from vector to vector: whole numbers far
     * below 2^24, so every sum is exact and equals the product formed afresh. */
    vf dist = splat(d0) + lane * step;
    const vf next = splat(step * (float)W);
    struct wide_sum s_d = {{0}, {0}}, sd_d = {{0}, {0}};
    for (int64_t c0 = a; c0 < b; c0 += CHUNK) {
        int64_t c1 = c0 + CHUNK < b ? c0 + CHUNK : b, c = c0;
        vf s_v = {0}, sd_v = {0};
        for (; c + W <= c1; c += W) {
            vf x = load(p, c);
            s_v += x;
            sd_v += x * dist;
            dist += next;
        }
        if (c < c1) { /* lanes past c1 load as 0 */
            vf x = load_tail(p, c, c1);
            s_v += x;
            sd_v += x * dist;
        }
        wide_add(&s_d, s_v), wide_add(&sd_d, sd_v);
    }
    *s = wide_total(&s_d), *sd = wide_total(&sd_d);
}

/* Row r's terms: the old sums times shrink (e^(m_old - ref); 0 where the row had no key), plus those
 * of p[0, n), the row's keys key0 ... key0 + n - 1, for the query at key position pos. */
static void position_terms(const struct positions *P, int64_t r, const float *p, int64_t n, int64_t key0,
                           int64_t pos, double shrink) {
    double *kb = P->kb + r * P->key_bins, *db = P->db + r * P->distance_bins, *dist = P->dist + r;
    if (shrink != 1.0) { /* most tiles after a row's first few leave its max where it was */
        for (int64_t b = 0; b < P->key_bins; b++) kb[b] *= shrink;
        for (int64_t b = 0; b < P->distance_bins; b++) db[b] *= shrink;
        *dist *= shrink;
    }
    for (int64_t c = 0; c < n;) {
        int64_t j = key0 + c, kbin, kend, dend;
        if (j < P->sink_k) {
            kbin = 0, kend = P->sink_k;
        } else {
            int64_t after = (j - P->sink_k) / P->bin_width;
            kbin = 1 + after, kend = P->sink_k + (after + 1) * P->bin_width;
        }
        int64_t d = j < pos ? pos - j : j - pos, dbin = bit_length(d);
        if (j < pos) /* d falls as j grows: the bin holds d >= 2^(dbin-1) */
            dend = pos - ((int64_t)1 << (dbin - 1)) + 1;
        else /* d = 0 is its own bin; past pos d grows up to 2^dbin - 1 */
            dend = j == pos ? pos + 1 : pos + ((int64_t)1 << dbin);
        int64_t end = kend < dend ? kend : dend;
        end = end - key0 < n ? end - key0 : n;
        double s, sd;
        segment_sums(p, c, end, (float)d, j < pos ? -1.0f : 1.0f, &s, &sd);
        kb[kbin] += s, db[dbin] += s, *dist += sd;
        c = end;
    }
}

/* A broken row (a NaN or +inf visible t): its terms are NaN, as l is. */
static void position_terms_broken(const struct positions *P, int64_t r) {
    for (int64_t b = 0; b < P->key_bins; b++) P->kb[r * P->key_bins + b] = NAN;
    for (int64_t b = 0; b < P->distance_bins; b++) P->db[r * P->distance_bins + b] = NAN;
    P->dist[r] = NAN;
}

#endif
