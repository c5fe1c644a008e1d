/* matmul_f32.c — MATMUL_F32 family: y[m][n] = sum_k W[n][k] * x[m][k], f32 weights.
 *
 *   decode     ds_matmul_decode -> the canonical kernel below with M = 1
 *              (one activation row, 1 x 8 weight-row tiles on AVX-512).
 *   canonical  per (m, n): 16 lane accumulators over k (lane = k mod 16,
 *              the K % 16 tail in the same lanes), each step one fused
 *              multiply-add (explicit, identical on every SIMD level), fixed
 *              tree 8-4-2-1. M rows share each weight tile (4 x 4 register
 *              tiles on AVX-512): the weights are streamed once for all M
 *              rows, every row keeps the decode sequence.
 *   fast       the same tiles, K split in two halves accumulated separately
 *              (split-K) and a left-to-right lane sum: other bits.
 *
 * The tile engine is shared with F16/BF16 (matmul_internal.h); this file
 * binds it to f32 weight rows and instantiates it per SIMD level. */
#include "kernels/cpu/matmul_internal.h"

/* ==========================================================================
 * DECODE == CANONICAL (M = 1 is just the narrowest tile)
 * ========================================================================== */
DS_INLINE void f32_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_F32, 0, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(ds_mm_f32_canonical, f32_canonical, /* contraction off */)

/* ==========================================================================
 * FAST
 * ========================================================================== */
DS_INLINE void f32_fast(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_F32, 1, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(ds_mm_f32_fast, f32_fast, DS_FAST_FN)
