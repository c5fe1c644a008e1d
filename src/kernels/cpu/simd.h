/* simd.h — fixed-width lane vectors and run-time SIMD levels for the matmul
 * families. Private to src/kernels/cpu.
 *
 * ==== Why GCC vector extensions =============================================
 * A canonical reduction in dspark is a FIXED set of 16 independent lane
 * accumulators. We write those lanes as one `ds_v16f` (GCC's generic vector
 * extension, 16 x f32). Every operation on it is defined lane by lane with
 * IEEE single rounding, so the compiler lowers it to 1 zmm (AVX-512), 2 ymm
 * (AVX2), 4 xmm (SSE2 / NEON) or scalar code — and every lowering computes
 * the same bits. There is no reassociation (never -ffast-math) and no
 * contraction (-ffp-contract=off): `a + b * c` is a rounded product followed
 * by a rounded add on every path. FMA only appears in the fast variants,
 * whose instances ask for it explicitly (DS_FAST_FN, below).
 *
 * ==== Run-time levels =========================================================
 * On x86-64 each kernel body is an always-inline function instantiated three
 * times, with target("avx512...") / target("avx2,fma,f16c") / no attribute,
 * and ds_simd_level() (registry.c; cached once, the one static the rules
 * allow) picks the instance. This is GCC function multiversioning done by
 * hand, so the AVX2 instance can require FMA+F16C and the tile shapes can be
 * chosen per level. Tile shapes never change bits: every (m, n) output has
 * its own accumulator vector and the same operation sequence in any tile. */
#ifndef DSPARK_SIMD_H
#define DSPARK_SIMD_H

#include <stdint.h>
#include <string.h>

#include "common.h"

#define DS_INLINE static inline __attribute__((always_inline))

/* Every helper taking or returning a vector is always inlined, so the
 * psABI warning about returning 64-byte vectors without AVX-512 never
 * applies. (It fires at call sites too, so it stays off for the including
 * file; only the matmul files and test_matmul include this header.) */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float    ds_v16f __attribute__((vector_size(64)));
typedef int32_t  ds_v16i __attribute__((vector_size(64)));
typedef uint32_t ds_v16u __attribute__((vector_size(64)));
typedef uint16_t ds_v16h __attribute__((vector_size(32)));
typedef int16_t  ds_v16s __attribute__((vector_size(32)));
typedef int8_t   ds_v16b __attribute__((vector_size(16)));

/* ---- levels ---------------------------------------------------------------- */
enum { DS_LVL_PORTABLE = 0, DS_LVL_AVX2 = 1, DS_LVL_AVX512 = 2, DS_LVL_COUNT = 3 };

/* The level this process uses (registry.c): detected once with
 * __builtin_cpu_supports, optionally capped by DSPARK_SIMD=portable|avx2|avx512
 * so that the three paths can be compared end to end on one machine. */
int ds_simd_level(void);
/* 1 if level lv can run on this CPU (tests run every available level). */
int ds_simd_level_ok(int lv);
const char *ds_simd_level_name(int lv);

#if defined(__x86_64__) && defined(__GNUC__)
#define DS_X86 1
#define DS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define DS_TARGET_AVX2   __attribute__((target("avx2,fma,f16c")))
#else
#define DS_X86 0
#endif

/* ---- loads ------------------------------------------------------------------ */
DS_INLINE ds_v16f ds_zero16(void) { ds_v16f z = {0}; return z; }

DS_INLINE ds_v16f ds_ld16(const float *p) { ds_v16f v; memcpy(&v, p, sizeof v); return v; }

/* fp16 -> f32, exact, branch-free over 16 lanes (the same values as
 * ds_fp16_to_f32, NaN payloads included; tests check all 65536 inputs).
 * Normal: rebias the exponent (+112). Inf/NaN: exponent field 31 -> 255.
 * Subnormal/zero: man * 2^-24, an exact int->float conversion and an exact
 * power-of-two scaling (no denormal f32 operands, so no microcode assists). */
DS_INLINE ds_v16f ds_ld16_f16(const uint16_t *p) {
    ds_v16h h16;
    memcpy(&h16, p, sizeof h16);
    /* Masks come from arithmetic shifts, not compares: GCC splits a 16-lane
     * vector compare into scalar code where the target lacks 512-bit
     * registers, while shifts and logic ops split into 2 x ymm / 4 x xmm. */
    ds_v16i h    = __builtin_convertvector(h16, ds_v16i);
    ds_v16i sign = (ds_v16i)((ds_v16u)(h & 0x8000) << 16);
    ds_v16i em   = h & 0x7fff;
    ds_v16i isinf = (ds_v16i)((ds_v16u)(em + 0x0400) << 16) >> 31;   /* em >= 0x7c00 */
    ds_v16i issub = (em - 0x0400) >> 31;                              /* em <  0x0400 */
    ds_v16i norm = (em << 13) + 0x38000000 + (isinf & 0x38000000);
    ds_v16f sub  = __builtin_convertvector(em, ds_v16f) * 5.9604644775390625e-08f;
    ds_v16i bits = (issub & (ds_v16i)sub) | (~issub & norm);
    return (ds_v16f)(bits | sign);
}
DS_INLINE ds_v16f ds_ld16_bf16(const uint16_t *p) {
    ds_v16h h; memcpy(&h, p, sizeof h);
    return (ds_v16f)(__builtin_convertvector(h, ds_v16u) << 16);
}
/* 16 int8 quants -> f32 (exact). */
DS_INLINE ds_v16f ds_ld16_q8(const int8_t *p) {
    ds_v16b b; memcpy(&b, p, sizeof b);
    /* via int16: GCC 12 lowers a direct int8 -> int32 conversion byte by byte */
    ds_v16s s = __builtin_convertvector(b, ds_v16s);
    return __builtin_convertvector(__builtin_convertvector(s, ds_v16i), ds_v16f);
}

/* Weight row loaders by type (type is a compile-time constant after inlining). */
DS_INLINE ds_v16f ds_ldw16(uint32_t type, const void *row, int64_t k) {
    if (type == DS_TYPE_F16)  return ds_ld16_f16((const uint16_t *)row + k);
    if (type == DS_TYPE_BF16) return ds_ld16_bf16((const uint16_t *)row + k);
    return ds_ld16((const float *)row + k);
}
/* ---- combines ------------------------------------------------------------------ */
/* Canonical: lanes l and l+8, then +4, +2, +1 — the fixed tree. */
DS_INLINE float ds_hsum16_tree(const ds_v16f *v) {
    float a[16];
    memcpy(a, v, sizeof a);
    for (int l = 0; l < 8; l++) a[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
    for (int l = 0; l < 2; l++) a[l] = a[l] + a[l + 2];
    return a[0] + a[1];
}
/* Fast: plain left-to-right lane sum (what a scalar epilogue does). */
DS_INLINE float ds_hsum16_seq(const ds_v16f *v) {
    float a[16];
    memcpy(a, v, sizeof a);
    float s = a[0];
    for (int l = 1; l < 16; l++) s = s + a[l];
    return s;
}

/* ---- fused multiply-add for the FAST kernels --------------------------------
 * The fast instances are compiled with floating-point contraction on
 * (DS_FAST_FN), so `acc + a * b` on whole vectors becomes one vfmadd per
 * register wherever the level has FMA (AVX2, AVX-512, AArch64) and stays
 * mul+add where it does not. This is FMA asked for explicitly, per function:
 * a lane loop of fmaf() would rely on GCC's SLP vectorizer to put the lanes
 * back together, which it does not do reliably inside large register tiles,
 * and the x86 FMA intrinsics cannot be inlined into the shared,
 * default-target tile bodies. Canonical instances never get this
 * attribute: the global -ffp-contract=off holds for them. */
#define DS_FAST_FN __attribute__((optimize("fp-contract=fast")))

#endif
