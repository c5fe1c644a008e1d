/* expf16.h — ds_expf (kernels/dsmath.h) on 16 lanes of AVX-512: the same
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

DS_TARGET_AVX512 static inline __m512 ds_expf16(__m512 x) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 kb = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269502162933349609375f)), magic);
    const __m512 kf = _mm512_sub_ps(kb, magic);
    const __m512i n = _mm512_cvttps_epi32(kf);
    __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(0.693147182464599609375f), x);
    r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(-1.904654323148236e-09f), r);
    __m512 q = _mm512_set1_ps(1.98412698412698412e-04f);
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.38888888888888889e-03f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.33333333333333333e-03f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(4.16666666666666667e-02f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.66666666666666667e-01f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.5f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
    const __m512i n1 = _mm512_srai_epi32(_mm512_add_epi32(n, _mm512_srli_epi32(n, 31)), 1);  /* n / 2 */
    const __m512i n2 = _mm512_sub_epi32(n, n1);
    const __m512i e127 = _mm512_set1_epi32(127);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, e127), 23));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, e127), 23));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(q, s1), s2);
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-103.97208404541015625f), _CMP_LT_OQ),
                           _mm512_setzero_ps());
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283935546875f), _CMP_GT_OQ),
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x7f800000)));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_add_ps(x, x));
    return y;
}
#endif

#endif
