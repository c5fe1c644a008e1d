/* expf16.h — ds_expf (kernels/dsmath.h) on 16 lanes of AVX-512 (ds_expf16)
 * and on 8 lanes of AVX2 + FMA (ds_expf8): the same
 * IEEE operations lane by lane — mul then add (never contracted), fnmadd =
 * fma(-kf, c, x), the Horner fmadds, exact conversions, n / 2 rounding toward
 * zero as C's, exponent-field scaling as two products — and its three special
 * cases (NaN, overflow, underflow) as masks. So every lane is ds_expf's bits
 * (tests/cli_simd.sh and cli_golden's raw logits compare the levels).
 * Used by attention's exponentials and SwiGLU's. */
#ifndef DSPARK_CPU_EXPF16_H
#define DSPARK_CPU_EXPF16_H

#include "kernels/cpu/simd.h"

#if DS_X86
#include <immintrin.h>

/* The one body, written over an intrinsic prefix P (_mm512 / _mm256) and
 * the width's select (SEL(y, mask_of(x), v): v where the comparison holds). */
#define DS_EXPF_BODY(P, V, VI, BITS, SEL)                                                                \
    const V magic = P##_set1_ps(12582912.0f);                                                      \
    const V kb = P##_add_ps(P##_mul_ps(x, P##_set1_ps(1.44269502162933349609375f)), magic);        \
    const V kf = P##_sub_ps(kb, magic);                                                            \
    const VI n = P##_cvttps_epi32(kf);                                                             \
    V r = P##_fnmadd_ps(kf, P##_set1_ps(0.693147182464599609375f), x);                             \
    r = P##_fnmadd_ps(kf, P##_set1_ps(-1.904654323148236e-09f), r);                                \
    V q = P##_set1_ps(1.98412698412698412e-04f);                                                   \
    q = P##_fmadd_ps(q, r, P##_set1_ps(1.38888888888888889e-03f));                                 \
    q = P##_fmadd_ps(q, r, P##_set1_ps(8.33333333333333333e-03f));                                 \
    q = P##_fmadd_ps(q, r, P##_set1_ps(4.16666666666666667e-02f));                                 \
    q = P##_fmadd_ps(q, r, P##_set1_ps(1.66666666666666667e-01f));                                 \
    q = P##_fmadd_ps(q, r, P##_set1_ps(0.5f));                                                     \
    q = P##_fmadd_ps(q, r, P##_set1_ps(1.0f));                                                     \
    q = P##_fmadd_ps(q, r, P##_set1_ps(1.0f));                                                     \
    const VI n1 = P##_srai_epi32(P##_add_epi32(n, P##_srli_epi32(n, 31)), 1); /* n / 2 */          \
    const VI n2 = P##_sub_epi32(n, n1);                                                            \
    const VI e127 = P##_set1_epi32(127);                                                           \
    const V s1 = P##_castsi##BITS##_ps(P##_slli_epi32(P##_add_epi32(n1, e127), 23));               \
    const V s2 = P##_castsi##BITS##_ps(P##_slli_epi32(P##_add_epi32(n2, e127), 23));               \
    V y = P##_mul_ps(P##_mul_ps(q, s1), s2);                                                       \
    y = SEL(y, x, P##_set1_ps(-103.97208404541015625f), _CMP_LT_OQ, P##_setzero_ps());             \
    y = SEL(y, x, P##_set1_ps(88.72283935546875f), _CMP_GT_OQ,                                     \
            P##_castsi##BITS##_ps(P##_set1_epi32(0x7f800000)));                                   \
    y = SEL(y, x, x, _CMP_UNORD_Q, P##_add_ps(x, x));                                              \
    return y;

#define DS_SEL16(y, a, b, cmp, v) _mm512_mask_mov_ps((y), _mm512_cmp_ps_mask((a), (b), (cmp)), (v))
#define DS_SEL8(y, a, b, cmp, v) _mm256_blendv_ps((y), (v), _mm256_cmp_ps((a), (b), (cmp)))
DS_TARGET_AVX512 static inline __m512 ds_expf16(__m512 x) { DS_EXPF_BODY(_mm512, __m512, __m512i, 512, DS_SEL16) }
DS_TARGET_AVX2 static inline __m256 ds_expf8(__m256 x) { DS_EXPF_BODY(_mm256, __m256, __m256i, 256, DS_SEL8) }
#undef DS_SEL16
#undef DS_SEL8
#undef DS_EXPF_BODY
#endif

#endif
