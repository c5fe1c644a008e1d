/* dsmath.h — project-owned transcendental functions, written once as a fixed
 * sequence of IEEE-754 operations so that C (CPU kernels) and CUDA (device
 * kernels) compute the SAME bits, on every host and with every C library.
 *
 *   ds_expf      e^x, float: attention's softmax, SwiGLU, the sigmoid gates
 *   ds_sigmoidf  1 / (1 + ds_expf(-t)): the drafter's gates and confidence
 *   ds_tanhf     tanh, float (evaluated in double, rounded once)
 *   ds_sincosf   sin and cos of a float angle: the RoPE table
 *   ds_rope_yarn_sincos  RoPE's scaled (YaRN / linear) cos and sin
 *   ds_powf      b^e for b > 0: RoPE's inverse frequencies
 *   ds_exp       e^x, double: the sampler's top-p / min-p masses
 *   ds_log       natural log, double: the sampler's Gumbel noise
 *
 * The float functions other than ds_expf work in double and round once to
 * float at the end; their double intermediate is accurate to a few units of
 * 2^-50, so the float result is the correctly rounded one except for inputs
 * whose exact value lies within ~2^-26 ulp of a rounding boundary (none was
 * found by tests/test_dsmath.c's sweeps; the bits are the same on every host
 * either way — that, not correct rounding, is the contract).
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

/* DS_MATH_FMA / DS_MATH_FMAD: the correctly rounded fused multiply-add in
 * float / double — __fmaf_rn / __fma_rn on the device, C's fmaf / fma on the
 * host (the FMA instruction wherever the compiler targets one; glibc's exact
 * software algorithm otherwise: a conforming fma has one possible result, so
 * this is no libm dependence). Everything else below is +, -, *, /, exact
 * conversions and integer work, which -ffp-contract=off (C) and -fmad=false
 * (CUDA) keep separately rounded. */
#ifdef __CUDACC__
#define DS_MATH_FN static __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define DS_MATH_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define DS_MATH_FMAD(a, b, c) __fma_rn((a), (b), (c))
#else
#include <math.h>
#include <string.h>
#define DS_MATH_FMA(a, b, c) fmaf((a), (b), (c))
#define DS_MATH_FMAD(a, b, c) fma((a), (b), (c))
#endif
#else
#include <math.h>
#include <string.h>
#define DS_MATH_FN static inline
#define DS_MATH_FMA(a, b, c) fmaf((a), (b), (c))
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__FMA__)
/* x86-64 compiled without -mfma (the default: the SIMD levels are chosen at
 * run time): C's fma is then a call into libm, ~5 ns, and the double
 * functions below make 10-30 of them. Where the CPU has FMA (every AVX2 CPU)
 * the instruction is issued directly (it is the same correctly rounded
 * operation), else libm's fma. The float DS_MATH_FMA stays fmaf: ds_expf is
 * inlined into the kernels' target("...fma...") instances, where GCC emits
 * the instruction itself and an asm statement would only get in the way. */
static inline double ds_math_fmad(double a, double b, double c) {
    if (__builtin_cpu_supports("fma")) {
        __asm__("vfmadd231sd %2, %1, %0" : "+x"(c) : "x"(a), "x"(b));
        return c;
    }
    return fma(a, b, c);
}
#define DS_MATH_FMAD(a, b, c) ds_math_fmad((a), (b), (c))
#else
#define DS_MATH_FMAD(a, b, c) fma((a), (b), (c))
#endif
#endif

/* Bit casts: the device's reinterpret intrinsics, memcpy on the host. */
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
#define DS_MATH_CAST(name, To, From, dev) \
    DS_MATH_FN To name(From v) { return (To)dev(v); }
DS_MATH_CAST(ds_math_bits2f, float, uint32_t, __uint_as_float)
DS_MATH_CAST(ds_math_f2bits, uint32_t, float, __float_as_uint)
DS_MATH_CAST(ds_math_bits2d, double, uint64_t, __longlong_as_double)
DS_MATH_CAST(ds_math_d2bits, uint64_t, double, __double_as_longlong)
#else
#define DS_MATH_CAST(name, To, From, dev) \
    DS_MATH_FN To name(From v) {          \
        To r;                             \
        memcpy(&r, &v, sizeof r);         \
        return r;                         \
    }
DS_MATH_CAST(ds_math_bits2f, float, uint32_t, -)
DS_MATH_CAST(ds_math_f2bits, uint32_t, float, -)
DS_MATH_CAST(ds_math_bits2d, double, uint64_t, -)
DS_MATH_CAST(ds_math_d2bits, uint64_t, double, -)
#endif
#undef DS_MATH_CAST
/* 2^n as a double, for n in the normal range [-1022, 1023] (exact) */
DS_MATH_FN double ds_math_pow2d(int32_t n) { return ds_math_bits2d((uint64_t)(n + 1023) << 52); }

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

/* 1 / (1 + e^-t) in float: the drafter's gates and its confidence head.
 * One ds_expf, one IEEE addition, one IEEE division. */
DS_MATH_FN float ds_sigmoidf(float t) { return 1.0f / (1.0f + ds_expf(-t)); }

/* ==== double precision: e^x and log x ============================================
 * The sampler's top-p / min-p masses and Gumbel noise are double, and so are
 * the float functions' intermediates below. */

/* e^x, double. Cody-Waite reduction x = k ln2 + r (ln2 = LN2_1 + LN2_2, both
 * products fused), |r| <= ln2/2 (+ a few ulp), degree-13 Taylor polynomial by
 * Horner (truncation < 2^-57 relative), 2^k as two exact powers of two so
 * gradual underflow rounds once. Max error ~1 ulp. NaN -> NaN, +inf -> +inf,
 * -inf -> +0, overflow -> +inf, underflow -> subnormal / +0. */
DS_MATH_FN double ds_exp(double x) {
    if (x != x) return x + x;
    if (x > 709.782712893384) return ds_math_bits2d(0x7ff0000000000000ull);     /* +inf */
    if (x < -745.1332191019412) return 0.0;          /* below half the least subnormal */
    const double magic = 6755399441055744.0;         /* 1.5 * 2^52: round to nearest */
    const double kb = x * 0x1.71547652b82fep+0 + magic;  /* x / ln2 */
    const double kd = kb - magic;
    double r = DS_MATH_FMAD(-kd, 0x1.62e42fefa39efp-1, x);
    r = DS_MATH_FMAD(-kd, 0x1.abc9e3b39803fp-56, r);
    double p = 1.6059043836821613e-10;               /* 1/13! */
    p = DS_MATH_FMAD(p, r, 2.08767569878681e-09);    /* 1/12! */
    p = DS_MATH_FMAD(p, r, 2.505210838544172e-08);   /* 1/11! */
    p = DS_MATH_FMAD(p, r, 2.755731922398589e-07);   /* 1/10! */
    p = DS_MATH_FMAD(p, r, 2.7557319223985893e-06);  /* 1/9!  */
    p = DS_MATH_FMAD(p, r, 2.48015873015873e-05);    /* 1/8!  */
    p = DS_MATH_FMAD(p, r, 0.0001984126984126984);   /* 1/7!  */
    p = DS_MATH_FMAD(p, r, 0.001388888888888889);    /* 1/6!  */
    p = DS_MATH_FMAD(p, r, 0.008333333333333333);    /* 1/5!  */
    p = DS_MATH_FMAD(p, r, 0.041666666666666664);    /* 1/4!  */
    p = DS_MATH_FMAD(p, r, 0.16666666666666666);     /* 1/3!  */
    p = DS_MATH_FMAD(p, r, 0.5);
    p = DS_MATH_FMAD(p, r, 1.0);
    p = DS_MATH_FMAD(p, r, 1.0);
    const int32_t n = (int32_t)kd;                   /* exact: |kd| <= 1075 */
    const int32_t n1 = n / 2, n2 = n - n1;
    return (p * ds_math_pow2d(n1)) * ds_math_pow2d(n2);
}

/* log x, double. x = 2^e m with m in [sqrt(1/2), sqrt 2), f = m - 1 (exact),
 * s = f / (2 + f), log m = 2 atanh s = f - f^2/2 + s (f^2/2 + R(s^2)) with
 * R(z) = sum 2 z^k / (2k+1), k = 1..11 (|s| <= 0.1716: truncation < 2^-60),
 * then e ln2 added by one fused multiply-add. Max error ~1.5 ulp.
 * NaN -> NaN, x < 0 -> NaN, +-0 -> -inf, +inf -> +inf; subnormals scaled. */
DS_MATH_FN double ds_log(double x) {
    if (x != x) return x + x;
    if (x < 0.0) return ds_math_bits2d(0x7ff8000000000000ull);          /* NaN */
    if (x == 0.0) return ds_math_bits2d(0xfff0000000000000ull);         /* -inf */
    uint64_t u = ds_math_d2bits(x);
    if ((u >> 52) == 0x7ff) return x;                                   /* +inf */
    int32_t e = 0;
    if ((u >> 52) == 0) {                        /* subnormal: times 2^54, exact */
        u = ds_math_d2bits(x * 18014398509481984.0);
        e = -54;
    }
    e += (int32_t)(u >> 52) - 1023;
    u &= 0x000fffffffffffffull;
    if (u > 0x6a09e667f3bcdull) {                /* m > sqrt 2: use m / 2 */
        u |= 0x3fe0000000000000ull;
        e += 1;
    } else {
        u |= 0x3ff0000000000000ull;
    }
    const double f = ds_math_bits2d(u) - 1.0;    /* exact (Sterbenz) */
    const double s = f / (2.0 + f), z = s * s;
    double R = 2.0 / 23.0;
    R = DS_MATH_FMAD(R, z, 2.0 / 21.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 19.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 17.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 15.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 13.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 11.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 9.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 7.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 5.0);
    R = DS_MATH_FMAD(R, z, 2.0 / 3.0);
    R = R * z;
    const double hfsq = 0.5 * f * f;
    const double ed = (double)e;
    /* log m = f - (hfsq - s (hfsq + R)); e * LN2_2 joins the small terms */
    const double lo = DS_MATH_FMAD(s, hfsq + R, ed * 0x1.abc9e3b39803fp-56);
    return DS_MATH_FMAD(ed, 0x1.62e42fefa39efp-1, f - (hfsq - lo));
}

/* ==== float functions evaluated in double ===================================== */

/* tanh t, float: t itself for |t| < 2^-12 (tanh t = t - t^3/3 rounds to t
 * there; keeps -0 and subnormals), +-1 for |t| > 10 (1 - tanh 10 < 2^-26),
 * otherwise 1 - 2 / (e^{2|t|} + 1) in double with the sign of t, rounded
 * once (relative error of the double < 2^-40 at |t| = 2^-12, less above). */
DS_MATH_FN float ds_tanhf(float t) {
    if (t != t) return t + t;
    const float a = t < 0.0f ? -t : t;
    if (a < 0x1p-12f) return t;
    if (a > 10.0f) return t < 0.0f ? -1.0f : 1.0f;
    const double y = 1.0 - 2.0 / (ds_exp(2.0 * (double)a) + 1.0);
    return (float)(t < 0.0f ? -y : y);
}

/* b^e for b > 0, float: e^(e log b) in double, rounded once. RoPE's inverse
 * frequencies freq_base^(-2i/head_dim) (freq_base is checked > 0 at load).
 * b = 1 or e = 0 gives exactly 1; b = +inf gives +inf / 1 / +0 by the sign
 * of e; b <= 0 or NaN, or e NaN, gives NaN (not C's pow rules: not needed). */
DS_MATH_FN float ds_powf(float b, float e) {
    if (b != b || e != e || !(b > 0.0f)) return ds_math_bits2f(0x7fc00000u);
    if (e == 0.0f) return 1.0f;
    if (b == ds_math_bits2f(0x7f800000u)) return e > 0.0f ? b : 0.0f;
    return (float)ds_exp((double)e * ds_log((double)b));
}

/* sin and cos of a float angle (RoPE's (float)pos * inv_freq).
 *
 * Reduction to r = x - k pi/2, |r| <= pi/4 (+ rounding), in double:
 *  - |x| < 2^24: k = round(x * 2/pi); r = x - k P1 - k P2 - k P3 with
 *    pi/2 = P1 + P2 + P3 (each subtraction one fused multiply-add). The error
 *    is below 2^-53 |r| + 2^-80, far under the nearest approach of a float
 *    below 2^24 to a multiple of pi/2.
 *  - |x| >= 2^24 (x = M 2^E, M < 2^24 an integer, E >= 1): Payne-Hanek. The
 *    integer part of x * 2/pi beyond 4 cannot matter, so only 128 bits of
 *    2/pi from bit E-1 on are needed: (M * those bits) mod 2^128 is x * 2/pi
 *    mod 4 in 2.126 fixed point, exactly but for the truncated tail
 *    (< 2^-100). Its top two bits (rounded to nearest) are k mod 4, the rest
 *    a signed fraction, normalised to a double and multiplied by pi/2.
 * Then Taylor polynomials in r^2 (sin to r^17, cos to r^16: truncation
 * < 2^-55 on |r| <= pi/4), k mod 4 picks signs and swaps, and each result is
 * rounded once to float. sin(+-0) = +-0, cos(+-0) = 1; inf and NaN give NaN. */
DS_MATH_FN void ds_math_sincos_poly(double r, double *s, double *c) {
    const double z = r * r;
    double ps = 2.8114572543455206e-15;              /* 1/17! */
    ps = DS_MATH_FMAD(ps, z, -7.647163731819816e-13);   /* -1/15! */
    ps = DS_MATH_FMAD(ps, z, 1.6059043836821613e-10);   /* 1/13!  */
    ps = DS_MATH_FMAD(ps, z, -2.505210838544172e-08);   /* -1/11! */
    ps = DS_MATH_FMAD(ps, z, 2.7557319223985893e-06);   /* 1/9!   */
    ps = DS_MATH_FMAD(ps, z, -0.0001984126984126984);   /* -1/7!  */
    ps = DS_MATH_FMAD(ps, z, 0.008333333333333333);     /* 1/5!   */
    ps = DS_MATH_FMAD(ps, z, -0.16666666666666666);     /* -1/3!  */
    *s = DS_MATH_FMAD(r * z, ps, r);
    double pc = 4.779477332387385e-14;               /* 1/16! */
    pc = DS_MATH_FMAD(pc, z, -1.1470745597729725e-11);  /* -1/14! */
    pc = DS_MATH_FMAD(pc, z, 2.08767569878681e-09);     /* 1/12!  */
    pc = DS_MATH_FMAD(pc, z, -2.755731922398589e-07);   /* -1/10! */
    pc = DS_MATH_FMAD(pc, z, 2.48015873015873e-05);     /* 1/8!   */
    pc = DS_MATH_FMAD(pc, z, -0.001388888888888889);    /* -1/6!  */
    pc = DS_MATH_FMAD(pc, z, 0.041666666666666664);     /* 1/4!   */
    pc = DS_MATH_FMAD(pc, z, -0.5);
    *c = DS_MATH_FMAD(z, pc, 1.0);
}

/* Payne-Hanek for a = |x| >= 2^24, finite: *r = (a mod pi/2, to nearest),
 * returns the quadrant k mod 4. */
DS_MATH_FN uint32_t ds_math_reduce_big(float a, double *r) {
    /* 2/pi in binary, 320 bits after the point (a leading zero word stands
     * for the integer part, so bit t_i of 2/pi sits at position i + 31) */
    const uint32_t T[11] = { 0u,          0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u,
                             0x3c439041u, 0xfe5163abu, 0xdebbc561u, 0xb7246e3au, 0x424dd2e0u };
    const uint32_t u = ds_math_f2bits(a);
    const uint32_t M = (u & 0x7fffffu) | 0x800000u;
    const int32_t E = (int32_t)(u >> 23) - 150;               /* a = M 2^E, 1 <= E <= 104 */
    const int32_t p0 = E + 30, w = p0 >> 5, sh = p0 & 31;     /* bits t_{E-1} .. t_{E+126} */
    uint32_t W[4];                                            /* W[0] least significant */
    for (int i = 0; i < 4; i++) {
        const uint32_t hi = T[w + 3 - i], lo = T[w + 4 - i];
        W[i] = sh ? (hi << sh) | (lo >> (32 - sh)) : hi;
    }
    uint32_t P[4];
    uint64_t carry = 0;
    for (int i = 0; i < 4; i++) {
        const uint64_t t = (uint64_t)M * W[i] + carry;
        P[i] = (uint32_t)t;
        carry = t >> 32;
    }
    /* x * 2/pi mod 4 = P * 2^-126: k = the top two bits, plus one when the
     * fraction (the next 126 bits, as a signed 2^-128 fixed point F = P << 2)
     * is >= 1/2, i.e. when F is negative */
    uint32_t k = P[3] >> 30;
    uint32_t Fw[4] = { P[0] << 2, (P[1] << 2) | (P[0] >> 30), (P[2] << 2) | (P[1] >> 30),
                       (P[3] << 2) | (P[2] >> 30) };
    const int neg = (int)(Fw[3] >> 31);
    if (neg) {                                   /* F = -F, two's complement */
        k += 1;
        uint64_t c = 1;
        for (int i = 0; i < 4; i++) {
            const uint64_t t = (uint64_t)(uint32_t)~Fw[i] + c;
            Fw[i] = (uint32_t)t;
            c = t >> 32;
        }
    }
    /* normalise |F| (< 2^127) to its top 53 bits: an exact double */
    int32_t top = 3;
    while (top > 0 && Fw[top] == 0) top--;
    if (Fw[top] == 0) { *r = 0.0; return k & 3u; }
    int32_t lz = 0;
    while (!(Fw[top] & (0x80000000u >> lz))) lz++;
    const int32_t msb = top * 32 + 31 - lz;                    /* bit index of the leading one */
    uint64_t m53 = 0;
    for (int32_t b = msb; b > msb - 53 && b >= 0; b--)
        m53 = (m53 << 1) | ((Fw[b >> 5] >> (b & 31)) & 1u);
    const int32_t nb = msb >= 52 ? 53 : msb + 1;                /* bits taken */
    /* |F| 2^-128 = m53 2^(msb - nb + 1 - 128), the power split in two normal factors */
    const int32_t ex = msb - nb + 1 - 128;
    const double f = ((double)m53 * ds_math_pow2d(ex / 2)) * ds_math_pow2d(ex - ex / 2);
    const double rr = f * 0x1.921fb54442d18p+0;                 /* times pi/2 */
    *r = neg ? -rr : rr;
    return k & 3u;
}

DS_MATH_FN void ds_sincosf(float x, float *sn, float *cs) {
    if (x != x || x - x != 0.0f) {               /* NaN or +-inf */
        *sn = *cs = ds_math_bits2f(0x7fc00000u);
        return;
    }
    if (x == 0.0f) { *sn = x; *cs = 1.0f; return; }
    const float a = x < 0.0f ? -x : x;
    double r;
    uint32_t k;
    if (a < 16777216.0f) {
        const double xd = (double)a, magic = 6755399441055744.0;
        const double kd = (xd * 0x1.45f306dc9c883p-1 + magic) - magic;   /* round(x * 2/pi) */
        r = DS_MATH_FMAD(-kd, 0x1.921fb54442d18p+0, xd);
        r = DS_MATH_FMAD(-kd, 0x1.1a62633145c07p-54, r);
        r = DS_MATH_FMAD(-kd, -0x1.f1976b7ed8fbcp-110, r);
        k = (uint32_t)(int64_t)kd & 3u;
    } else {
        k = ds_math_reduce_big(a, &r);
    }
    double s, c;
    ds_math_sincos_poly(r, &s, &c);
    double so, co;                                /* sin, cos of |x| by quadrant */
    switch (k) {
    case 0: so = s; co = c; break;
    case 1: so = c; co = -s; break;
    case 2: so = -s; co = -c; break;
    default: so = -c; co = s; break;
    }
    *sn = (float)(x < 0.0f ? -so : so);
    *cs = (float)co;
}

/* RoPE's scaled cos/sin (kernels.h ds_rope_yarn; llama.cpp's rope_yarn in its
 * operation order) of pair i whose angle theta already carries any frequency
 * factor: the interpolated angle freq_scale * theta, mixed back toward theta
 * by the YaRN ramp when ext_factor != 0, then cos and sin times mscale. The
 * CPU kernel, the CUDA host table and the CUDA device fallback all call this
 * one sequence. */
DS_MATH_FN void ds_rope_yarn_sincos(float theta, int i, float freq_scale, float ext_factor, float lo, float hi,
                                    float mscale, float *sn, float *cs) {
    const float interp = freq_scale * theta;
    float t = interp;
    if (ext_factor != 0.0f) {
        float r = ((float)i - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
        r = 1.0f - (r < 0.0f ? 0.0f : r > 1.0f ? 1.0f : r);
        const float mix = r * ext_factor;
        t = interp * (1.0f - mix) + theta * mix;
    }
    ds_sincosf(t, sn, cs);
    *sn = *sn * mscale;
    *cs = *cs * mscale;
}

#endif
