/* matmul_q8_0.c — MATMUL_Q8_0 family: y[m][n] = sum_k W[n][k] * x[m][k] with
 * Q8_0 weights (blocks of 32 int8 quants q and one fp16 scale d).
 *
 *   decode     ds_matmul_decode -> the canonical kernel below with M = 1.
 *   canonical  weight dequantized on the fly, f32 activations as they are.
 *              Per (m, n), for every block b and half h (k = 32b + 16h):
 *                  w_l   = d_w * q[16h + l]                     (exact)
 *                  acc_l = fma(w_l, x[k + l], acc_l)       (one rounding)
 *              for lane l < 16 (lane = k mod 16), then y = the fixed tree
 *              8-4-2-1 over the 16 lanes. This is exactly MATMUL_F32's
 *              canonical kernel applied to the dequantized weight row.
 *              Decode (M = 1) and small batches dequantize in registers;
 *              for M > MT each weight tile is dequantized ONCE into a small
 *              f32 buffer that all row tiles of the batch read
 *              (matmul_internal.h): the same values, so the same bits.
 *   fast       the same tiles with split-K (the two halves of the blocks
 *              accumulated separately, then added) and the 16 lanes summed
 *              left to right: other bits.
 *
 * ==== Why this is canonical =========================================================
 * d_w is an fp16 (11-bit significand) and q an int8 (at most 8 bits), so
 * d_w * q has at most 19 significant bits and is exact in f32: the weight
 * vector a tile computes is the same value however, wherever and by whichever
 * instruction it is formed (in a register or through the buffer). After it,
 * every rounded operation — the fused multiply-add into lane k mod 16, the
 * combine tree — is written once, in one order that depends only on K, and
 * fusedMultiplyAdd is correctly rounded on every level (simd.h). Nothing depends on M, on the tile shape,
 * on the thread that owns the column or on the SIMD width (a lane is a lane
 * in a zmm, two ymm or four xmm), so canonical(M) row m is bit for bit
 * decode(row m), and decode is literally canonical with M = 1.
 *
 * ==== Why not quantize the activations any more =====================================
 * The previous canonical kernel was llama.cpp's Q8_0 x Q8_0 scheme: each
 * activation row quantized with ds_quantize_row_q8_0, exact integer block
 * dots, scaled by d_w * d_x. That is also canonical (the quantization is a
 * per-row function), but on f32 SIMD it is slower, not faster: a pass over
 * the activations per call, two integer->float conversions per block and
 * row, a scalar d_w * d_x and a vector broadcast per (m, n, block), and an
 * extra rounding of the activation that costs accuracy. Dequantizing the
 * weight instead costs one conversion per block *per weight row*, shared by
 * every activation row of the tile (of the batch, through the buffer), and
 * leaves the inner loop the F32 kernel's fused multiply-add. (ds_quantize_row_q8_0 stays: registry.c and
 * convert quantize weights with it.)
 *
 * The tile engine is matmul_internal.h / matmul_tile.h, shared with the
 * dense families; each weight tile is read once for all M rows. */
#include "kernels/cpu/matmul_internal.h"

/* ==========================================================================
 * DECODE == CANONICAL (M = 1 is just the narrowest tile)
 * ========================================================================== */
DS_INLINE void q8_canonical(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_Q8_0, 0, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(ds_mm_q8_0_canonical, q8_canonical, /* contraction off */)

/* ==========================================================================
 * FAST — the same tiles with FMA and a left-to-right lane sum
 * ========================================================================== */
DS_INLINE void q8_fast(const ds_mm_ctx *c, int64_t n0, int64_t n1, int lv) {
    ds_mm_walk(DS_TYPE_Q8_0, 1, c, n0, n1, lv);
}
DS_MM_INSTANTIATE(ds_mm_q8_0_fast, q8_fast, DS_FAST_FN)
