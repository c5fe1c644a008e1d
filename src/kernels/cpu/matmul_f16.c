/* matmul_f16.c — MATMUL_F16 family: y[m][n] = sum_k W[n][k] * x[m][k], f16 weights.
 *
 * IEEE half -> f32 is exact: branch-free over 16 lanes (ds_ld16_f16:
 * rebias normals, scale subnormals by 2^-24, map inf/NaN). The weights are
 * converted inside the tile, once per 16 k, and the
 * converted vector is used for every activation row of the tile — so the
 * arithmetic is exactly MATMUL_F32's on the converted values, and the
 * conversion costs nothing per extra row.
 *
 *   decode     ds_matmul_decode -> the canonical kernel below with M = 1.
 *   canonical  per (m, n): 16 lane accumulators over k (lane = k mod 16,
 *              the K % 16 tail in the same lanes), each step one fused
 *              multiply-add, fixed tree 8-4-2-1; M rows share each weight
 *              tile, and for M > MT the tile is converted once into an f32
 *              buffer shared by all row tiles (matmul_internal.h),
 *              DS_NT_MAX weight rows at a time, each row tile run against
 *              all of them while its activations are in L1; at AVX2 the
 *              16-lane tree runs on vectors (matmul_tile.h: the same
 *              additions in the same order); for M > 3 at AVX2 the
 *              half-lane 4 x 3 tile runs lanes 0..7 over all of K, then
 *              lanes 8..15 (matmul_internal.h, ds_tile8h: each lane's
 *              sequence and the tree unchanged, one ymm per output).
 *   fast       the same tiles with split-K (two halves of K accumulated
 *              separately) and a left-to-right lane sum: other bits.
 * The tile engine is matmul_internal.h's, shared with F32 and BF16. */
#include "kernels/cpu/matmul_internal.h"

/* ==========================================================================
 * DECODE == CANONICAL (M = 1 is just the narrowest tile)
 * ========================================================================== */
DS_INLINE void f16_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_F16, 0, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(ds_mm_f16_canonical, f16_canonical, /* contraction off */)

/* ==========================================================================
 * FAST
 * ========================================================================== */
DS_INLINE void f16_fast(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_F16, 1, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(ds_mm_f16_fast, f16_fast, DS_FAST_FN)
