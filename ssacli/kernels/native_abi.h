/* The argument structs of ssacli's native entry points: each kernel takes one `const struct
 * ssacli_<kernel>_args *` instead of 15 to 30 positional arguments, so Python fills the fields by name.
 * Each struct is declared here once, as a field list (an X-macro), from which come both the struct and
 * the layout table that native_abi.c exports (every field's name, offset, size, kind and pointee type,
 * and the struct's size); ssacli/kernels/native_abi.py builds its ctypes structs from that table, so
 * Python holds no second copy of any layout, and it refuses a tensor whose dtype is not the field's.
 * Every entry point returns an int (0, a status, or flags).
 *
 * F(X, type, name): X is passed through (the struct's name where the table needs it). Pointers are
 * declared without restrict here; each kernel copies the fields into restrict-qualified locals where
 * its parameters had them, so the loops compile as before.
 */
#ifndef SSACLI_NATIVE_ABI_H
#define SSACLI_NATIVE_ABI_H
#include <stdint.h>

/* Where the mass lands (native_positions.h), shared by both statistics kernels: the bins, and the
 * per-row sums they add to (kb NULL: not measured). */
#define SSACLI_POSITIONS(F, X)                                                                        \
    F(X, int64_t, sink_k)           /* key bin 0: the first sink_k keys */                         \
    F(X, int64_t, bin_width)        /* keys per key bin after them */                              \
    F(X, int64_t, key_bins)                                                                        \
    F(X, int64_t, distance_bins)                                                                   \
    F(X, double *, kb)              /* [rows, key_bins] Σp per key bin; NULL: no position terms */ \
    F(X, double *, db)              /* [rows, distance_bins] Σp per distance bin */                \
    F(X, double *, dist)            /* [rows] Σp·|pos - j| */

/* ssacli_row_stats: rows [r0, r1) of a block of rows × C keys (native_stats.c). */
#define SSACLI_ROW_STATS_ARGS(F, X)                                                                   \
    F(X, const float *, t)          /* transformed logits [rows, C] */                             \
    F(X, const float *, raw)        /* logits before the transform [rows, C] (may be t) */          \
    F(X, const uint8_t *, vis)      /* visibility, one byte per key; NULL: every key visible */     \
    F(X, const int64_t *, vis_off)  /* row r's visibility starts at vis + vis_off[r] */             \
    F(X, int64_t, C)                /* keys per row */                                             \
    F(X, int64_t, r0)                                                                              \
    F(X, int64_t, r1)                                                                              \
    F(X, int64_t, top_k)            /* top values kept per row */                                  \
    F(X, float *, p)                /* weights e^(t - ref) [rows, C] (may be t) */                 \
    F(X, double *, m)               /* running row state [rows], updated in place */               \
    F(X, double *, l)                                                                              \
    F(X, double *, spread)                                                                         \
    F(X, float *, shrink)           /* written: e^(m_old - ref) per row */                         \
    F(X, double *, top)             /* [rows, top_k], descending */                                \
    F(X, double *, sq)                                                                             \
    F(X, double *, cnt)                                                                            \
    F(X, int64_t, key0)             /* the block's first key */                                    \
    F(X, int64_t, pos0)             /* key position of row r: pos0 + r % width */                  \
    F(X, int64_t, width)                                                                           \
    SSACLI_POSITIONS(F, X)                                                                         \
    F(X, int, threads)

/* ssacli_ssa_forward: one SSA forward block (native_ssa.c). */
#define SSACLI_SSA_FORWARD_ARGS(F, X)                                                                 \
    F(X, const float *, y)          /* [batch, heads, width, C] flattened to rows */               \
    F(X, int64_t, C)                                                                               \
    F(X, int64_t, r0)                                                                              \
    F(X, int64_t, r1)                                                                              \
    F(X, const float *, n_head)     /* each head's exponent [heads] */                             \
    F(X, int64_t, heads)                                                                           \
    F(X, float *, p)                /* may be y */                                                 \
    F(X, float *, m)                /* [rows] */                                                   \
    F(X, float *, s)                /* [rows] */                                                   \
    F(X, int64_t, width)            /* the block's rows per head: row r is query r % width */      \
    F(X, int, causal)                                                                              \
    F(X, int64_t, diag)                                                                            \
    F(X, int64_t, window)           /* 0: none */                                                  \
    F(X, int, threads)

/* ssacli_ssa_backward: one SSA backward block (native_ssa.c). */
#define SSACLI_SSA_BACKWARD_ARGS(F, X)                                                                \
    F(X, float *, y)                /* overwritten with p */                                       \
    F(X, float *, dp)               /* dO·vᵀ, overwritten with ∂L/∂y */                            \
    F(X, int64_t, C)                                                                               \
    F(X, int64_t, r0)                                                                              \
    F(X, int64_t, r1)                                                                              \
    F(X, const float *, n_head)                                                                    \
    F(X, int64_t, heads)                                                                           \
    F(X, const float *, lse)        /* [rows] */                                                   \
    F(X, const float *, delta)      /* [rows] */                                                   \
    F(X, double *, dn_row)          /* [rows], added to */                                         \
    F(X, int64_t, width)                                                                           \
    F(X, int, causal)                                                                              \
    F(X, int64_t, diag)                                                                            \
    F(X, int64_t, window)                                                                          \
    F(X, int, threads)

/* What the three one-loop kernels share first: torch's sgemm, the tensors and their strides. */
#define SSACLI_FLASH_HEAD(F, X)                                                                       \
    F(X, void *, gemm)              /* torch's Fortran sgemm_, 32-bit integers (LP64) */           \
    F(X, const float *, q)          /* [B, H, Q, D] */                                             \
    F(X, const float *, k)          /* [B, Hkv, K, D] */                                           \
    F(X, const float *, v)          /* [B, Hkv, K, Dv] */

/* ... and their geometry: batch, query and K/V heads, lengths, widths, the band. */
#define SSACLI_FLASH_SHAPE(F, X)                                                                      \
    F(X, int64_t, B)                                                                               \
    F(X, int64_t, H)                                                                               \
    F(X, int64_t, Hkv)                                                                             \
    F(X, int64_t, Q)                                                                               \
    F(X, int64_t, K)                                                                               \
    F(X, int64_t, D)                                                                               \
    F(X, int64_t, Dv)                                                                              \
    F(X, int, causal)                                                                              \
    F(X, int64_t, window)

/* ssacli_ssa_flash_forward: SSA's whole forward in one loop (native_ssa.c). */
#define SSACLI_SSA_FLASH_FORWARD_ARGS(F, X)                                                           \
    SSACLI_FLASH_HEAD(F, X)                                                                        \
    F(X, const int64_t *, strides)  /* [12]: native_math.h's STRIDES, q, k, v, out */              \
    F(X, const float *, n_head)                                                                    \
    SSACLI_FLASH_SHAPE(F, X)                                                                       \
    F(X, int64_t, rows)             /* queries per task */                                         \
    F(X, int64_t, cols)             /* keys per tile */                                            \
    F(X, float *, out)              /* [B, H, Q, Dv] */                                            \
    F(X, float *, lse)              /* [B, H, Q] contiguous */                                     \
    F(X, int, threads)

/* ssacli_stats_flash: diagnose's statistics of plain softmax in one loop (native_stats.c). */
#define SSACLI_STATS_FLASH_ARGS(F, X)                                                                 \
    SSACLI_FLASH_HEAD(F, X)                                                                        \
    F(X, const int64_t *, strides)                                                                 \
    F(X, float, scaling)                                                                           \
    SSACLI_FLASH_SHAPE(F, X)                                                                       \
    F(X, const int64_t *, target)   /* [B] key index per sample; NULL: none */                     \
    F(X, int64_t, top_k)                                                                           \
    F(X, int64_t, rows)                                                                            \
    F(X, int64_t, cols)                                                                            \
    F(X, float *, out)                                                                             \
    F(X, double *, m)               /* per-row state [B, H, Q] (top: [.., top_k]) */               \
    F(X, double *, l)                                                                              \
    F(X, double *, spread)                                                                         \
    F(X, double *, top)                                                                            \
    F(X, double *, sq)                                                                             \
    F(X, double *, cnt)                                                                            \
    F(X, double *, first)                                                                          \
    F(X, double *, t_target)                                                                       \
    F(X, double *, x_target)                                                                       \
    SSACLI_POSITIONS(F, X)                                                                         \
    F(X, int, threads)

/* ssacli_ssa_flash_backward: SSA's whole backward in one loop per query head (native_ssa.c). */
#define SSACLI_SSA_FLASH_BACKWARD_ARGS(F, X)                                                          \
    SSACLI_FLASH_HEAD(F, X)                                                                        \
    F(X, const float *, dout)       /* [B, H, Q, Dv] (strides' out entries) */                     \
    F(X, const int64_t *, strides)                                                                 \
    F(X, const float *, n_head)                                                                    \
    F(X, const float *, lse)        /* [B, H, Q] contiguous */                                     \
    F(X, const float *, delta)                                                                     \
    SSACLI_FLASH_SHAPE(F, X)                                                                       \
    F(X, int64_t, rows)                                                                            \
    F(X, int64_t, cols)                                                                            \
    F(X, float *, dq)               /* [B, H, Q, D], zeroed by the caller */                       \
    F(X, float *, dk_h)             /* [B, H, K, D] */                                             \
    F(X, float *, dv_h)             /* [B, H, K, Dv] */                                            \
    F(X, double *, dn)              /* [B, H] */                                                   \
    F(X, int, threads)

/* Every kernel and its field list: K(name, FIELDS). */
#define SSACLI_KERNELS(K)                                                                             \
    K(ssacli_row_stats, SSACLI_ROW_STATS_ARGS)                                                     \
    K(ssacli_ssa_forward, SSACLI_SSA_FORWARD_ARGS)                                                 \
    K(ssacli_ssa_backward, SSACLI_SSA_BACKWARD_ARGS)                                               \
    K(ssacli_ssa_flash_forward, SSACLI_SSA_FLASH_FORWARD_ARGS)                                     \
    K(ssacli_stats_flash, SSACLI_STATS_FLASH_ARGS)                                                 \
    K(ssacli_ssa_flash_backward, SSACLI_SSA_FLASH_BACKWARD_ARGS)

#define SSACLI_MEMBER(X, type, name) type name;
#define SSACLI_STRUCT(kernel, FIELDS) struct kernel##_args { FIELDS(SSACLI_MEMBER, _) };
SSACLI_KERNELS(SSACLI_STRUCT)
#undef SSACLI_STRUCT

int ssacli_row_stats(const struct ssacli_row_stats_args *a);
int ssacli_ssa_forward(const struct ssacli_ssa_forward_args *a);
int ssacli_ssa_backward(const struct ssacli_ssa_backward_args *a);
int ssacli_ssa_flash_forward(const struct ssacli_ssa_flash_forward_args *a);
int ssacli_stats_flash(const struct ssacli_stats_flash_args *a);
int ssacli_ssa_flash_backward(const struct ssacli_ssa_flash_backward_args *a);

#endif
