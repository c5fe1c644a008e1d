/* exp_many.c — ds_exp over an array: y[i] = ds_exp(x[i]), bit for bit.
 *
 * The sampler's top-p mass is a sum of e^(x_i - max) over the whole
 * vocabulary (sampler.c: Z, in double, in index order). On a 152k-token
 * vocabulary the ~150k scalar ds_exp calls are most of a sampled token's
 * cost (~4 ms on one core), and a server samples one row per request per
 * step, on the host, while the GPU waits. The sum itself stays sequential
 * (its order is the definition); only the exponentials are computed here,
 * 4 (AVX2) or 8 (AVX-512) at a time.
 *
 * ==== Why the bits are ds_exp's =======================================================
 * Each lane runs ds_exp's own sequence (kernels/dsmath.h) with the vector
 * form of each IEEE operation: x * (1/ln2) and + magic as two separately
 * rounded operations (VMULPD, VADDPD: -ffp-contract=off keeps the scalar
 * code's two roundings, so the vector code must not fuse them either), the
 * Cody-Waite steps and the polynomial as VFMADD (one rounding, as fma()),
 * the integer conversion of kd exact (|kd| <= 1075), n / 2 truncated toward
 * zero as C's integer division, 2^n1 and 2^n2 built in the exponent field
 * (both normal: |n1|, |n2| <= 538), two multiplications in the scalar
 * order. The special cases (NaN -> x + x, x > 709.78... -> +inf, x <
 * -745.13... -> +0) are the scalar tests' results blended in per lane.
 * Every operation is correctly rounded the same way per lane, so a lane's
 * result is the scalar call's; tests/test_dsmath.c compares them on a sweep
 * and on the special values at every level (DSPARK_SIMD). */
#include "kernels/cpu/exp_many.h"
#include "kernels/cpu/simd.h"
#include "kernels/dsmath.h"

#include <math.h>

static void exp_many_scalar(const double *x, double *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = ds_exp(x[i]);
}

#if DS_X86
#include <immintrin.h>

/* the polynomial's coefficients, 1/13! .. 1/0!, as in ds_exp */
#define EXPD_POLY(FMA, SET, p, r)                                          \
    do {                                                                   \
        p = FMA(p, r, SET(2.08767569878681e-09));                          \
        p = FMA(p, r, SET(2.505210838544172e-08));                         \
        p = FMA(p, r, SET(2.755731922398589e-07));                         \
        p = FMA(p, r, SET(2.7557319223985893e-06));                        \
        p = FMA(p, r, SET(2.48015873015873e-05));                          \
        p = FMA(p, r, SET(0.0001984126984126984));                         \
        p = FMA(p, r, SET(0.001388888888888889));                          \
        p = FMA(p, r, SET(0.008333333333333333));                          \
        p = FMA(p, r, SET(0.041666666666666664));                          \
        p = FMA(p, r, SET(0.16666666666666666));                           \
        p = FMA(p, r, SET(0.5));                                           \
        p = FMA(p, r, SET(1.0));                                           \
        p = FMA(p, r, SET(1.0));                                           \
    } while (0)

__attribute__((target("avx2,fma"))) static void exp_many_avx2(const double *x, double *y, int64_t n) {
    const __m256d magic = _mm256_set1_pd(6755399441055744.0), inv_ln2 = _mm256_set1_pd(0x1.71547652b82fep+0);
    const __m256d c1 = _mm256_set1_pd(0x1.62e42fefa39efp-1), c2 = _mm256_set1_pd(0x1.abc9e3b39803fp-56);
    const __m256d hi = _mm256_set1_pd(709.782712893384), lo = _mm256_set1_pd(-745.1332191019412);
    const __m256d inf = _mm256_set1_pd(INFINITY), zero = _mm256_setzero_pd(), sign = _mm256_set1_pd(-0.0);
    const __m128i bias = _mm_set1_epi32(1023);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d v = _mm256_loadu_pd(x + i);
        const __m256d kb = _mm256_add_pd(_mm256_mul_pd(v, inv_ln2), magic);
        const __m256d kd = _mm256_sub_pd(kb, magic);
        const __m256d nkd = _mm256_xor_pd(kd, sign);                       /* -kd, exact */
        __m256d r = _mm256_fmadd_pd(nkd, c1, v);
        r = _mm256_fmadd_pd(nkd, c2, r);
        __m256d p = _mm256_set1_pd(1.6059043836821613e-10);
        EXPD_POLY(_mm256_fmadd_pd, _mm256_set1_pd, p, r);
        /* n = (int)kd (exact for the lanes kept), n1 = n / 2 toward zero */
        const __m128i nn = _mm256_cvttpd_epi32(kd);
        const __m128i n1 = _mm_srai_epi32(_mm_add_epi32(nn, _mm_srli_epi32(nn, 31)), 1);
        const __m128i n2 = _mm_sub_epi32(nn, n1);
        const __m256d s1 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(n1, bias)), 52));
        const __m256d s2 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(n2, bias)), 52));
        __m256d out = _mm256_mul_pd(_mm256_mul_pd(p, s1), s2);
        /* the scalar tests, in the scalar order: NaN, then > hi, then < lo */
        out = _mm256_blendv_pd(out, zero, _mm256_cmp_pd(v, lo, _CMP_LT_OQ));
        out = _mm256_blendv_pd(out, inf, _mm256_cmp_pd(v, hi, _CMP_GT_OQ));
        out = _mm256_blendv_pd(out, _mm256_add_pd(v, v), _mm256_cmp_pd(v, v, _CMP_UNORD_Q));
        _mm256_storeu_pd(y + i, out);
    }
    exp_many_scalar(x + i, y + i, n - i);
}

__attribute__((target("avx512f"))) static void exp_many_avx512(const double *x, double *y, int64_t n) {
    const __m512d magic = _mm512_set1_pd(6755399441055744.0), inv_ln2 = _mm512_set1_pd(0x1.71547652b82fep+0);
    const __m512d c1 = _mm512_set1_pd(0x1.62e42fefa39efp-1), c2 = _mm512_set1_pd(0x1.abc9e3b39803fp-56);
    const __m512d hi = _mm512_set1_pd(709.782712893384), lo = _mm512_set1_pd(-745.1332191019412);
    const __m512d inf = _mm512_set1_pd(INFINITY), zero = _mm512_setzero_pd();
    const __m512i sgn = _mm512_set1_epi64((long long)0x8000000000000000ull);
    const __m256i bias = _mm256_set1_epi32(1023);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d v = _mm512_loadu_pd(x + i);
        const __m512d kb = _mm512_add_pd(_mm512_mul_pd(v, inv_ln2), magic);
        const __m512d kd = _mm512_sub_pd(kb, magic);
        const __m512d nkd = _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(kd), sgn));   /* -kd, exact */
        __m512d r = _mm512_fmadd_pd(nkd, c1, v);
        r = _mm512_fmadd_pd(nkd, c2, r);
        __m512d p = _mm512_set1_pd(1.6059043836821613e-10);
        EXPD_POLY(_mm512_fmadd_pd, _mm512_set1_pd, p, r);
        const __m256i nn = _mm512_cvttpd_epi32(kd);
        const __m256i n1 = _mm256_srai_epi32(_mm256_add_epi32(nn, _mm256_srli_epi32(nn, 31)), 1);
        const __m256i n2 = _mm256_sub_epi32(nn, n1);
        const __m512d s1 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm256_add_epi32(n1, bias)), 52));
        const __m512d s2 = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm256_add_epi32(n2, bias)), 52));
        __m512d out = _mm512_mul_pd(_mm512_mul_pd(p, s1), s2);
        out = _mm512_mask_mov_pd(out, _mm512_cmp_pd_mask(v, lo, _CMP_LT_OQ), zero);
        out = _mm512_mask_mov_pd(out, _mm512_cmp_pd_mask(v, hi, _CMP_GT_OQ), inf);
        out = _mm512_mask_mov_pd(out, _mm512_cmp_pd_mask(v, v, _CMP_UNORD_Q), _mm512_add_pd(v, v));
        _mm512_storeu_pd(y + i, out);
    }
    exp_many_scalar(x + i, y + i, n - i);
}
#endif

void ds_exp_many_at(int lv, const double *x, double *y, int64_t n) {
#if DS_X86
    if (lv == DS_LVL_AVX512 && ds_simd_level_ok(lv)) { exp_many_avx512(x, y, n); return; }
    if (DS_LVL_BASE(lv) == DS_LVL_AVX2 && ds_simd_level_ok(DS_LVL_AVX2)) { exp_many_avx2(x, y, n); return; }
#endif
    (void)lv;
    exp_many_scalar(x, y, n);
}

void ds_exp_many(const double *x, double *y, int64_t n) { ds_exp_many_at(ds_simd_level(), x, y, n); }
