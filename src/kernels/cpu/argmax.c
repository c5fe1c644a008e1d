/* argmax.c — greedy token selection.
 *
 * One strategy, used everywhere (decode, verify, drafter): a left-to-right
 * scan with a strict '>' so ties go to the lowest index, and NaN never wins
 * (every comparison with NaN is false, and a NaN is never taken as the
 * first candidate). All-NaN (or n <= 0) returns 0. There is no arithmetic,
 * so there is no fast variant: argmax of identical logits is identical.
 *
 * The AVX-512 path gives the scan's answer in two vector passes: the
 * maximum m of the non-NaN values (VMAXPS returns its second operand when
 * the first is NaN, so max(x, m) skips NaNs; max involves no rounding), then
 * the lowest index with x[i] == m. That is the scan's index: the scan keeps
 * the first element that no later element exceeds, i.e. the first one
 * numerically equal to the maximum (-0 == +0, and the scan's strict '>'
 * keeps whichever zero came first too). All-NaN leaves m = -inf with no
 * element equal to it: 0, as the scan. A speculative round selects 15 rows
 * of 8192 logits (7 drafted, 8 verified), the scan is ~1 element per cycle. */
#include "kernels/kernels.h"
#include "kernels/cpu/simd.h"

static int64_t argmax_scan(const float *x, int64_t i0, int64_t n, int64_t best, float bv) {
    for (int64_t i = i0; i < n; i++) {
        float v = x[i];
        if (v != v) continue;                 /* NaN */
        if (best < 0 || v > bv) { best = i; bv = v; }
    }
    return best;
}

#if DS_X86
#include <immintrin.h>
__attribute__((target("avx512f"))) static int64_t argmax_avx512(const float *x, int64_t n) {
    const int64_t nv = n & ~(int64_t)15;
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < nv; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
    const float mv = _mm512_reduce_max_ps(m);   /* no NaN in m: exact in any order */
    const __m512 mb = _mm512_set1_ps(mv);
    int64_t best = -1;
    for (int64_t i = 0; i < nv; i += 16) {
        const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), mb, _CMP_EQ_OQ);
        if (k) { best = i + __builtin_ctz((unsigned)k); break; }
    }
    /* the tail (n % 16) continues the scan from the vector part's answer */
    return argmax_scan(x, nv, n, best, best < 0 ? 0.0f : mv);
}
#endif

int64_t ds_argmax(const float *x, int64_t n) {
    int64_t best;
#if DS_X86
    if (n >= 16 && ds_simd_level() == DS_LVL_AVX512) best = argmax_avx512(x, n);
    else
#endif
        best = argmax_scan(x, 0, n, -1, 0.0f);
    return best < 0 ? 0 : best;
}
