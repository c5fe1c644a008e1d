/* matmul_q5_0.c — MATMUL_Q5_0 family: y[m][n] = sum_k W[n][k] * x[m][k] with
 * Q5_0 weights (blocks of 32 5-bit quants q, the fifth bits in qh, x = d * (q - 16)).
 * The engine is shared by the seven kquant families (matmul_kq.h); this file
 * fixes the type and says what its three kernels compute.
 *
 *   decode     ds_matmul_decode = ds_matmul(DS_CANONICAL, W, 1, ...): the
 *              canonical kernel below with M = 1 (matmul.c).
 *   canonical  each activation row is quantized ONCE per call to the
 *              partner type, Q8_0 (ds_quantize_row_q8_0: quants p, fp16 scale e),
 *              and for every (m, n), block by block in order:
 *                  I = sum_l q_l * p_l - 16 * sum_l p_l  (exact)
 *                  acc = fmaf((float)I, d * e, acc)   (d * e exact)
 *              (the integer definition of llama.cpp's q5_0 x q8_0 vec_dot).
 *   fast       the same quantized activations and exact integers, the f32
 *              updates rounded as llama.cpp's scalar vec_dot does
 *              (((float)I * d) * e, then an add), even and odd blocks in
 *              two chains summed at the end.
 *
 * ==== Why canonical is the same bits everywhere =========================================
 * The activation quantization is a function of the row alone (the same
 * scalar code whatever M, thread or level). After it, I is an exact
 * integer: the AVX2 maddubs/madd lanes (also run by the AVX-512 level),
 * the hadd tree over 8 weight rows, the T8 tile of the AVX2 / AVX-VNNI
 * levels (weights packed at load with dword s of 8 rows in one vector:
 * VPMADDUBSW + VPMADDWD, or VPDPBUSD, against dword s of the activations
 * broadcast, lane j = row j, no horizontal sums; matmul_kq.h) and the
 * portable scalar loops all give the same value, whatever the tile shape. Every rounding is in the per-block
 * f32 update, which is the same C (fmaf, one IEEE rounding) on every level
 * and runs in block order — a sequence fixed by K alone. So canonical(M)
 * row m is decode(row m) bit for bit on every SIMD level and thread count
 * (test_matmul compares levels, M = 1..16 and a scalar reference; NaN
 * results are stored as one quiet NaN so malformed scales compare too).
 *
 * ==== Why fast differs =====================================================================
 * Fast rounds the same products more often and in another order: the
 * block's product rounded twice before a plain add, and two (or three)
 * partial sums added at the end instead of one fma chain, as llama.cpp's
 * vec_dot code does. Its results are within a few ulps of
 * canonical's per output, but not the decode bits, so a batched verifier
 * that uses it drifts from sequential decode (test_canonical's counter-test
 * finds the difference on a make-model model of this type). */
#include "kernels/cpu/matmul_kq.h"

KQ_FAMILY(q5_0, DS_TYPE_Q5_0)
