/* swiglu.c — SwiGLU family: out = silu(gate) * up, elementwise over rows x n.
 *
 *   decode     swiglu_row(): silu(g) = g / (1 + ds_expf(-g)) with ds_expf (kernels/dsmath.h, the GPU's bits),
 *              then * up. Elementwise, so there is no reduction to order;
 *              what must match is the transcendental: one expf everywhere.
 *   canonical  the rows x n elements split over threads in blocks of
 *              SWIGLU_BLOCK (elementwise: every element is computed by the
 *              same expression wherever the block boundary falls, so a
 *              decode row of 14336 still uses all threads).
 *   fast       the vectorizable form a throughput kernel uses: exp from a
 *              branch-free range reduction + degree-6 polynomial
 *              (ds_exp_fast, ~2e-7 relative) and a reciprocal multiply,
 *              g * (1 / (1 + e)). Accurate, but not libm's bits. */
#include "kernels/kernels.h"
#include "kernels/cpu/ops_internal.h"
#include "kernels/cpu/expf16.h"
#include "kernels/dsmath.h"

#include <math.h>

#define SWIGLU_BLOCK 4096

typedef struct {
    int64_t total;
    const float *gate, *up;
    float *out;
} swiglu_args;

/* ========================================================================
 * DECODE — the one per-row instruction sequence
 * ======================================================================== */
/* always inlined: it then runs in the caller's per-level instance, where
 * ds_expf's fmaf calls compile to VFMADD (same bits as libm fmaf, several
 * times cheaper than a call per operation) */
static inline __attribute__((always_inline)) void swiglu_row(int64_t n, const float *g, const float *u,
                                                         float *o) {
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        float silu = x / (1.0f + ds_expf(-x));
        o[i] = silu * u[i];
    }
}

/* The same elements 16 at a time on AVX-512 (8 on AVX2): -g (a sign flip),
 * ds_expf16 / ds_expf8 (ds_expf lane by lane), 1 + e, the IEEE division, the
 * product — each lane swiglu_row's operations in its order, NaN operands in
 * the same positions, so the same bits; the tail runs swiglu_row itself. */
#if DS_X86
#define SWIGLU_VEC(name, TGT, P, V, W, EXPF, BITS)                                                 \
    TGT static void name(int64_t n, const float *g, const float *u, float *o) {                   \
        int64_t i = 0;                                                                             \
        const V one = P##_set1_ps(1.0f), sign = P##_castsi##BITS##_ps(P##_set1_epi32((int)0x80000000u)); \
        for (; i + W <= n; i += W) {                                                               \
            const V x = P##_loadu_ps(g + i);                                                       \
            const V e = EXPF(P##_xor_ps(x, sign));                                                 \
            const V silu = P##_div_ps(x, P##_add_ps(one, e));                                      \
            P##_storeu_ps(o + i, P##_mul_ps(silu, P##_loadu_ps(u + i)));                           \
        }                                                                                          \
        swiglu_row(n - i, g + i, u + i, o + i);                                                    \
    }
SWIGLU_VEC(swiglu_row16, DS_TARGET_AVX512, _mm512, __m512, 16, ds_expf16, 512)
SWIGLU_VEC(swiglu_row8, DS_TARGET_AVX2, _mm256, __m256, 8, ds_expf8, 256)
#undef SWIGLU_VEC
#endif

/* ========================================================================
 * CANONICAL — threads split element blocks; every element runs swiglu_row()
 * ======================================================================== */
DS_OPS_BODY(swiglu_canon_range) {
    const swiglu_args *a = arg;
    int64_t e0 = i0 * SWIGLU_BLOCK, e1 = i1 * SWIGLU_BLOCK;
    if (e1 > a->total) e1 = a->total;
#if DS_X86
    if (ds_simd_level() == DS_LVL_AVX512) {
        swiglu_row16(e1 - e0, a->gate + e0, a->up + e0, a->out + e0);
        return;
    }
    if (ds_simd_level() == DS_LVL_AVX2) {
        swiglu_row8(e1 - e0, a->gate + e0, a->up + e0, a->out + e0);
        return;
    }
#endif
    swiglu_row(e1 - e0, a->gate + e0, a->up + e0, a->out + e0);
}
DS_OPS_DISPATCH(swiglu_canon_range)

/* ========================================================================
 * FAST — polynomial exp, vectorized across the row
 * ======================================================================== */
/* WHY the bits differ: libm expf is correctly rounded (or nearly) through a
 * table; ds_exp_fast's polynomial is within ~2e-7 relative but rounds
 * differently, and the reciprocal-multiply rounds twice where the division
 * rounds once. The loop has no calls, so the compiler vectorizes it. */
static void swiglu_fast_row(int64_t n, const float *g, const float *u, float *o) {
    for (int64_t i = 0; i < n; i++) {
        float x = g[i];
        float e = ds_exp_fast(-x);
        o[i] = (x * (1.0f / (1.0f + e))) * u[i];
    }
}

static void swiglu_fast_range(void *arg, int64_t b0, int64_t b1) {
    const swiglu_args *a = arg;
    int64_t e0 = b0 * SWIGLU_BLOCK, e1 = b1 * SWIGLU_BLOCK;
    if (e1 > a->total) e1 = a->total;
    swiglu_fast_row(e1 - e0, a->gate + e0, a->up + e0, a->out + e0);
}

/* ========================================================================
 * entry point
 * ======================================================================== */
void ds_swiglu(ds_variant v, int rows, int n, const float *gate, const float *up, float *out,
               ds_pool *pool) {
    if (rows <= 0 || n <= 0) return;
    swiglu_args a = { (int64_t)rows * n, gate, up, out };
    int64_t blocks = (a.total + SWIGLU_BLOCK - 1) / SWIGLU_BLOCK;
    ds_pool_for(pool, blocks, 1,
                v == DS_FAST ? swiglu_fast_range : swiglu_canon_range, &a);
}

/* ========================================================================
 * THE CLAMP — deepseek4's limit on the SwiGLU inputs (no variants)
 * ======================================================================== */
/* Why it needs no decode / canonical / fast: min and clamp round nothing —
 * each output is one of its operands — so every order, lane count and row
 * grouping gives the same floats, and the SwiGLU family after it keeps its
 * own three variants. The comparisons are llama.cpp's (std::min(g, limit),
 * std::clamp(u, -limit, limit)), so a NaN stays a NaN as there. */
void ds_swiglu_limit(int64_t n, float limit, float *gate, float *up) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], u = up[i];
        gate[i] = limit < g ? limit : g;
        up[i] = u < -limit ? -limit : limit < u ? limit : u;
    }
}
