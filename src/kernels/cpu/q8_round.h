/* q8_round.h — the rounding step of ggml's quantize_row_q8_0_ref on 16 lanes
 * of AVX-512: q = roundf(x * id) (halves away from zero), saturated to
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
#endif

#endif
