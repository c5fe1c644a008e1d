/* ops_internal.h — lane helpers shared by the non-matmul operator families
 * (attention, rmsnorm, rope, swiglu, residual). Private to src/kernels/cpu.
 *
 * ==== Canonical reductions ==================================================
 * A canonical reduction is written as a FIXED array of 16 independent lane
 * accumulators (element i goes to lane i mod 16) and a FIXED combine tree
 * (16 -> 8 -> 4 -> 2 -> 1). It is plain C with no reassociation, so the
 * compiler may vectorize the lanes (4 x SSE, 2 x AVX, 1 x AVX-512, 4 x NEON)
 * but can never change which additions happen in which order: the bits are a
 * function of the reduced length only — not of M, of the caller, of the
 * thread, or of the CPU's SIMD width. The build uses -ffp-contract=off, so
 * a*b+c is always a rounded product followed by a rounded add (no FMA).
 *
 * ==== Fast helpers ==========================================================
 * The fast variants deliberately use other orders (8 lanes, 4 lanes, fused
 * loops) and a vectorizable exp approximation instead of libm expf. They are
 * accurate, but their bits differ from the canonical ones — by design. */
#ifndef DSPARK_OPS_INTERNAL_H
#define DSPARK_OPS_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define DS_LANES 16

/* ---- canonical: fixed 16-lane combine tree --------------------------------
 * a[l] += a[l+8] for l<8, then +4, +2, +1. Destroys a[]. */
static inline float ds_lanes16_combine(float a[DS_LANES]) {
    for (int l = 0; l < 8; l++) a[l] += a[l + 8];
    for (int l = 0; l < 4; l++) a[l] += a[l + 4];
    for (int l = 0; l < 2; l++) a[l] += a[l + 2];
    return a[0] + a[1];
}

/* ---- canonical: 16-lane dot product, element i -> lane i mod 16 ---------- */
static inline float ds_dot16(const float *a, const float *b, int64_t n) {
    float acc[DS_LANES] = {0};
    int64_t i = 0;
    for (; i + DS_LANES <= n; i += DS_LANES)
        for (int l = 0; l < DS_LANES; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i + l < n; l++) acc[l] += a[i + l] * b[i + l];   /* tail: same lanes */
    return ds_lanes16_combine(acc);
}

/* ---- canonical: 16-lane sum of squares ----------------------------------- */
static inline float ds_sumsq16(const float *x, int64_t n) {
    float acc[DS_LANES] = {0};
    int64_t i = 0;
    for (; i + DS_LANES <= n; i += DS_LANES)
        for (int l = 0; l < DS_LANES; l++) acc[l] += x[i + l] * x[i + l];
    for (int l = 0; i + l < n; l++) acc[l] += x[i + l] * x[i + l];
    return ds_lanes16_combine(acc);
}

/* ---- fast: exp(x) without libm, branch-free and vectorizable --------------
 * n = round(x*log2(e)) by the 1.5*2^23 magic-number trick, r = x - n*ln2 in
 * two steps (Cody-Waite), e^r by a degree-6 Taylor polynomial on
 * |r| <= ln2/2 (truncation error ~1.2e-7 relative), and 2^n applied as two
 * exponent-field factors so that results underflow to denormals/0 and
 * overflow to inf the way expf does. Inputs are clamped to [-104, 104]
 * (beyond that expf is 0 or inf anyway); NaN stays NaN. The clamp is done on
 * the bit pattern with integer masks: a float ?: is not if-converted under
 * -ftrapping-math, and the branch would stop the loop from vectorizing. */
static inline float ds_bits2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ds_f2bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float ds_exp_fast(float x) {
    const float magic = 12582912.0f;                  /* 1.5 * 2^23 */
    uint32_t xb = ds_f2bits(x), ax = xb & 0x7fffffffu;
    uint32_t big = 0u - (uint32_t)((ax > 0x42d00000u) & (ax <= 0x7f800000u)); /* 104 < |x| <= inf */
    xb = (xb & ~big) | (((xb & 0x80000000u) | 0x42d00000u) & big);
    x = ds_bits2f(xb);
    float t  = x * 1.44269504088896341f;
    float kb = t + magic;                             /* round to nearest int */
    float kf = kb - magic;
    int32_t n = (int32_t)(ds_f2bits(kb) - ds_f2bits(magic));
    float r = x - kf * 0.693145751953125f;            /* ln2 hi (exact product) */
    r = r - kf * 1.428606765330187045e-06f;           /* ln2 lo */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t n1 = n / 2, n2 = n - n1;                  /* each in [-76, 76] */
    float s1 = ds_bits2f((uint32_t)(n1 + 127) << 23);
    float s2 = ds_bits2f((uint32_t)(n2 + 127) << 23);
    return (p * s1) * s2;
}

/* ---- run-time SIMD level for the heavy loops -------------------------------
 * DS_OPS_DISPATCH(name) compiles a range function three times (AVX-512, AVX2,
 * baseline) and defines `name` to call the instance of the process's ONE SIMD
 * level, ds_simd_level() (registry.c: detected once, capped by DSPARK_SIMD).
 * The caller writes the body as `DS_OPS_BODY(name) { ... }`; it is plain C
 * with fixed lane arrays and no contraction, inlined into each instance, so
 * every level computes the same bits — only the register width differs
 * (tests/cli_simd.sh compares outputs and runs test_ops under each
 * DSPARK_SIMD value; test_matmul walks every level itself). This
 * replaces GCC's target_clones, whose ifunc resolver chose by CPU alone and
 * ignored DSPARK_SIMD. */
#include "kernels/cpu/simd.h"
#define DS_OPS_BODY(name) \
    static inline __attribute__((always_inline)) void name##_body(void *arg, int64_t i0, int64_t i1)
#if DS_X86
#define DS_OPS_DISPATCH(name)                                                              \
    DS_TARGET_AVX512 static void name##_avx512(void *a, int64_t i0, int64_t i1) { name##_body(a, i0, i1); } \
    DS_TARGET_AVX2 static void name##_avx2(void *a, int64_t i0, int64_t i1) { name##_body(a, i0, i1); }     \
    static void name##_portable(void *a, int64_t i0, int64_t i1) { name##_body(a, i0, i1); }               \
    static void name(void *a, int64_t i0, int64_t i1) {                                    \
        switch (ds_simd_level()) {                                                         \
        case DS_LVL_AVX512: name##_avx512(a, i0, i1); break;                               \
        case DS_LVL_AVX2: name##_avx2(a, i0, i1); break;                                   \
        default: name##_portable(a, i0, i1); break;                                        \
        }                                                                                  \
    }
#else
#define DS_OPS_DISPATCH(name) \
    static void name(void *a, int64_t i0, int64_t i1) { name##_body(a, i0, i1); }
#endif

/* The same for range functions of ds_pool_for_idx, which also receive their
 * chunk index (the thread's scratch region). */
#define DS_OPS_BODY_IDX(name) \
    static inline __attribute__((always_inline)) void name##_body(void *arg, int64_t i0, int64_t i1, int chunk)
#if DS_X86
#define DS_OPS_DISPATCH_IDX(name)                                                          \
    DS_TARGET_AVX512 static void name##_avx512(void *a, int64_t i0, int64_t i1, int c) { name##_body(a, i0, i1, c); } \
    DS_TARGET_AVX2 static void name##_avx2(void *a, int64_t i0, int64_t i1, int c) { name##_body(a, i0, i1, c); }     \
    static void name##_portable(void *a, int64_t i0, int64_t i1, int c) { name##_body(a, i0, i1, c); }               \
    static void name(void *a, int64_t i0, int64_t i1, int c) {                             \
        switch (ds_simd_level()) {                                                         \
        case DS_LVL_AVX512: name##_avx512(a, i0, i1, c); break;                            \
        case DS_LVL_AVX2: name##_avx2(a, i0, i1, c); break;                                \
        default: name##_portable(a, i0, i1, c); break;                                     \
        }                                                                                  \
    }
#else
#define DS_OPS_DISPATCH_IDX(name) \
    static void name(void *a, int64_t i0, int64_t i1, int c) { name##_body(a, i0, i1, c); }
#endif

static inline int ds_imin(int a, int b) { return a < b ? a : b; }
static inline int64_t ds_grain(int64_t n_per_item, int64_t target) {
    int64_t g = n_per_item > 0 ? target / n_per_item : 1;
    return g < 1 ? 1 : g;
}

#endif
