/* dsmath.h — project-owned transcendental functions, written once as a fixed
 * sequence of IEEE-754 operations so that C (CPU kernels) and CUDA (device
 * kernels) compute the SAME bits.
 *
 * ==== Why not libm / CUDA's expf ====================================================
 * glibc's expf and CUDA's expf are both accurate (under 1 and 2 ulp), but they
 * are different algorithms: they disagree in the last bit for a fraction of
 * inputs, and glibc even picks an FMA or a non-FMA variant at load time. A
 * kernel that must give the same bits on the CPU and the GPU cannot call
 * either. ds_expf below uses only +, -, *, one explicit fused multiply-add
 * per polynomial step, exact integer <-> float conversions and exponent-field
 * scaling: every one of those is a correctly rounded IEEE operation on both
 * sides (C: -ffp-contract=off and fmaf; CUDA: -fmad=false and __fmaf_rn), so
 * the result is a pure function of the input bits.
 *
 * Accuracy: Cody-Waite reduction x = n ln2 + r with the split constant applied
 * by FMA, |r| <= ln2/2, degree-7 Taylor polynomial (truncation ~5e-9
 * relative), 2^n applied as two exact power-of-two factors so that gradual
 * underflow rounds once. tests/cuda/test_cuda_ops.c measures the ulp error
 * against double exp on the host. NaN -> NaN, +inf -> +inf, -inf -> +0,
 * overflow -> +inf, underflow -> subnormal / +0 as expf does. */
#ifndef DSPARK_DSMATH_H
#define DSPARK_DSMATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define DS_MATH_FN static __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define DS_MATH_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#include <math.h>
#define DS_MATH_FMA(a, b, c) fmaf((a), (b), (c))
#endif
#else
#include <math.h>
#include <string.h>
#define DS_MATH_FN static inline
#define DS_MATH_FMA(a, b, c) fmaf((a), (b), (c))
#endif

DS_MATH_FN float ds_math_bits2f(uint32_t u) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* e^x, same bits on every target that has IEEE binary32 and a correctly
 * rounded fused multiply-add. */
DS_MATH_FN float ds_expf(float x) {
    if (x != x) return x + x;                              /* NaN stays NaN */
    if (x > 88.72283935546875f) return ds_math_bits2f(0x7f800000u);      /* +inf */
    if (x < -103.97208404541015625f) return 0.0f;          /* below half the least subnormal */
    /* n = round-to-nearest(x * log2 e) by the 1.5 * 2^23 magic number */
    const float magic = 12582912.0f;
    const float kb = x * 1.44269502162933349609375f + magic;
    const float kf = kb - magic;
    const int32_t n = (int32_t)kf;                         /* exact: |kf| <= 150 */
    /* r = x - n ln2 with ln2 = C1 + C2 (C1 the f32 nearest ln2) */
    float r = DS_MATH_FMA(-kf, 0.693147182464599609375f, x);
    r = DS_MATH_FMA(-kf, -1.904654323148236e-09f, r);
    /* e^r, Horner, one rounding per step */
    float p = 1.98412698412698412e-04f;                    /* 1/5040 */
    p = DS_MATH_FMA(p, r, 1.38888888888888889e-03f);       /* 1/720 */
    p = DS_MATH_FMA(p, r, 8.33333333333333333e-03f);       /* 1/120 */
    p = DS_MATH_FMA(p, r, 4.16666666666666667e-02f);       /* 1/24  */
    p = DS_MATH_FMA(p, r, 1.66666666666666667e-01f);       /* 1/6   */
    p = DS_MATH_FMA(p, r, 0.5f);
    p = DS_MATH_FMA(p, r, 1.0f);
    p = DS_MATH_FMA(p, r, 1.0f);
    /* times 2^n as 2^n1 * 2^n2 (each a normal power of two): the first
     * product is exact, the second rounds once (also into the subnormals) */
    const int32_t n1 = n / 2, n2 = n - n1;
    const float s1 = ds_math_bits2f((uint32_t)(n1 + 127) << 23);
    const float s2 = ds_math_bits2f((uint32_t)(n2 + 127) << 23);
    return (p * s1) * s2;
}

#endif
