/* matmul_q4_k.c — MATMUL_Q4_K family: y[m][n] = sum_k W[n][k] * x[m][k] with
 * Q4_K weights (super-blocks of 256: 8 sub-blocks of 32 4-bit quants q with 6-bit scales sc_j and mins m_j, fp16 d and dmin; x = d*sc_j*q - dmin*m_j).
 * The engine is shared by the seven kquant families (matmul_kq.h); this file
 * fixes the type and says what its three kernels compute.
 *
 *   decode     ds_matmul_decode = ds_matmul(DS_CANONICAL, W, 1, ...): the
 *              canonical kernel below with M = 1 (matmul.c).
 *   canonical  each activation row is quantized ONCE per call to the
 *              partner type, Q8_K (ds_quantize_row_q8_k: 256 quants p, f32 scale e, 16 sums of 16 quants),
 *              and for every (m, n), super-block by super-block in order:
 *                  I = sum_j sc_j * sum_{l in j} q_l p_l;  Mn = sum_j m_j * (sum of p over sub-block j)  (exact)
 *                  acc = fmaf((float)I, d * e, acc); acc = fmaf(-(float)Mn, dmin * e, acc)
 *              (the integer definition of llama.cpp's q4_K x q8_K vec_dot (d*e*sum(sc*dot) - dmin*e*sum(m*bsum))).
 *   fast       the same quantized activations and exact integers, the f32
 *              updates rounded as llama.cpp's scalar vec_dot does
 *              (((float)I * d) * e, then an add), even and odd super-blocks in
 *              two chains, the min term in a third, summed at the end.
 *
 * ==== Why canonical is the same bits everywhere =========================================
 * The activation quantization is a function of the row alone (the same
 * scalar code whatever M, thread or level). After it, I and Mn are exact
 * integers: the AVX2 maddubs/madd lanes (also run by the AVX-512 level),
 * the hadd tree over 8 weight rows and the portable scalar loops all give
 * the same values, whatever the tile shape. Every rounding is in the per-super-block
 * f32 update, which is the same C (fmaf, one IEEE rounding) on every level
 * and runs in super-block order — a sequence fixed by K alone. So canonical(M)
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
/* the AVX2 fused unpack-and-dot block for few activation rows (matmul_kq.h) */
#define KQ_FUSED_TYPE DS_TYPE_Q4_K
#include "kernels/cpu/matmul_kq.h"

KQ_FAMILY(q4_k, DS_TYPE_Q4_K)
