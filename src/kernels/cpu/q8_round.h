/* q8_round.h — the rounding step of ggml's quantize_row_q8_0_ref on 16 lanes
 * of AVX-512 (and 8 of AVX2): q = roundf(x * id) (halves away from zero), saturated to
 * [-128, 127], a NaN product (inf * 0) giving 0. Written once so that the two
 * AVX-512 quantizers — ds_quantize_row_q8_0 (registry.c) and the canonical
 * matmul's row quantizer (matmul.c), which must give the same quants — run
 * one instruction sequence: multiply, the NaN mask, the clamp, a truncating
 * convert, the exact fraction x - trunc(x), then +1 / -1 where the fraction
 * reaches +0.5 / -0.5. Every step is an exact or correctly rounded IEEE
 * operation per lane, so it is also the scalar loop's answer. */
#ifndef DSPARK_CPU_Q8_ROUND_H
#define DSPARK_CPU_Q8_ROUND_H

#include "kernels/cpu/simd.h"

#if DS_X86
#include <immintrin.h>

/* avx512f only, so that it inlines into any AVX-512 caller */
__attribute__((target("avx512f"))) static inline __m512i ds_q8_round16(__m512 x, __m512 id) {
    const __m512i one = _mm512_set1_epi32(1);
    __m512 v = _mm512_mul_ps(x, id);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);   /* NaN (inf * 0) -> 0 */
    v = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(127.0f)), _mm512_set1_ps(-128.0f));
    const __m512i t = _mm512_cvttps_epi32(v);
    const __m512 r = _mm512_sub_ps(v, _mm512_cvtepi32_ps(t));
    const __m512i u = _mm512_mask_add_epi32(t, _mm512_cmp_ps_mask(r, _mm512_set1_ps(0.5f), _CMP_GE_OQ), t, one);
    return _mm512_mask_sub_epi32(u, _mm512_cmp_ps_mask(r, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), u, one);
}

/* the same sequence on 8 lanes of AVX2 (masks as all-ones lanes: t - (-1) is
 * the +1 step, + (-1) the -1 step) */
__attribute__((target("avx2"))) static inline __m256i ds_q8_round8(__m256 x, __m256 id) {
    __m256 v = _mm256_mul_ps(x, id);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));             /* NaN (inf * 0) -> 0 */
    v = _mm256_max_ps(_mm256_min_ps(v, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-128.0f));
    const __m256i t = _mm256_cvttps_epi32(v);
    const __m256 r = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
    const __m256i u = _mm256_sub_epi32(t, _mm256_castps_si256(_mm256_cmp_ps(r, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
    return _mm256_add_epi32(u, _mm256_castps_si256(_mm256_cmp_ps(r, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
}
/* One block of 32 floats for the AVX2 quantizers: the four vectors, the
 * largest |x| (ds_quantize_row_q8_0's amax: the max over a NaN-free block is
 * one value in any order; fabs leaves no -0); returns nonzero when the block
 * holds a NaN (the callers take the scalar reference then). */
__attribute__((target("avx2"))) static inline int ds_q8_block8(const float *xb, __m256 v[4], float *amax) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 nan = _mm256_setzero_ps(), m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
        m = _mm256_max_ps(m, _mm256_and_ps(v[k], absm));
    }
    float mb[8], a = 0.0f;
    _mm256_storeu_ps(mb, m);
    for (int l = 0; l < 8; l++) a = a > mb[l] ? a : mb[l];
    *amax = a;
    return _mm256_movemask_ps(nan);
}
/* 32 int32 quants in [-128, 127] (four vectors, in order) -> 32 bytes */
__attribute__((target("avx2"))) static inline __m256i ds_q8_pack32(const __m256i q[4]) {
    const __m256i a = _mm256_packs_epi32(q[0], q[1]), b = _mm256_packs_epi32(q[2], q[3]);   /* int16, lanes mixed */
    const __m256i c = _mm256_packs_epi16(a, b);                                             /* int8, lanes mixed */
    return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

#endif
