/* matmul_internal.h — the shared machinery of the four matmul families.
 * Private to src/kernels/cpu.
 *
 *   ds_mm_ctx              one matmul call, as the per-thread range kernels see it
 *   ds_mm_<fam>_<variant>  range kernels: compute y[0..M)[n0..n1) (matmul_<fam>.c)
 *   ds_dense_*             the tile engine F32, F16 and BF16 share (weights
 *                          converted to f32 on the fly, exactly)
 *
 * ==== The tile rule =============================================================
 * A range kernel walks its output columns n in tiles of NT weight rows and
 * the activation rows m in tiles of MT. Inside a tile, every (m, n) pair owns
 * one 16-lane accumulator vector, and the k loop performs, for that pair, the
 * same sequence of lane operations whatever MT and NT are. Tile shapes are
 * therefore free to change with M, with the SIMD level and at the edges
 * (remainder rows are padded by repeating the last row and discarding its
 * results): they change speed, never bits. This is what lets the canonical
 * kernel load each weight tile once and use it for all M rows while every
 * row keeps the decode sequence. */
#ifndef DSPARK_MATMUL_INTERNAL_H
#define DSPARK_MATMUL_INTERNAL_H

#include "kernels/kernels.h"
#include "kernels/cpu/simd.h"

typedef struct {
    const ds_weight *W;
    int          M;
    const float *x;      /* M x K activations                                   */
    float       *y;      /* M x N outputs                                       */
    const float *xq;     /* Q8_0 canonical: M x K quantized activations, as f32 */
    const float *xd;     /* Q8_0 canonical: M x K/32 block scales (from fp16)   */
    int          level;  /* DS_LVL_*                                           */
} ds_mm_ctx;

typedef void (*ds_mm_range_fn)(const ds_mm_ctx *c, int64_t n0, int64_t n1);

void ds_mm_f32_canonical (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_f32_fast      (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_f16_canonical (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_f16_fast      (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_bf16_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_bf16_fast     (const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_q8_0_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1);
void ds_mm_q8_0_fast     (const ds_mm_ctx *c, int64_t n0, int64_t n1);

/* Q8_0 canonical activation side: each of the M rows through
 * ds_quantize_row_q8_0 (into tmp, K/32 blocks), expanded to xq (M x K
 * quants as f32) and xd (M x K/32 scales as f32). */
void ds_mm_q8_0_prepare(const float *x, int M, int64_t K, ds_block_q8_0 *tmp, float *xq,
                        float *xd);

/* ds_matmul at an explicit SIMD level (tests compare the levels bit for bit;
 * level must satisfy ds_simd_level_ok). ds_matmul uses ds_simd_level(). */
void ds_matmul_at_level(int level, ds_variant v, const ds_weight *W, int M, const float *x,
                        float *y, ds_pool *pool);

/* ---- tile shapes per level -----------------------------------------------------
 * MT x NT accumulator vectors must fit the register file: 32 zmm (AVX-512),
 * 16 ymm holding half a ds_v16f each (AVX2), 16 xmm holding a quarter (SSE2).
 * The one-row (decode) tile is wider in N: with a single activation row the
 * only reuse is of x, and more independent accumulators hide add latency. */
#define DS_MT_MAX 4
#define DS_NT_MAX 8
/* SLIM = 1 halves NT for families whose weight conversion needs registers of
 * its own (F16's bit manipulation; Q8_0's two vectors per block). */
#define DS_TILE_MT(lv)           ((lv) == DS_LVL_AVX512 ? 4 : 2)
#define DS_TILE_NT(lv, slim)     (((lv) == DS_LVL_AVX512 ? 4 : 2) >> (slim))
#define DS_TILE_NT_ONE(lv, slim) (((lv) == DS_LVL_AVX512 ? 8 : (lv) == DS_LVL_AVX2 ? 4 : 2) >> (slim))

/* ---- per-level instantiation -----------------------------------------------------
 * BODY(c, n0, n1, level) is an always-inline function; NAME becomes the
 * exported range kernel that switches on c->level. ATTR is empty for the
 * canonical kernels and DS_FAST_FN (contraction on) for the fast ones. */
#if DS_X86
#define DS_MM_INSTANTIATE(NAME, BODY, ATTR)                                                 \
    DS_TARGET_AVX512 ATTR static void NAME##_avx512(const ds_mm_ctx *c, int64_t a, int64_t b) { \
        BODY(c, a, b, DS_LVL_AVX512);                                                       \
    }                                                                                       \
    DS_TARGET_AVX2 ATTR static void NAME##_avx2(const ds_mm_ctx *c, int64_t a, int64_t b) { \
        BODY(c, a, b, DS_LVL_AVX2);                                                         \
    }                                                                                       \
    ATTR static void NAME##_portable(const ds_mm_ctx *c, int64_t a, int64_t b) {            \
        BODY(c, a, b, DS_LVL_PORTABLE);                                                     \
    }                                                                                       \
    void NAME(const ds_mm_ctx *c, int64_t a, int64_t b) {                                   \
        switch (c->level) {                                                                 \
        case DS_LVL_AVX512: NAME##_avx512(c, a, b); break;                                  \
        case DS_LVL_AVX2: NAME##_avx2(c, a, b); break;                                      \
        default: NAME##_portable(c, a, b); break;                                           \
        }                                                                                   \
    }
#else
#define DS_MM_INSTANTIATE(NAME, BODY, ATTR)                                                 \
    ATTR static void NAME##_portable(const ds_mm_ctx *c, int64_t a, int64_t b) {            \
        BODY(c, a, b, DS_LVL_PORTABLE);                                                     \
    }                                                                                       \
    void NAME(const ds_mm_ctx *c, int64_t a, int64_t b) { NAME##_portable(c, a, b); }
#endif

/* ---- the range walker -------------------------------------------------------------
 * Calls TILE(c, m0, mv, n0, nv, MT, NT, lv) over y[0..M)[n0..n1): NT weight
 * rows at a time (outer, so each weight tile is fetched from memory once),
 * then all M activation rows in tiles of MT (inner, hitting cache). mv/nv
 * are the valid counts (<= MT/NT); the tile pads by repeating the last row. */
#define DS_MM_WALK(TILE, c, n0, n1, lv, SLIM)                                                    \
    do {                                                                                    \
        const int M_ = (c)->M, MT_ = DS_TILE_MT(lv);                                        \
        if (M_ == 1) {                                                                      \
            const int NT1_ = DS_TILE_NT_ONE(lv, SLIM);                                            \
            for (int64_t n_ = (n0); n_ < (n1); n_ += NT1_) {                                \
                int nv_ = (int)((n1) - n_ < NT1_ ? (n1) - n_ : NT1_);                       \
                TILE(c, 0, 1, n_, nv_, 1, DS_TILE_NT_ONE(lv, SLIM), lv);                          \
            }                                                                               \
            break;                                                                          \
        }                                                                                   \
        const int NT_ = DS_TILE_NT(lv, SLIM);                                                     \
        for (int64_t n_ = (n0); n_ < (n1); n_ += NT_) {                                     \
            int nv_ = (int)((n1) - n_ < NT_ ? (n1) - n_ : NT_);                             \
            int m_ = 0;                                                                     \
            for (; m_ + MT_ <= M_; m_ += MT_)                                               \
                TILE(c, m_, MT_, n_, nv_, DS_TILE_MT(lv), DS_TILE_NT(lv, SLIM), lv);              \
            int r_ = M_ - m_;                                                               \
            if (r_ == 1)                                                                    \
                TILE(c, m_, 1, n_, nv_, 1, DS_TILE_NT(lv, SLIM), lv);                             \
            else if (r_ == 2)                                                               \
                TILE(c, m_, 2, n_, nv_, 2, DS_TILE_NT(lv, SLIM), lv);                             \
            else if (MT_ == 4 && r_ == 3)                                                   \
                TILE(c, m_, 3, n_, nv_, 4, DS_TILE_NT(lv, SLIM), lv);                             \
        }                                                                                   \
    } while (0)

/* Tile loops must be fully unrolled so that every accumulator is a register. */
#define DS_UNROLL _Pragma("GCC unroll 8")

/* ---- helpers for tiles -------------------------------------------------------------- */
/* Row pointers for a tile of T rows of which v are valid: the padding rows
 * repeat the last valid row (they compute a duplicate that is not stored). */
DS_INLINE void ds_tile_rows(const void *base, size_t stride, int64_t r0, int v, int T,
                            const void *out[]) {
    for (int t = 0; t < T; t++)
        out[t] = (const char *)base + (size_t)(r0 + (t < v ? t : v - 1)) * stride;
}
DS_INLINE void ds_tile_store(float *y, int64_t N, int m0, int mv, int64_t n0, int nv,
                             float out[DS_MT_MAX][DS_NT_MAX]) {
    for (int i = 0; i < mv; i++)
        for (int j = 0; j < nv; j++) y[(size_t)(m0 + i) * (size_t)N + (size_t)(n0 + j)] = out[i][j];
}

/* ====================================================================================
 * Dense tile engine (F32 / F16 / BF16 weights; type is a constant after inlining)
 * ==================================================================================== */

/* CANONICAL (and decode), fast = 0. For every (m, n):
 *   acc[l] = +0                            for l < 16
 *   for k in steps of 16:   acc[l] = acc[l] + w[n][k+l] * x[m][k+l]
 *   tail (K % 16 = r > 0):  acc[l] = acc[l] + w[n][k+l] * x[m][k+l]   for l < r
 *   y = tree(acc): (l, l+8) -> (l, l+4) -> (l, l+2) -> (l, l+1)
 * Products and sums are separately rounded (no FMA). w is the weight
 * converted to f32, which is exact for F16 and BF16. Nothing here depends
 * on M, on the tile shape, on the thread or on the vector width.
 *
 * FAST, fast = 1. What a GEMM writer does: the same register tiles, but
 * each step is a fused multiply-add (one rounding instead of two) where the
 * CPU has FMA, and the 16 lanes are summed left to right at the end (a
 * scalar epilogue) instead of the tree. Still a function of K only, so
 * thread counts and M do not change its bits; it simply is not the decode
 * sequence. Without hardware FMA (portable x86-64) only the combine differs.
 *
 * The tail is run as one more full-width step on zero-padded copies of the
 * last K % 16 elements: adding +0 * +0 leaves an accumulator unchanged (it
 * starts at +0 and round-to-nearest never turns a sum starting at +0 into
 * -0), so this IS "lanes l < r only" — and it keeps a single, fully
 * vectorized step body for the compiler. */
DS_INLINE void ds_dense_tile(uint32_t type, int fast, const ds_mm_ctx *c, int m0, int mv,
                             int64_t n0, int nv, int MT, int NT, int lv) {
    const int64_t K = c->W->n_in, Kf = K & ~(int64_t)15;
    const size_t es = type == DS_TYPE_F32 ? 4 : 2;
    const void *wr[DS_NT_MAX], *xr[DS_MT_MAX];
    ds_tile_rows(c->W->data, (size_t)K * es, n0, nv, NT, wr);
    ds_tile_rows(c->x, (size_t)K * sizeof(float), m0, mv, MT, xr);

    ds_v16f acc[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++) acc[i][j] = ds_zero16();

#define DS_DENSE_STEP(WPTR, WK, XPTR)                                                       \
    do {                                                                                    \
        ds_v16f w_[DS_NT_MAX];                                                              \
        DS_UNROLL                                                                           \
        for (int j = 0; j < NT; j++) w_[j] = ds_ldw16(type, WPTR, WK);                      \
        DS_UNROLL                                                                           \
        for (int i = 0; i < MT; i++) {                                                      \
            const ds_v16f xv_ = ds_ld16(XPTR);                                              \
            DS_UNROLL                                                                       \
            for (int j = 0; j < NT; j++) {                                                  \
                acc[i][j] = acc[i][j] + w_[j] * xv_;                                        \
            }                                                                               \
        }                                                                                   \
    } while (0)

    for (int64_t k = 0; k < Kf; k += 16) DS_DENSE_STEP(wr[j], k, (const float *)xr[i] + k);
    if (Kf < K) {
        const size_t r = (size_t)(K - Kf);
        _Alignas(64) unsigned char wpad[DS_NT_MAX][64];
        _Alignas(64) float xpad[DS_MT_MAX][16];
        DS_UNROLL
        for (int j = 0; j < NT; j++) {
            memset(wpad[j], 0, 64);                             /* +0 in f32, f16, bf16 */
            memcpy(wpad[j], (const char *)wr[j] + (size_t)Kf * es, r * es);
        }
        DS_UNROLL
        for (int i = 0; i < MT; i++) {
            memset(xpad[i], 0, 64);
            memcpy(xpad[i], (const float *)xr[i] + Kf, r * sizeof(float));
        }
        DS_DENSE_STEP(wpad[j], 0, xpad[i]);
    }
#undef DS_DENSE_STEP

    float out[DS_MT_MAX][DS_NT_MAX];
    DS_UNROLL
    for (int i = 0; i < MT; i++)
        DS_UNROLL
        for (int j = 0; j < NT; j++)
            out[i][j] = fast ? ds_hsum16_seq(&acc[i][j]) : ds_hsum16_tree(&acc[i][j]);
    ds_tile_store(c->y, c->W->n_out, m0, mv, n0, nv, out);
}

#endif
